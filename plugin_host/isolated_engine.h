// An engine in a child process that speaks the kvdiff engine protocol (plugin_host/engine_wire.h,
// docs/protocol.md), so that a crash or a hang in the engine is a failed call, not a dead kvdiff.
// Two kinds of child, one parent side:
//   - an isolated plugin (`--isolate`, the default): kvdiff itself (`kvdiff engine-host`, a hidden
//     subcommand) loads the plugin and serves it on an inherited socket (fd 3);
//   - an engine program (`exec:COMMAND`): COMMAND run by /bin/sh -c, in any language, speaking
//     the protocol on its stdin and stdout (one socket, both directions); its stderr is kvdiff's.
// The parent side has the surface of engines::Engine / engines::Session, so the harness adapts
// both alike.
//
//   IsolatedEngine engine = IsolatedEngine::Start({"/path/kvdiff", plugin, model_dir, "kv=f32"});
//   IsolatedEngine program = IsolatedEngine::StartProgram({"python3 engine.py", model_dir, ""});
//   IsolatedSession s = engine.NewSession();
//   Logits a = s.Append({1, 2, 3});  // a segfault in the engine throws EngineError here
//
// Starting is hello (the version handshake), open (the model directory and the options) and info.
// The child does everything that runs engine code; the parent never maps a plugin.
// Errors: the engine's own InputError/EngineError come back as the same exception types with the
// same messages; a protocol version the parent does not speak is an InputError. The child dying
// (a signal, an exit), not answering within `timeout_seconds`, or breaking the protocol (a status
// it does not have, a reply larger than the call takes, the wrong number of rows) throws
// EngineError naming what happened, what it sent and the call that was running; the child is then
// gone, every session of it throws, and the next NewSession() starts a new child — so in a
// campaign the case that crashed fails and the next case runs on a fresh engine.
// Threads: as for engines::Engine, one thread at a time per engine and its sessions.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "format/tensor.h"
#include "plugin_host/plugin_loader.h"

namespace kvdiff::engines {

// An isolated plugin.
struct IsolatedEngineSpec {
  std::filesystem::path host;  // the kvdiff executable that has the engine-host subcommand
  std::filesystem::path plugin, model_dir;
  std::string options;           // engine options, "key=value,key=value"
  double timeout_seconds = 600;  // per call, loading the plugin and opening the engine included;
                                 // a child silent for longer is killed
};

// An engine program (`exec:COMMAND`).
struct EngineProgramSpec {
  std::string command;  // run by /bin/sh -c
  std::filesystem::path model_dir;
  std::string options;  // engine options, "key=value,key=value", sent in the open call
  double timeout_seconds = 600;
};

// How to start a child and what to open in it: what both specs become.
struct EngineProcessSpec {
  std::vector<std::string> argv;   // argv[0] is the file run
  bool protocol_on_stdio = false;  // the protocol on fds 0 and 1; else on fd 3, with fd 1 -> 2
  std::string name;                // for messages until the engine has said its name
  std::string who;                 // "the isolated engine process", "the engine program"
  std::string start_call;          // not empty: how hello, open and info are named in messages
  std::filesystem::path model_dir;
  std::string options;
  double timeout_seconds = 600;
};

struct HostProcess;  // the child, its socket, the sessions it holds

class IsolatedSession {
 public:
  Logits Append(const Tokens& tokens);
  int64_t Length() const;
  void Truncate(int64_t length);
  IsolatedSession Fork() const;
  void Reset();
  void Shift(int64_t keep, int64_t discard);  // InputError when the engine does not shift

  IsolatedSession(IsolatedSession&&) noexcept;
  IsolatedSession& operator=(IsolatedSession&&) noexcept;
  ~IsolatedSession();

 private:
  friend class IsolatedEngine;
  IsolatedSession(std::shared_ptr<HostProcess> host, int64_t id)
      : host_(std::move(host)), id_(id) {}
  std::shared_ptr<HostProcess> host_;  // the child this session lives in (maybe dead since)
  int64_t id_ = -1;
};

// One session's part of IsolatedEngine::AppendBatch.
using IsolatedBatchItem = BatchItemOf<IsolatedSession>;

class IsolatedEngine {
 public:
  // Starts the child and opens the engine in it; the engine's own errors are rethrown.
  static IsolatedEngine Start(const IsolatedEngineSpec& spec);
  static IsolatedEngine StartProgram(const EngineProgramSpec& spec);
  static IsolatedEngine StartProcess(EngineProcessSpec spec);
  const EngineInfo& Info() const { return info_; }
  // A new session; starts a new child first when the last one died. After a call outlasted the
  // time-out, every call (this one included) throws EngineHungError at once, starting nothing.
  IsolatedSession NewSession() const;
  // ABI 2: whether the plugin has append_batch.
  bool HasBatch() const { return info_.abi_version >= 2; }
  // One append_batch call in the child, as engines::Engine::AppendBatch: per item, the logits of
  // its flagged rows [rows, vocab]. Its refusals (a version-1 plugin, no items, an empty item, a
  // session named twice or not of this engine's current child) are InputErrors made here, before
  // anything is sent. The child dying or hanging throws EngineError as for any call, and every
  // session of that child throws from then on.
  std::vector<Logits> AppendBatch(const std::vector<IsolatedBatchItem>& items) const;

 private:
  IsolatedEngine(EngineProcessSpec spec, std::shared_ptr<HostProcess> host, EngineInfo info)
      : spec_(std::move(spec)), host_(std::move(host)), info_(std::move(info)) {}
  EngineProcessSpec spec_;
  mutable std::shared_ptr<HostProcess> host_;
  EngineInfo info_;
};

// Faults of isolated engines after their last call: a child that crashed, hung or exited with a
// failure while closing its engine (the socket closes when the engine object is destroyed, and
// destructors cannot throw). Kept process-wide for main, which reports them and fails the run;
// taking them empties the list.
std::vector<std::string> TakeCloseFaults();

// The child's side for a plugin: answers hello, loads the plugin and opens the engine on open, and
// serves requests on `fd` until the parent closes it. Returns the process's exit code. Used by
// `kvdiff engine-host` only.
int ServeIsolatedEngine(int fd, const std::filesystem::path& plugin);

}  // namespace kvdiff::engines
