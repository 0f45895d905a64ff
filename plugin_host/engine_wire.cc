#include "plugin_host/engine_wire.h"

#include <fmt/format.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <vector>

#include "format/error.h"

namespace kvdiff::engines::wire {

const char* OpName(Op op) {
  switch (op) {
    case Op::kInfo:
      return "loading the plugin and opening the engine";
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
  }
  return "?";
}

int64_t RequestBodyBytes(const Request& request) {
  const int64_t tokens = request.count;
  if (request.op == Op::kAppend) {
    if (tokens <= 0 || tokens > kMaxRequestTokens) return -1;
    return tokens * static_cast<int64_t>(sizeof(Token));
  }
  if (request.op == Op::kAppendBatch) {
    const int64_t items = request.arg;
    // Every item has a token at least, so there are no more items than tokens.
    if (items <= 0 || items > kMaxBatchItems || tokens < items || tokens > kMaxRequestTokens) {
      return -1;
    }
    return items * static_cast<int64_t>(sizeof(BatchItemHeader)) +
           tokens * static_cast<int64_t>(sizeof(Token) + sizeof(uint8_t));
  }
  return 0;
}

bool SendAll(int fd, const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = send(fd, p, size, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

bool ReadAll(int fd, void* data, size_t size,
             std::optional<std::chrono::steady_clock::time_point> deadline, bool* timed_out) {
  char* p = static_cast<char*>(data);
  while (size > 0) {
    if (deadline) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          *deadline - std::chrono::steady_clock::now());
      pollfd pfd{fd, POLLIN, 0};
      const int ready = left.count() > 0 ? poll(&pfd, 1, static_cast<int>(left.count())) : 0;
      if (ready < 0 && errno == EINTR) continue;
      if (ready == 0) {
        if (timed_out) *timed_out = true;
        return false;
      }
    }
    const ssize_t n = read(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

std::string EncodeInfo(const EngineInfo& info) {
  std::string s = fmt::format("{}\n{}\n{}\n{}\n{}\n{}\n{}\n{}\n", info.name, info.version,
                              info.abi_version, info.vocab_size, info.max_length, info.cache_dtype,
                              info.max_sessions, info.max_batch_tokens);
  for (const auto& [what, size] : info.sizes) s += fmt::format("{} {}\n", what, size);
  return s;
}

EngineInfo DecodeInfo(const std::string& text) {
  std::vector<std::string> lines;
  for (size_t begin = 0; begin < text.size();) {
    const size_t end = text.find('\n', begin);
    lines.push_back(text.substr(begin, end - begin));
    begin = end == std::string::npos ? text.size() : end + 1;
  }
  if (lines.size() < 8) throw EngineError("engine host: a malformed info reply");
  EngineInfo info;
  info.name = lines[0];
  info.version = lines[1];
  info.abi_version = static_cast<uint32_t>(std::stoul(lines[2]));
  info.vocab_size = std::stoll(lines[3]);
  info.max_length = std::stoll(lines[4]);
  info.cache_dtype = lines[5];
  info.max_sessions = std::stoll(lines[6]);
  info.max_batch_tokens = std::stoll(lines[7]);
  if (info.vocab_size <= 0 || info.vocab_size > kMaxVocab) {
    throw EngineError(
        fmt::format("engine host: an info reply with vocab_size {} (expected 1 to {})",
                    info.vocab_size, kMaxVocab));
  }
  if (info.max_sessions < 0 || info.max_batch_tokens < 0) {
    throw EngineError(fmt::format(
        "engine host: an info reply with max_sessions {} and max_batch_tokens {} (expected >= 0)",
        info.max_sessions, info.max_batch_tokens));
  }
  for (size_t i = 8; i < lines.size(); ++i) {
    const size_t space = lines[i].rfind(' ');
    if (space == std::string::npos) continue;
    info.sizes.emplace_back(lines[i].substr(0, space), std::stoll(lines[i].substr(space + 1)));
  }
  return info;
}

}  // namespace kvdiff::engines::wire
