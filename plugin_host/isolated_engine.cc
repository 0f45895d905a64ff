// The parent's side of an engine in a child process: starts the child (`kvdiff engine-host`, whose
// side is engine_host.cc, or an engine program), speaks the protocol to it (engine_wire.h) and
// turns its death, its silence, its errors and its breaches of the protocol into exceptions.
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
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <numeric>
#include <optional>
#include <set>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "format/error.h"
#include "plugin_host/batch_items.h"
#include "plugin_host/engine_text.h"
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

// The shell reports a command killed by signal N as exit code 128 + N: say which signal it was.
std::string ShellExit(const std::string& ended) {
  const std::string prefix = "exited with code ";
  if (ended.rfind(prefix, 0) != 0) return ended;
  const int code = std::atoi(ended.c_str() + prefix.size());
  if (code <= 128 || code > 128 + 64) return ended;
  const int sig = code - 128;
  const char* abbrev = sigabbrev_np(sig);
  return fmt::format("{} (the shell's report of its command killed by signal {}: SIG{}, {})", ended,
                     sig, abbrev ? abbrev : "?", strsignal(sig));
}

// An engine program's command as /bin/sh runs it: a plain command (words, quotes, no shell syntax)
// with `exec`, so that the engine is the child itself: its death is its own (not the shell's exit
// code), and no shell keeps the socket open once the engine has closed it. Commands that use the
// shell's syntax (`cd dir && ./engine`, `VAR=1 engine`, pipes, redirections) run as they are.
std::string ShellCommand(const std::string& command) {
  const size_t start = command.find_first_not_of(" \t");
  if (start == std::string::npos) return command;
  const std::string first = command.substr(start, command.find_first_of(" \t", start) - start);
  const bool plain = command.find_first_of(";&|<>()$`\n") == std::string::npos &&
                     first.find('=') == std::string::npos && first != "if" && first != "for" &&
                     first != "while" && first != "until" && first != "case" && first != "{" &&
                     first != "!" && first != "exec";
  return plain ? "exec " + command : command;
}

