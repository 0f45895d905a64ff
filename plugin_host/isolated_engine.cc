#include "plugin_host/isolated_engine.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "format/error.h"

extern char** environ;

namespace kvdiff::engines {
namespace {

// ---- The wire: one request, one reply, in this machine's byte order (parent and child are the
// same binary on the same machine). A request is a header and `count` tokens; a reply is a
// header and `bytes` of payload: the logits (float32, row-major), the error message, or the info.

enum class Op : uint32_t { kInfo, kNewSession, kFree, kAppend, kLength, kTruncate, kFork, kReset };
enum class Status : uint32_t { kOk, kInputError, kEngineError };

struct Request {
  Op op;
  uint32_t unused = 0;
  int64_t session = -1;
  int64_t arg = 0;    // truncate: the length
  int64_t count = 0;  // append: how many tokens follow
};

struct Reply {
  Status status;
  uint32_t unused = 0;
  int64_t value = 0;  // a session id, a length, the number of rows
  int64_t bytes = 0;  // payload that follows
};

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
  }
  return "?";
}

// Whole writes; false when the other side is gone. MSG_NOSIGNAL: a dead child is an error to
// report, not a SIGPIPE that kills kvdiff.
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

// Whole reads; false at end of file or an error. With a deadline, also false when it passes
// (`timed_out` says which).
bool ReadAll(int fd, void* data, size_t size,
             std::optional<std::chrono::steady_clock::time_point> deadline = std::nullopt,
             bool* timed_out = nullptr) {
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

// The info as a small text: name, version, then one "key value" per line.
std::string EncodeInfo(const EngineInfo& info) {
  std::string s = fmt::format("{}\n{}\n{}\n{}\n{}\n{}\n", info.name, info.version, info.abi_version,
                              info.vocab_size, info.max_length, info.cache_dtype);
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
  if (lines.size() < 6) throw EngineError("engine host: a malformed info reply");
  EngineInfo info;
  info.name = lines[0];
  info.version = lines[1];
  info.abi_version = static_cast<uint32_t>(std::stoul(lines[2]));
  info.vocab_size = std::stoll(lines[3]);
  info.max_length = std::stoll(lines[4]);
  info.cache_dtype = lines[5];
  for (size_t i = 6; i < lines.size(); ++i) {
    const size_t space = lines[i].rfind(' ');
    if (space == std::string::npos) continue;
    info.sizes.emplace_back(lines[i].substr(0, space), std::stoll(lines[i].substr(space + 1)));
  }
  return info;
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

  // One request and its reply. Throws what the engine threw; EngineError when the child died or
  // timed out during the call (and the child is then gone for good).
  Reply Call(const Request& request, const Tokens* tokens, std::string& payload) {
    if (dead) throw EngineError(fmt::format("{}: {}", name, *dead));
    bool sent = SendAll(fd, &request, sizeof request);
    if (sent && tokens) sent = SendAll(fd, tokens->data(), tokens->size() * sizeof(Token));
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::milliseconds(static_cast<int64_t>(timeout_seconds * 1000));
    Reply reply{};
    bool timed_out = false;
    bool read = sent && ReadAll(fd, &reply, sizeof reply, deadline, &timed_out);
    if (read) {
      payload.resize(static_cast<size_t>(reply.bytes));
      read = ReadAll(fd, payload.data(), payload.size(), deadline, &timed_out);
    }
    if (!read) Bury(request, timed_out);
    if (reply.status == Status::kInputError) throw InputError(payload);
    if (reply.status == Status::kEngineError) throw EngineError(payload);
    return reply;
  }

  // The child failed during `request`: kill it if it still runs, reap it, and throw.
  [[noreturn]] void Bury(const Request& request, bool timed_out) {
    if (timed_out) kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    pid = -1;
    const std::string what =
        timed_out ? fmt::format("did not answer within {} s (killed)", timeout_seconds)
                  : DescribeExit(status);
    std::string call = OpName(request.op);
    if (request.op == Op::kAppend) {
      call += fmt::format(" of {} token{}", request.count, request.count == 1 ? "" : "s");
    }
    if (request.op == Op::kTruncate) call += fmt::format("({})", request.arg);
    dead = fmt::format("the isolated engine process {} during {}", what, call);
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
  host.Call(Request{Op::kInfo}, nullptr, payload);
  EngineInfo info = DecodeInfo(payload);
  host.name = info.name;
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
  const Reply reply = host_->Call(Request{Op::kNewSession}, nullptr, payload);
  return IsolatedSession(host_, reply.value);
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
    host_->Call(Request{Op::kFree, 0, id_}, nullptr, payload);
  } catch (const std::exception&) {
    // A child that dies while freeing is reported by the next call that needs it.
  }
}

Logits IsolatedSession::Append(const Tokens& tokens) {
  KVDIFF_CHECK(!tokens.empty(), "{}: tokens is empty (expected at least one token)", host_->name);
  std::string payload;
  const Reply reply = host_->Call(
      Request{Op::kAppend, 0, id_, 0, static_cast<int64_t>(tokens.size())}, &tokens, payload);
  const int64_t rows = reply.value;
  const int64_t vocab = rows > 0 ? static_cast<int64_t>(payload.size() / sizeof(float)) / rows : 0;
  if (rows != static_cast<int64_t>(tokens.size()) ||
      static_cast<size_t>(rows * vocab) * sizeof(float) != payload.size()) {
    throw EngineError(fmt::format("{}: the engine host sent {} rows ({} bytes) for {} tokens",
                                  host_->name, rows, payload.size(), tokens.size()));
  }
  Logits logits(rows, vocab);
  std::memcpy(logits.data(), payload.data(), payload.size());
  return logits;
}

int64_t IsolatedSession::Length() const {
  std::string payload;
  return host_->Call(Request{Op::kLength, 0, id_}, nullptr, payload).value;
}

void IsolatedSession::Truncate(int64_t length) {
  std::string payload;
  host_->Call(Request{Op::kTruncate, 0, id_, length}, nullptr, payload);
}

IsolatedSession IsolatedSession::Fork() const {
  std::string payload;
  const Reply reply = host_->Call(Request{Op::kFork, 0, id_}, nullptr, payload);
  return IsolatedSession(host_, reply.value);
}

void IsolatedSession::Reset() {
  std::string payload;
  host_->Call(Request{Op::kReset, 0, id_}, nullptr, payload);
}

// ---- The child's side ----

namespace {

class Server {
 public:
  explicit Server(int fd) : fd_(fd) {}

  // Runs `body` and sends its reply; the plugin's exceptions become error replies.
  template <class Body>
  bool Answer(Body&& body) {
    Reply reply{Status::kOk};
    std::string payload;
    try {
      body(reply, payload);
    } catch (const InputError& e) {
      reply.status = Status::kInputError;
      payload = e.what();
    } catch (const std::exception& e) {
      reply.status = Status::kEngineError;
      payload = e.what();
    }
    reply.bytes = static_cast<int64_t>(payload.size());
    return SendAll(fd_, &reply, sizeof reply) && SendAll(fd_, payload.data(), payload.size());
  }

  Session& Find(int64_t id) {
    auto it = sessions_.find(id);
    if (it == sessions_.end()) throw EngineError(fmt::format("engine host: no session {}", id));
    return it->second;
  }
  int64_t Keep(Session session) {
    sessions_.emplace(next_id_, std::move(session));
    return next_id_++;
  }
  void Free(int64_t id) { sessions_.erase(id); }

 private:
  int fd_;
  std::map<int64_t, Session> sessions_;
  int64_t next_id_ = 0;
};

}  // namespace

int ServeIsolatedEngine(int fd, const std::filesystem::path& plugin_path,
                        const std::filesystem::path& model_dir, const std::string& options) {
  Server server(fd);
  std::optional<Engine> engine;
  Request request{};
  while (ReadAll(fd, &request, sizeof request)) {
    Tokens tokens;
    if (request.op == Op::kAppend) {
      if (request.count <= 0 || request.count > (int64_t{1} << 30)) return 3;
      tokens.resize(static_cast<size_t>(request.count));
      if (!ReadAll(fd, tokens.data(), tokens.size() * sizeof(Token))) return 0;
    }
    const bool sent = server.Answer([&](Reply& reply, std::string& payload) {
      if (request.op == Op::kInfo) {
        engine.emplace(Plugin::Load(plugin_path).Open(model_dir, options));
        payload = EncodeInfo(engine->Info());
        return;
      }
      if (!engine) throw EngineError("engine host: the engine is not open");
      switch (request.op) {
        case Op::kNewSession:
          reply.value = server.Keep(engine->NewSession());
          break;
        case Op::kFree:
          server.Free(request.session);
          break;
        case Op::kAppend: {
          const Logits logits = server.Find(request.session).Append(tokens);
          reply.value = logits.rows();
          payload.assign(reinterpret_cast<const char*>(logits.data()),
                         static_cast<size_t>(logits.size()) * sizeof(float));
          break;
        }
        case Op::kLength:
          reply.value = server.Find(request.session).Length();
          break;
        case Op::kTruncate:
          server.Find(request.session).Truncate(request.arg);
          break;
        case Op::kFork:
          reply.value = server.Keep(server.Find(request.session).Fork());
          break;
        case Op::kReset:
          server.Find(request.session).Reset();
          break;
        case Op::kInfo:
          break;
      }
    });
    if (!sent) return 0;
  }
  return 0;
}

}  // namespace kvdiff::engines
