#include "plugin_host/engine_wire.h"

#include <fmt/format.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <vector>

#include "format/error.h"
#include "plugin_host/engine_text.h"

namespace kvdiff::engines::wire {
namespace {

constexpr bool kHostIsLittleEndian = __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__;

// Little-endian integers, byte by byte: the same on every host.
void PutU32(char* at, uint32_t v) {
  for (int i = 0; i < 4; ++i) at[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
void PutI64(char* at, int64_t value) {
  const auto v = static_cast<uint64_t>(value);
  for (int i = 0; i < 8; ++i) at[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
uint32_t GetU32(const char* at) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t{static_cast<unsigned char>(at[i])} << (8 * i);
  return v;
}
int64_t GetI64(const char* at) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t{static_cast<unsigned char>(at[i])} << (8 * i);
  return static_cast<int64_t>(v);
}

// 4-byte values (int32 tokens, float32 logits) between host order and the wire's: a copy on a
// little-endian host, a copy with each value's bytes reversed on a big-endian one.
void CopyFourByteValues(char* to, const char* from, size_t n) {
  if (n == 0) return;  // `from` may be the null data() of an empty buffer
  std::memcpy(to, from, n * 4);
  if (kHostIsLittleEndian) return;
  for (size_t i = 0; i < n; ++i) {
    std::swap(to[4 * i], to[4 * i + 3]);
    std::swap(to[4 * i + 1], to[4 * i + 2]);
  }
}

void AppendFourByteValues(std::string& out, const void* values, size_t n) {
  const size_t at = out.size();
  out.resize(at + n * 4);
  CopyFourByteValues(out.data() + at, static_cast<const char*>(values), n);
}

}  // namespace

const char* OpName(Op op) {
  switch (op) {
    case Op::kHello:
      return "hello";
    case Op::kOpen:
      return "open";
    case Op::kInfo:
      return "info";
    case Op::kNewSession:
      return "session_new";
    case Op::kFree:
      return "session_free";
    case Op::kAppend:
      return "append";
    case Op::kLength:
      return "length";
    case Op::kTruncate:
      return "truncate";
    case Op::kFork:
      return "fork";
    case Op::kReset:
      return "reset";
    case Op::kAppendBatch:
      return "append_batch";
    case Op::kShift:
      return "shift";
  }
  return "an unknown op";
}

std::array<char, kRequestHeaderBytes> EncodeRequest(const Request& request) {
  std::array<char, kRequestHeaderBytes> b{};
  PutU32(b.data(), static_cast<uint32_t>(request.op));
  PutU32(b.data() + 4, 0);  // reserved
  PutI64(b.data() + 8, request.session);
  PutI64(b.data() + 16, request.arg);
  PutI64(b.data() + 24, request.count);
  return b;
}

Request DecodeRequest(const char* bytes) {
  Request r;
  r.op = static_cast<Op>(GetU32(bytes));
  r.session = GetI64(bytes + 8);
  r.arg = GetI64(bytes + 16);
  r.count = GetI64(bytes + 24);
  return r;
}

std::array<char, kReplyHeaderBytes> EncodeReply(const Reply& reply) {
  std::array<char, kReplyHeaderBytes> b{};
  PutU32(b.data(), static_cast<uint32_t>(reply.status));
  PutU32(b.data() + 4, 0);  // reserved
  PutI64(b.data() + 8, reply.value);
  PutI64(b.data() + 16, reply.bytes);
  return b;
}

Reply DecodeReply(const char* bytes) {
  Reply r;
  r.status = static_cast<Status>(GetU32(bytes));
  r.value = GetI64(bytes + 8);
  r.bytes = GetI64(bytes + 16);
  return r;
}

void AppendBatchItemHeader(std::string& out, const BatchItemHeader& item) {
  char b[kBatchItemHeaderBytes];
  PutI64(b, item.session);
  PutI64(b + 8, item.n);
  out.append(b, sizeof b);
}

BatchItemHeader DecodeBatchItemHeader(const char* bytes) {
  return {GetI64(bytes), GetI64(bytes + 8)};
}

void AppendTokens(std::string& out, const Token* tokens, size_t n) {
  static_assert(sizeof(Token) == 4, "tokens are int32 on the wire");
  AppendFourByteValues(out, tokens, n);
}
void ReadTokens(const char* bytes, size_t n, Token* tokens) {
  CopyFourByteValues(reinterpret_cast<char*>(tokens), bytes, n);
}
void AppendFloats(std::string& out, const float* values, size_t n) {
  static_assert(sizeof(float) == 4, "logits are float32 on the wire");
  AppendFourByteValues(out, values, n);
}
void ReadFloats(const char* bytes, size_t n, float* values) {
  CopyFourByteValues(reinterpret_cast<char*>(values), bytes, n);
}

std::string Hex(const char* bytes, size_t n, size_t max) {
  std::string s;
  for (size_t i = 0; i < n && i < max; ++i) {
    s += fmt::format("{}{:02x}", i ? " " : "", static_cast<unsigned char>(bytes[i]));
  }
  if (n > max) s += " ...";
  return s;
}

int64_t RequestBodyBytes(const Request& request) {
  const int64_t tokens = request.count;
  switch (request.op) {
    case Op::kOpen:
      if (request.arg < 0 || request.count < 0 || request.arg > kMaxTextBytes ||
          request.count > kMaxTextBytes) {
        return -1;
      }
      return request.arg + request.count;
    case Op::kAppend:
      if (tokens <= 0 || tokens > kMaxRequestTokens) return -1;
      return tokens * 4;
    case Op::kAppendBatch: {
      const int64_t items = request.arg;
      // Every item has a token at least, so there are no more items than tokens.
      if (items <= 0 || items > kMaxBatchItems || tokens < items || tokens > kMaxRequestTokens) {
        return -1;
      }
      return items * static_cast<int64_t>(kBatchItemHeaderBytes) + tokens * (4 + 1);
    }
    case Op::kHello:
    case Op::kInfo:
    case Op::kNewSession:
    case Op::kFree:
    case Op::kLength:
    case Op::kTruncate:
    case Op::kFork:
    case Op::kReset:
    case Op::kShift:
      return 0;
  }
  return -1;  // an op this version does not know
}

namespace {

// True when process `pid` (our child) has exited; it is not reaped (WNOWAIT), its status is left
// for whoever buries it.
bool Exited(pid_t pid) {
  siginfo_t info{};
  return waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
         info.si_pid == pid;
}

// Waits until `fd` is ready for `events` or the deadline passes (false, and `timed_out`), or, with
// `peer`, until that process has exited (false): checked every kPeerCheckMs of silence.
bool WaitReady(int fd, short events, std::chrono::steady_clock::time_point deadline,
               bool* timed_out, pid_t peer) {
  constexpr int64_t kPeerCheckMs = 100;
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      if (timed_out) *timed_out = true;
      return false;
    }
    pollfd pfd{fd, events, 0};
    const int64_t wait_ms = peer > 0 ? std::min<int64_t>(left.count(), kPeerCheckMs) : left.count();
    const int ready = poll(&pfd, 1, static_cast<int>(wait_ms));
    if (ready < 0 && errno == EINTR) continue;
    if (ready != 0) return true;  // ready, or an error the read or write will report
    if (peer > 0 && Exited(peer)) return false;
  }
}

}  // namespace

bool SendAll(int fd, const void* data, size_t size,
             std::optional<std::chrono::steady_clock::time_point> deadline, bool* timed_out,
             pid_t peer) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    if (deadline && !WaitReady(fd, POLLOUT, *deadline, timed_out, peer)) return false;
    const ssize_t n = send(fd, p, size, MSG_NOSIGNAL | (deadline ? MSG_DONTWAIT : 0));
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

bool ReadAll(int fd, void* data, size_t size,
             std::optional<std::chrono::steady_clock::time_point> deadline, bool* timed_out,
             size_t* got, pid_t peer) {
  char* p = static_cast<char*>(data);
  if (got) *got = 0;
  while (size > 0) {
    if (deadline && !WaitReady(fd, POLLIN, *deadline, timed_out, peer)) return false;
    const ssize_t n = read(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    size -= static_cast<size_t>(n);
    if (got) *got += static_cast<size_t>(n);
  }
  return true;
}

std::string EncodeInfo(const EngineInfo& info) {
  std::string s = fmt::format("{}\n{}\n{}\n{}\n{}\n{}\n{}\n{}\n", info.name, info.version,
                              info.abi_version, info.vocab_size, info.max_length, info.cache_dtype,
                              info.max_sessions, info.max_batch_tokens);
  if (info.abi_version >= 3) s += info.shifts ? "1\n" : "0\n";
  for (const auto& [what, size] : info.sizes) s += fmt::format("{} {}\n", what, size);
  return s;
}

namespace {

// A decimal integer that is the whole of `text`; EngineError naming `what` otherwise.
int64_t ParseInfoInt(const std::string& text, const char* what) {
  int64_t v = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (ec != std::errc() || ptr != end || text.empty()) {
    throw EngineError(fmt::format(
        "engine process: an info reply whose {} line is '{}' (expected a decimal integer)", what,
        text.substr(0, 80)));
  }
  return v;
}

}  // namespace

EngineInfo DecodeInfo(const std::string& text) {
  std::vector<std::string> lines;
  for (size_t begin = 0; begin < text.size();) {
    const size_t end = text.find('\n', begin);
    lines.push_back(text.substr(begin, end - begin));
    begin = end == std::string::npos ? text.size() : end + 1;
  }
  if (lines.size() < 8) {
    throw EngineError(fmt::format(
        "engine process: an info reply of {} lines (expected at least 8: name, version, "
        "abi_version, vocab_size, max_length, cache_dtype, max_sessions, max_batch_tokens)",
        lines.size()));
  }
  EngineInfo info;
  info.name = EngineText(lines[0]);
  info.version = EngineText(lines[1]);
  const int64_t abi = ParseInfoInt(lines[2], "abi_version (line 3)");
  if (abi < 1 || abi > 3) {
    throw EngineError(
        fmt::format("engine process: an info reply with abi_version {} (expected 1, 2 with "
                    "append_batch, or 3 with append_batch and a shifts line)",
                    abi));
  }
  info.abi_version = static_cast<uint32_t>(abi);
  info.vocab_size = ParseInfoInt(lines[3], "vocab_size (line 4)");
  info.max_length = ParseInfoInt(lines[4], "max_length (line 5)");
  info.cache_dtype = EngineText(lines[5]);
  info.max_sessions = ParseInfoInt(lines[6], "max_sessions (line 7)");
  info.max_batch_tokens = ParseInfoInt(lines[7], "max_batch_tokens (line 8)");
  if (info.vocab_size <= 0 || info.vocab_size > kMaxVocab) {
    throw EngineError(
        fmt::format("engine process: an info reply with vocab_size {} (expected 1 to {})",
                    info.vocab_size, kMaxVocab));
  }
  if (info.max_length <= 0) {
    throw EngineError(fmt::format(
        "engine process: an info reply with max_length {} (expected >= 1)", info.max_length));
  }
  if (info.max_sessions < 0 || info.max_batch_tokens < 0) {
    throw EngineError(
        fmt::format("engine process: an info reply with max_sessions {} and max_batch_tokens {} "
                    "(expected >= 0)",
                    info.max_sessions, info.max_batch_tokens));
  }
  // abi_version 3: line 9 says whether the engine answers shift; the sizes follow it.
  size_t sizes_from = 8;
  if (abi >= 3) {
    const int64_t shifts = lines.size() > 8 ? ParseInfoInt(lines[8], "shifts (line 9)") : -1;
    if (shifts != 0 && shifts != 1) {
      throw EngineError(fmt::format(
          "engine process: an info reply with abi_version 3 and {} (expected line 9, shifts: 0 "
          "or 1)",
          lines.size() > 8 ? fmt::format("shifts {}", shifts) : std::string("no line 9")));
    }
    info.shifts = shifts == 1;
    sizes_from = 9;
  }
  for (size_t i = sizes_from; i < lines.size(); ++i) {
    const size_t space = lines[i].rfind(' ');
    if (space == std::string::npos) continue;
    info.sizes.emplace_back(lines[i].substr(0, space),
                            ParseInfoInt(lines[i].substr(space + 1), "size"));
  }
  return info;
}

}  // namespace kvdiff::engines::wire