// Waits for `pid` at most `seconds`, then kills it (and its process group, when it leads one). ""
// when it exited with code 0, else what happened. Polls (1 ms, doubling to 50 ms): a child closing
// cleanly is gone within milliseconds.
std::string Reap(pid_t pid, double seconds, bool group) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
  auto pause = std::chrono::milliseconds(1);
  int status = 0;
  while (true) {
    const pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid || (done < 0 && errno != EINTR)) {
      // A shell that exited may leave what it started behind, holding nothing of ours: end it.
      if (group) kill(-pid, SIGKILL);
      break;
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      kill(group ? -pid : pid, SIGKILL);
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
// The engines (by plugin file or command) whose close outlasted the time-out once. Every job and
// every model has a process of its own, each closed in turn: the later ones get kCloseGraceSeconds,
// not the whole time-out again (which was paid once per process: --jobs or cases x the time-out).
std::set<std::string> close_hung;
constexpr double kCloseGraceSeconds = 2;

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
  std::string name;  // the plugin file or the command, for messages until the engine says its name
  std::string engine;      // the plugin file or the command, always
  std::string who;         // "the isolated engine process", "the engine program"
  std::string start_call;  // how hello, open and info are named in messages, when not empty
  pid_t pid = -1;
  bool own_group = false;  // the child leads its own process group (with what it starts)
  bool shell = false;      // the child is /bin/sh running an engine program's command
  int fd = -1;
  double timeout_seconds = 600;
  int64_t vocab_size = 0;           // as the info said, once the engine is open
  bool shifts = false;              // the info said it answers shift
  std::optional<std::string> dead;  // why the child is gone
  bool hung = false;                // it went because a call outlasted the time-out

  // Closing the socket tells the child to free its sessions, close the engine and exit 0; a child
  // that crashes, exits otherwise or hangs there is a fault of the engine's close, kept for main.
  ~HostProcess() {
    if (fd >= 0) close(fd);
    if (pid <= 0) return;
    bool hung_before = false;
    {
      std::lock_guard<std::mutex> lock(close_faults_mutex);
      hung_before = close_hung.count(engine) > 0;
    }
    const double seconds =
        hung_before ? std::min(timeout_seconds, kCloseGraceSeconds) : timeout_seconds;
    const std::string what = Reap(pid, seconds, own_group);
    if (what.empty()) return;
    const bool hung = what.rfind("did not finish", 0) == 0;
    if (hung && !hung_before) {
      std::lock_guard<std::mutex> lock(close_faults_mutex);
      close_hung.insert(engine);
    }
    RecordCloseFault(fmt::format(
        "{}: {} {} while closing the engine{}", name, who, what,
        hung && hung_before ? " (its close outlasted the time-out before: not waited for again)"
                            : ""));
  }

  // The calls that start a child: hello, open and info.
  static bool Starting(const Request& request) {
    return request.op == Op::kHello || request.op == Op::kOpen || request.op == Op::kInfo;
  }
  // What a request was, for messages: "append of 8 tokens", "append_batch of 2 items (9 tokens)".
  std::string DescribeCall(const Request& request) const {
    if (Starting(request) && !start_call.empty()) return start_call;
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
    if (request.op == Op::kShift) {
      call += fmt::format("(keep={}, discard={})", request.arg, request.count);
    }
    return call;
  }

  // One request (its header, then `body`) and its reply, whose payload may be at most
  // `max_payload` bytes (or wire::kMaxTextBytes, for an error message). Throws what the engine
  // threw; EngineError when the child died, timed out or broke the protocol during the call (and
  // the child is then gone for good); EngineHungError when it timed out, then or before.
  Reply Call(const Request& request, std::string_view body, std::string& payload,
             int64_t max_payload = 0) {
    if (hung) throw EngineHungError(NotCalledAgain());
    if (dead) throw EngineError(fmt::format("{}: {}", name, *dead));
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::milliseconds(static_cast<int64_t>(timeout_seconds * 1000));
    bool timed_out = false;
    const auto header = wire::EncodeRequest(request);
    bool sent = wire::SendAll(fd, header.data(), header.size(), deadline, &timed_out, pid);
    if (sent && !body.empty()) {
      sent = wire::SendAll(fd, body.data(), body.size(), deadline, &timed_out, pid);
    }
    if (!sent) Bury(request, timed_out);
    // The header in two reads: status and reserved first, so that a peer writing text (or any
    // garbage) is refused as soon as 8 bytes have come, not after a time-out.
    char head[wire::kReplyHeaderBytes] = {};
    size_t got = 0;
    if (!wire::ReadAll(fd, head, 8, deadline, &timed_out, &got, pid)) {
      Bury(request, timed_out, "", Partial(head, got, "of a reply header"));
    }
    const uint32_t status = static_cast<uint32_t>(wire::DecodeReply(head).status);
    if (status > 2 || head[4] || head[5] || head[6] || head[7]) {
      Bury(request, false,
           fmt::format("sent a reply header starting {} (\"{}\"): status {} where the protocol "
                       "has 0, 1 or 2 and a zero reserved word; it does not speak the kvdiff "
                       "engine protocol (killed)",
                       wire::Hex(head, 8), Printable(head, 8), status));
    }
    if (!wire::ReadAll(fd, head + 8, wire::kReplyHeaderBytes - 8, deadline, &timed_out, &got,
                       pid)) {
      Bury(request, timed_out, "", Partial(head, 8 + got, "of a reply header"));
    }
    const Reply reply = wire::DecodeReply(head);
    // Never trust the child's numbers: a size beyond what this call can take is refused before
    // anything is allocated for it, and the stream is then out of step, so the child goes.
    const int64_t limit = std::max(max_payload, wire::kMaxTextBytes);
    if (reply.bytes < 0 || reply.bytes > limit) {
      Bury(request, false,
           fmt::format("announced a reply of {} bytes, where this call takes at most {} (killed)",
                       reply.bytes, limit));
    }
    payload.resize(static_cast<size_t>(reply.bytes));
    if (!wire::ReadAll(fd, payload.data(), payload.size(), deadline, &timed_out, &got, pid)) {
      Bury(request, timed_out, "",
           fmt::format("sent {} of the {} bytes of payload its reply header announced", got,
                       payload.size()));
    }
    if (reply.status == Status::kInputError) throw InputError(EngineText(payload));
    if (reply.status == Status::kEngineError) throw EngineError(EngineText(payload));
    return reply;
  }
  Reply Call(const Request& request, std::string& payload) { return Call(request, {}, payload); }

  // The child failed during `request` (it died, fell silent, or `broke` the protocol as this
  // says; `partial`: what it had sent of the reply): kill it if it still runs, reap it, and throw.
  [[noreturn]] void Bury(const Request& request, bool timed_out, const std::string& broke = "",
                         const std::string& partial = "") {
    std::string what = broke;
    if (what.empty()) {
      // A child whose stream ended may still be running (it closed its end and went on): it has
      // a moment to exit, then it is killed.
      constexpr double kGraceSeconds = 2;
      const std::string ended = Reap(pid, timed_out ? 0 : kGraceSeconds, own_group);
      if (timed_out) {
        what = fmt::format("did not answer within {} s (killed)", timeout_seconds);
      } else if (ended.empty()) {
        what = "exited with code 0";
      } else if (ended.rfind("did not finish", 0) == 0) {
        what = fmt::format("closed its end of the stream and did not exit within {} s (killed)",
                           kGraceSeconds);
      } else if (shell && ended == "exited with code 127") {
        // The shell's code for a command it could not find or run: its message is above.
        what = "exited with code 127 (the shell could not run the command: see its message)";
      } else {
        what = shell ? ShellExit(ended) : ended;
      }
      if (!partial.empty()) what = fmt::format("{}, then {}", partial, what);
    } else {
      Reap(pid, 0, own_group);
    }
    pid = -1;
    dead = fmt::format("{} {} during {}", who, what, DescribeCall(request));
    if (timed_out) {
      hung = true;
      throw EngineHungError(fmt::format(
          "{}: {}; it is not called again: a new process would likely wait as long (raise "
          "--isolate-timeout for an engine that is only slow)",
          name, *dead));
    }
    // A child that dies while starting has no sessions, and whoever started it learns of it here.
    if (Starting(request)) throw EngineError(fmt::format("{}: {}", name, *dead));
    throw EngineError(fmt::format(
        "{}: {}; its sessions are gone, a new session starts a new process", name, *dead));
  }

  // What every call after a time-out throws, at once: waiting again would only repeat it.
  std::string NotCalledAgain() const {
    return fmt::format("{}: not called: earlier, {}; it is not called again", name, *dead);
  }

  // The child goes, for `why`, without a call having failed.
  void Retire(const std::string& why) {
    Reap(pid, 0, own_group);
    pid = -1;
    dead = why;
  }

  // A version this kvdiff does not speak: refused as bad input, and the child goes.
  [[noreturn]] void Refuse(const std::string& message) {
    Reap(pid, 0, own_group);
    pid = -1;
    dead = message;
    throw InputError(fmt::format("{}: {}", name, message));
  }

 private:
  // "sent 10 of the 24 bytes of a reply header (00 01 ...)"; "" when nothing came.
  static std::string Partial(const char* bytes, size_t got, const char* what) {
    if (got == 0) return "";
    return fmt::format("sent {} of the {} bytes {} ({})", got, wire::kReplyHeaderBytes, what,
                       wire::Hex(bytes, got));
  }
  // The bytes as text, non-printable ones as '.', for a peer that writes text.
  static std::string Printable(const char* bytes, size_t n) {
    std::string s(bytes, n);
    for (char& c : s)
      if (c < 0x20 || c > 0x7e || c == '"') c = '.';
    return s;
  }
};

