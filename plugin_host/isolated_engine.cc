// The parent's side of an isolated engine: starts the child (`kvdiff engine-host`, whose side is
// engine_host.cc), sends it requests over the socket (engine_wire.h) and turns its death, its
// silence or its errors into exceptions.
#include "plugin_host/isolated_engine.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <numeric>
#include <optional>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "format/error.h"
#include "plugin_host/batch_items.h"
#include "plugin_host/engine_wire.h"

extern char** environ;

namespace kvdiff::engines {
namespace {

using wire::Op;
using wire::Reply;
using wire::Request;
using wire::Status;

std::string DescribeExit(int status) {
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* abbrev = sigabbrev_np(sig);
    return fmt::format("was killed by signal {} (SIG{}: {})", sig, abbrev ? abbrev : "?",
                       strsignal(sig));
  }
  if (WIFEXITED(status)) return fmt::format("exited with code {}", WEXITSTATUS(status));
  return "stopped";
}

// Waits for `pid` at most `seconds`, then kills it. "" when it exited with code 0, else what
// happened. Polls (1 ms, doubling to 50 ms): a child closing cleanly is gone within milliseconds.
std::string Reap(pid_t pid, double seconds) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
  auto pause = std::chrono::milliseconds(1);
  int status = 0;
  while (true) {
    const pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid || (done < 0 && errno != EINTR)) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return fmt::format("did not finish within {} s (killed)", seconds);
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
  }
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? "" : DescribeExit(status);
}

std::mutex close_faults_mutex;
std::vector<std::string> close_faults;

void RecordCloseFault(std::string message) {
  std::lock_guard<std::mutex> lock(close_faults_mutex);
  close_faults.push_back(std::move(message));
}

// What a request was, for messages: "append of 8 tokens", "append_batch of 2 items (9 tokens)".
std::string DescribeCall(const Request& request) {
  std::string call = wire::OpName(request.op);
  const auto plural = [](int64_t n) { return n == 1 ? "" : "s"; };
  if (request.op == Op::kAppend) {
    call += fmt::format(" of {} token{}", request.count, plural(request.count));
  }
  if (request.op == Op::kAppendBatch) {
    call += fmt::format(" of {} item{} ({} token{})", request.arg, plural(request.arg),
                        request.count, plural(request.count));
  }
  if (request.op == Op::kTruncate) call += fmt::format("({})", request.arg);
  return call;
}

}  // namespace

std::vector<std::string> TakeCloseFaults() {
  std::lock_guard<std::mutex> lock(close_faults_mutex);
  return std::exchange(close_faults, {});
}

// ---- The parent's side ----

struct HostProcess {
  std::string name;  // the plugin file, for messages until the engine has said its name
  pid_t pid = -1;
  int fd = -1;
  double timeout_seconds = 600;
  int64_t vocab_size = 0;           // as the info said, once the engine is open
  std::optional<std::string> dead;  // why the child is gone

  // Closing the socket tells the child to free its sessions, close the engine and exit 0; a child
  // that crashes, exits otherwise or hangs there is a fault of the engine's close, kept for main.
  ~HostProcess() {
    if (fd >= 0) close(fd);
    if (pid <= 0) return;
    const std::string what = Reap(pid, timeout_seconds);
    if (!what.empty()) {
      RecordCloseFault(
          fmt::format("{}: the isolated engine process {} while closing the engine", name, what));
    }
  }

  // One request (its header, then `body`) and its reply, whose payload may be at most
  // `max_payload` bytes (or wire::kMaxTextReplyBytes, for an error message). Throws what the
  // engine threw; EngineError when the child died, timed out or announced a larger reply during
  // the call (and the child is then gone for good).
  Reply Call(const Request& request, std::string_view body, std::string& payload,
             int64_t max_payload = 0) {
    if (dead) throw EngineError(fmt::format("{}: {}", name, *dead));
    bool sent = wire::SendAll(fd, &request, sizeof request);
    if (sent && !body.empty()) sent = wire::SendAll(fd, body.data(), body.size());
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::milliseconds(static_cast<int64_t>(timeout_seconds * 1000));
    Reply reply{};
    bool timed_out = false;
    if (!sent || !wire::ReadAll(fd, &reply, sizeof reply, deadline, &timed_out)) {
      Bury(request, timed_out);
    }
    // Never trust the child's numbers: a size beyond what this call can take is refused before
    // anything is allocated for it, and the stream is then out of step, so the child goes.
    const int64_t limit = std::max(max_payload, wire::kMaxTextReplyBytes);
    if (reply.bytes < 0 || reply.bytes > limit) {
      Bury(request, false,
           fmt::format("announced a reply of {} bytes, where this call takes at most {} (killed)",
                       reply.bytes, limit));
    }
    payload.resize(static_cast<size_t>(reply.bytes));
    if (!wire::ReadAll(fd, payload.data(), payload.size(), deadline, &timed_out)) {
      Bury(request, timed_out);
    }
    if (reply.status == Status::kInputError) throw InputError(payload);
    if (reply.status == Status::kEngineError) throw EngineError(payload);
    return reply;
  }
  Reply Call(const Request& request, std::string& payload) { return Call(request, {}, payload); }