namespace {

std::shared_ptr<HostProcess> Spawn(const EngineProcessSpec& spec) {
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
    throw EngineError(fmt::format("{}: socketpair failed: {}", spec.name, std::strerror(errno)));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  // Its own process group, so that burying it also ends whatever it started (a shell's command, a
  // plugin's helper process), which could otherwise hold the socket and our stderr open.
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attr, 0);
  if (spec.protocol_on_stdio) {
    // An engine program: the socket is its stdin and its stdout; its stderr is ours.
    posix_spawn_file_actions_adddup2(&actions, fds[1], 0);
    posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
  } else {
    // The engine host gets its end as fd 3 (dup2 clears close-on-exec) and our stderr as its
    // stdout, so nothing the plugin prints mixes with kvdiff's reports.
    posix_spawn_file_actions_adddup2(&actions, fds[1], 3);
    posix_spawn_file_actions_adddup2(&actions, 2, 1);
  }
  std::vector<std::string> args = spec.argv;
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, argv[0], &actions, &attr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    throw EngineError(
        fmt::format("{}: cannot start {}: {}", spec.name, spec.argv[0], std::strerror(rc)));
  }
  auto host = std::make_shared<HostProcess>();
  host->name = spec.name;
  host->engine = spec.name;
  host->who = spec.who;
  host->start_call = spec.start_call;
  host->pid = pid;
  host->own_group = true;
  host->shell = spec.protocol_on_stdio;
  host->fd = fds[0];
  host->timeout_seconds = spec.timeout_seconds;
  return host;
}

// hello, open, info: the version handshake, then the engine opened on the model.
EngineInfo OpenIn(HostProcess& host, const EngineProcessSpec& spec) {
  std::string payload;
  // hello measures the start of a process (a Python engine imports numpy; kvdiff engine-host
  // starts in ~0.03 s), not an engine call: it gets kStartSeconds even under a shorter time-out, so
  // a loaded machine does not fail the start. The plugin itself is loaded in open, under the
  // time-out.
  constexpr double kStartSeconds = 10;
  const double call_seconds = host.timeout_seconds;
  host.timeout_seconds = std::max(call_seconds, kStartSeconds);
  const Reply hello = host.Call(
      Request{Op::kHello, -1, wire::kProtocolVersion, wire::kOldestProtocolVersion}, payload);
  host.timeout_seconds = call_seconds;
  if (hello.value < wire::kOldestProtocolVersion || hello.value > wire::kProtocolVersion) {
    host.Refuse(fmt::format(
        "{} answered hello with protocol version {}; this kvdiff speaks version {} to {} "
        "(docs/protocol.md, \"Versions\")",
        host.who, hello.value, wire::kOldestProtocolVersion, wire::kProtocolVersion));
  }
  const std::string dir = spec.model_dir.string();
  // The child would take more for a breach of the protocol; say so here instead, as bad input.
  KVDIFF_CHECK(static_cast<int64_t>(dir.size()) <= wire::kMaxTextBytes &&
                   static_cast<int64_t>(spec.options.size()) <= wire::kMaxTextBytes,
               "{}: a model path of {} bytes and options of {} bytes; the engine protocol's open "
               "takes at most {} bytes each",
               host.name, dir.size(), spec.options.size(), wire::kMaxTextBytes);
  host.Call(Request{Op::kOpen, -1, static_cast<int64_t>(dir.size()),
                    static_cast<int64_t>(spec.options.size())},
            dir + spec.options, payload);
  host.Call(Request{Op::kInfo}, payload);
  EngineInfo info = wire::DecodeInfo(payload);
  host.name = info.name;
  host.vocab_size = info.vocab_size;
  host.shifts = info.shifts;
  return info;
}