  // The child failed during `request` (it died, fell silent, or `broke` the protocol as this
  // says): kill it if it still runs, reap it, and throw.
  [[noreturn]] void Bury(const Request& request, bool timed_out, const std::string& broke = "") {
    if (timed_out || !broke.empty()) kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    pid = -1;
    const std::string what =
        !broke.empty() ? broke
        : timed_out    ? fmt::format("did not answer within {} s (killed)", timeout_seconds)
                       : DescribeExit(status);
    dead = fmt::format("the isolated engine process {} during {}", what, DescribeCall(request));
    throw EngineError(
        fmt::format("{}: {}; its sessions are gone, a new session starts a new "
                    "process",
                    name, *dead));
  }
};

namespace {

std::shared_ptr<HostProcess> Spawn(const IsolatedEngineSpec& spec) {
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
    throw EngineError(fmt::format("--isolate: socketpair failed: {}", std::strerror(errno)));
  }
  // The child gets its end as fd 3 (dup2 clears close-on-exec) and our stderr as its stdout,
  // so nothing it prints mixes with kvdiff's reports.
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 3);
  posix_spawn_file_actions_adddup2(&actions, 2, 1);
  // An empty "--options=" would make CLI11 take the next word (the plugin) as its value.
  std::vector<std::string> args = {spec.host.string(), "engine-host", "--fd=3"};
  if (!spec.options.empty()) args.push_back("--options=" + spec.options);
  args.push_back(spec.plugin.string());
  args.push_back(spec.model_dir.string());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, spec.host.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    throw EngineError(
        fmt::format("--isolate: cannot start {}: {}", spec.host.string(), std::strerror(rc)));
  }
  auto host = std::make_shared<HostProcess>();
  host->name = spec.plugin.filename().string();
  host->pid = pid;
  host->fd = fds[0];
  host->timeout_seconds = spec.timeout_seconds;
  return host;
}

EngineInfo OpenIn(HostProcess& host) {
  std::string payload;
  host.Call(Request{Op::kInfo}, payload);
  EngineInfo info = wire::DecodeInfo(payload);
  host.name = info.name;
  host.vocab_size = info.vocab_size;
  return info;
}

}  // namespace

IsolatedEngine IsolatedEngine::Start(IsolatedEngineSpec spec) {
  std::shared_ptr<HostProcess> host = Spawn(spec);
  EngineInfo info = OpenIn(*host);
  return IsolatedEngine(std::move(spec), std::move(host), std::move(info));
}

IsolatedSession IsolatedEngine::NewSession() const {
  if (host_->dead) {
    host_ = Spawn(spec_);
    OpenIn(*host_);
  }
  std::string payload;
  const Reply reply = host_->Call(Request{Op::kNewSession}, payload);
  return IsolatedSession(host_, reply.value);
}

namespace {

// Appends the bytes of `values` to `body`.
template <class T>
void AppendBytes(std::string& body, const T* values, size_t count) {
  body.append(reinterpret_cast<const char*>(values), count * sizeof(T));
}

}  // namespace