// A process started after a crash must be the engine the backend was built on: its info decided
// the calls kvdiff makes (append_batch, shift) and the bounds it checks (max_length, sessions).
void CheckSameEngine(const EngineInfo& first, const EngineInfo& now, const std::string& who) {
  const auto text = [](const EngineInfo& i) {
    std::string sizes;
    for (const auto& [what, size] : i.sizes) sizes += fmt::format(" {}={}", what, size);
    return fmt::format(
        "name {}, version {}, abi_version {}, vocab_size {}, max_length {}, cache {}, "
        "max_sessions {}, max_batch_tokens {}, shifts {}, sizes{}",
        i.name, i.version, i.abi_version, i.vocab_size, i.max_length, i.cache_dtype, i.max_sessions,
        i.max_batch_tokens, i.shifts, sizes.empty() ? " none" : sizes);
  };
  const std::string a = text(first), b = text(now);
  if (a != b) {
    throw EngineError(fmt::format(
        "{}: {} started after a crash describes another engine: its info says {}, where the "
        "first process said {}",
        first.name, who, b, a));
  }
}

}  // namespace

IsolatedEngine IsolatedEngine::Start(const IsolatedEngineSpec& spec) {
  EngineProcessSpec process;
  process.argv = {spec.host.string(), "engine-host", "--fd=3", spec.plugin.string()};
  process.name = spec.plugin.filename().string();
  process.who = "the isolated engine process";
  process.start_call = "loading the plugin and opening the engine";
  process.model_dir = spec.model_dir;
  process.options = spec.options;
  process.timeout_seconds = spec.timeout_seconds;
  return StartProcess(std::move(process));
}

IsolatedEngine IsolatedEngine::StartProgram(const EngineProgramSpec& spec) {
  EngineProcessSpec process;
  process.argv = {"/bin/sh", "-c", ShellCommand(spec.command)};
  process.protocol_on_stdio = true;
  process.name = "exec:" + spec.command;
  process.who = "the engine program";
  process.model_dir = spec.model_dir;
  process.options = spec.options;
  process.timeout_seconds = spec.timeout_seconds;
  return StartProcess(std::move(process));
}

IsolatedEngine IsolatedEngine::StartProcess(EngineProcessSpec spec) {
  std::shared_ptr<HostProcess> host = Spawn(spec);
  EngineInfo info = OpenIn(*host, spec);
  return IsolatedEngine(std::move(spec), std::move(host), std::move(info));
}

IsolatedSession IsolatedEngine::NewSession() const {
  // After a crash a new process may well serve the next conversation; after a time-out it would
  // most likely hang as long again, so the engine stays down (HostProcess::Call throws).
  if (host_->dead && !host_->hung) {
    host_ = Spawn(spec_);
    const EngineInfo now = OpenIn(*host_, spec_);
    try {
      CheckSameEngine(info_, now, host_->who);
    } catch (const EngineError& e) {
      host_->Retire(e.what());  // not called: the next session tries a new process again
      throw;
    }
  }
  std::string payload;
  const Reply reply = host_->Call(Request{Op::kNewSession}, payload);
  return IsolatedSession(host_, reply.value);
}

std::vector<Logits> IsolatedEngine::AppendBatch(const std::vector<IsolatedBatchItem>& items) const {
  KVDIFF_CHECK(HasBatch(), "{}: a version-{} engine has no append_batch", info_.name,
               info_.abi_version);
  // A session of a child that died and was replaced is not this engine's any more.
  CheckBatchItems(info_.name, items, [&](const IsolatedSession* s) {
    return s != nullptr && s->host_ == host_;  // a moved-from session has no host
  });
  // The body (wire::BatchItemHeader): the items, then every token, then every output flag.
  std::string body, tokens, flags;
  std::vector<int64_t> rows;  // per item, its flagged rows
  int64_t n_tokens = 0;
  for (const IsolatedBatchItem& item : items) {
    const std::vector<uint8_t> item_flags = OutputFlags(item);
    wire::AppendBatchItemHeader(body,
                                {item.session->id_, static_cast<int64_t>(item.tokens.size())});
    wire::AppendTokens(tokens, item.tokens.data(), item.tokens.size());
    flags.append(item_flags.begin(), item_flags.end());
    rows.push_back(FlaggedRows(item_flags));
    n_tokens += static_cast<int64_t>(item.tokens.size());
  }
  body += tokens;
  body += flags;

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
      host_->Call(Request{Op::kAppendBatch, -1, static_cast<int64_t>(items.size()), n_tokens}, body,
                  payload, bytes);
  // An isolated plugin's host is kvdiff's own code, but it shares its process with the plugin
  // under test; an engine program is all the engine's.
  if (reply.value != total || static_cast<int64_t>(payload.size()) != bytes) {
    throw EngineError(fmt::format(
        "{}: {} sent {} rows ({} bytes) for a batch of {} items whose output flags ask for {} rows "
        "of vocab {} ({} bytes)",
        info_.name, host_->who, reply.value, payload.size(), items.size(), total, vocab, bytes));
  }
  std::vector<Logits> out;
  size_t offset = 0;
  for (int64_t n : rows) {
    Logits logits(n, vocab);
    const size_t values = static_cast<size_t>(logits.size());
    if (values > 0) wire::ReadFloats(payload.data() + offset, values, logits.data());
    offset += values * sizeof(float);
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
  // A moved-from session has no host; every id is the engine's (docs/protocol.md: any i64).
  if (!host_ || host_->dead) return;
  std::string payload;
  try {
    host_->Call(Request{Op::kFree, id_}, payload);
  } catch (const std::exception&) {
    // A child that dies while freeing is reported by the next call that needs it.
  }
}

Logits IsolatedSession::Append(const Tokens& tokens) {
  KVDIFF_CHECK(!tokens.empty(), "{}: tokens is empty (expected at least one token)", host_->name);
  const int64_t n = static_cast<int64_t>(tokens.size());
  KVDIFF_CHECK(n <= wire::kMaxRequestTokens,
               "{}: an append of {} tokens; an engine in another process takes at most {} per call",
               host_->name, n, wire::kMaxRequestTokens);
  const int64_t vocab = host_->vocab_size;
  const int64_t bytes = n * vocab * static_cast<int64_t>(sizeof(float));
  std::string body, payload;
  wire::AppendTokens(body, tokens.data(), tokens.size());
  const Reply reply = host_->Call(Request{Op::kAppend, id_, 0, n}, body, payload, bytes);
  if (reply.value != n || static_cast<int64_t>(payload.size()) != bytes) {
    throw EngineError(
        fmt::format("{}: {} sent {} rows ({} bytes, {} floats) for append of {} tokens of vocab {} "
                    "(expected {} bytes)",
                    host_->name, host_->who, reply.value, payload.size(),
                    payload.size() / sizeof(float), n, vocab, bytes));
  }
  Logits logits(n, vocab);
  wire::ReadFloats(payload.data(), static_cast<size_t>(logits.size()), logits.data());
  return logits;
}

int64_t IsolatedSession::Length() const {
  std::string payload;
  return host_->Call(Request{Op::kLength, id_}, payload).value;
}

void IsolatedSession::Truncate(int64_t length) {
  std::string payload;
  host_->Call(Request{Op::kTruncate, id_, length}, payload);
}

IsolatedSession IsolatedSession::Fork() const {
  std::string payload;
  const Reply reply = host_->Call(Request{Op::kFork, id_}, payload);
  return IsolatedSession(host_, reply.value);
}

void IsolatedSession::Reset() {
  std::string payload;
  host_->Call(Request{Op::kReset, id_}, payload);
}

void IsolatedSession::Shift(int64_t keep, int64_t discard) {
  // An engine that did not say it shifts may not know the op: it is never sent one.
  KVDIFF_CHECK(host_->shifts, "{}: the engine does not shift (its info has no shifts 1)",
               host_->name);
  std::string payload;
  host_->Call(Request{Op::kShift, id_, keep, discard}, payload);
}

}  // namespace kvdiff::engines