std::vector<Logits> IsolatedEngine::AppendBatch(const std::vector<IsolatedBatchItem>& items) const {
  KVDIFF_CHECK(HasBatch(), "{}: a version-{} plugin has no append_batch", info_.name,
               info_.abi_version);
  // A session of a child that died and was replaced is not this engine's any more.
  CheckBatchItems(info_.name, items, [&](const IsolatedSession* s) {
    return s != nullptr && s->host_ == host_ && s->id_ >= 0;
  });
  // The body (wire::BatchItemHeader): the items, then every token, then every output flag.
  std::vector<wire::BatchItemHeader> heads;
  std::string tokens, flags;
  std::vector<int64_t> rows;  // per item, its flagged rows
  for (const IsolatedBatchItem& item : items) {
    const std::vector<uint8_t> item_flags = OutputFlags(item);
    heads.push_back({item.session->id_, static_cast<int64_t>(item.tokens.size())});
    AppendBytes(tokens, item.tokens.data(), item.tokens.size());
    AppendBytes(flags, item_flags.data(), item_flags.size());
    rows.push_back(FlaggedRows(item_flags));
  }
  std::string body;
  AppendBytes(body, heads.data(), heads.size());
  body += tokens;
  body += flags;

  const int64_t n_tokens = static_cast<int64_t>(tokens.size() / sizeof(Token));
  // The child would refuse more by exiting; say so here instead, as bad input.
  KVDIFF_CHECK(static_cast<int64_t>(items.size()) <= wire::kMaxBatchItems &&
                   n_tokens <= wire::kMaxRequestTokens,
               "{}: a batch of {} items and {} tokens; an isolated engine takes at most {} items "
               "and {} tokens per call",
               info_.name, items.size(), n_tokens, wire::kMaxBatchItems, wire::kMaxRequestTokens);
  const int64_t total = std::accumulate(rows.begin(), rows.end(), int64_t{0});
  const int64_t vocab = info_.vocab_size;
  const int64_t bytes = total * vocab * static_cast<int64_t>(sizeof(float));
  std::string payload;
  const Reply reply =
      host_->Call(Request{Op::kAppendBatch, 0, -1, static_cast<int64_t>(items.size()), n_tokens},
                  body, payload, bytes);
  // The child is kvdiff's own code, but it shares its process with the plugin under test.
  if (reply.value != total || static_cast<int64_t>(payload.size()) != bytes) {
    throw EngineError(fmt::format(
        "{}: the engine host sent {} rows ({} bytes) for a batch of {} items whose output flags "
        "ask for {} rows of vocab {} ({} bytes)",
        info_.name, reply.value, payload.size(), items.size(), total, vocab, bytes));
  }
  std::vector<Logits> out;
  size_t offset = 0;
  for (int64_t n : rows) {
    Logits logits(n, vocab);
    const size_t size = static_cast<size_t>(logits.size()) * sizeof(float);
    if (size > 0) std::memcpy(logits.data(), payload.data() + offset, size);
    offset += size;
    out.push_back(std::move(logits));
  }
  return out;
}

IsolatedSession::IsolatedSession(IsolatedSession&& other) noexcept
    : host_(std::move(other.host_)), id_(std::exchange(other.id_, -1)) {}

IsolatedSession& IsolatedSession::operator=(IsolatedSession&& other) noexcept {
  if (this != &other) {
    IsolatedSession old(std::move(*this));
    host_ = std::move(other.host_);
    id_ = std::exchange(other.id_, -1);
  }
  return *this;
}

IsolatedSession::~IsolatedSession() {
  if (!host_ || id_ < 0 || host_->dead) return;
  std::string payload;
  try {
    host_->Call(Request{Op::kFree, 0, id_}, payload);
  } catch (const std::exception&) {
    // A child that dies while freeing is reported by the next call that needs it.
  }
}

Logits IsolatedSession::Append(const Tokens& tokens) {
  KVDIFF_CHECK(!tokens.empty(), "{}: tokens is empty (expected at least one token)", host_->name);
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t vocab = host_->vocab_size;
  const int64_t bytes = n * vocab * static_cast<int64_t>(sizeof(float));
  std::string payload;
  const Reply reply =
      host_->Call(Request{Op::kAppend, 0, id_, 0, n},
                  std::string_view(reinterpret_cast<const char*>(tokens.data()), n * sizeof(Token)),
                  payload, bytes);
  if (reply.value != n || static_cast<int64_t>(payload.size()) != bytes) {
    throw EngineError(
        fmt::format("{}: the engine host sent {} rows ({} bytes) for {} tokens of vocab {}",
                    host_->name, reply.value, payload.size(), n, vocab));
  }
  Logits logits(n, vocab);
  std::memcpy(logits.data(), payload.data(), payload.size());
  return logits;
}

int64_t IsolatedSession::Length() const {
  std::string payload;
  return host_->Call(Request{Op::kLength, 0, id_}, payload).value;
}

void IsolatedSession::Truncate(int64_t length) {
  std::string payload;
  host_->Call(Request{Op::kTruncate, 0, id_, length}, payload);
}

IsolatedSession IsolatedSession::Fork() const {
  std::string payload;
  const Reply reply = host_->Call(Request{Op::kFork, 0, id_}, payload);
  return IsolatedSession(host_, reply.value);
}

void IsolatedSession::Reset() {
  std::string payload;
  host_->Call(Request{Op::kReset, 0, id_}, payload);
}

}  // namespace kvdiff::engines
