// A C++ face for engine plugins (include/kvdiff/engine.h): loads the shared library, checks the ABI
// version, and turns every status into an exception, so a harness backend over a plugin is a thin
// adapter. Knows nothing of the harness.
//
//   Plugin plugin = Plugin::Load("build/engines/example/libkvdiff_engine_example.so");
//   Engine engine = plugin.Open("models/tiny", "max_length=64");
//   Session s = engine.NewSession();
//   Logits a = s.Append({1, 2, 3});  // [3, vocab]
//   Session f = s.Fork();
//
// Errors: bad input (a file that is not a plugin, another ABI version, an unknown option, a token
// out of range, truncate beyond the length) throws InputError; the engine's own failure throws
// EngineError. Messages start with the engine's name. A call that throws changes nothing.
// Lifetimes are shared: a Session keeps its Engine open and an Engine keeps its library loaded, so
// objects may be destroyed in any order. Threads: as engine.h says, one thread at a time per Engine
// and its Sessions (the caller serializes); separate Engines may run in parallel only if the plugin
// allows it (the example does; llama.cpp's global logger is guarded).
// ForwardFull (no cache) is a fresh Session's Append of the whole history.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "format/error.h"
#include "format/tensor.h"

struct kvdiff_engine_api;
struct kvdiff_session;

namespace kvdiff::engines {

// What an opened engine reports (engine.h's kvdiff_engine_info, plus the table's name/version).
struct EngineInfo {
  std::string name;          // "example", "llama.cpp"
  std::string version;       // the engine's own version text
  uint32_t abi_version = 0;  // the version the plugin declares (1 to 3: engine.h's "Versions")
  int64_t vocab_size = 0;
  int64_t max_length = 0;                              // positions a session can hold
  std::string cache_dtype;                             // "f32", "f16", "q8_0", ...
  std::vector<std::pair<std::string, int64_t>> sizes;  // "interesting sizes", in engine order
  int64_t max_sessions = 0;      // ABI 2: sessions alive at once; 0: no limit (and every v1 plugin)
  int64_t max_batch_tokens = 0;  // ABI 2: tokens one call takes; 0: no limit
  bool shifts = false;           // ABI 3: the plugin has shift (a NULL shift, or ABI < 3: false)
};

struct EngineState;  // the opened kvdiff_engine* and the library that made it

class Session {
 public:
  // Positions Length()..Length()+n-1; returns their logits [n, vocab].
  Logits Append(const Tokens& tokens);
  int64_t Length() const;
  void Truncate(int64_t length);  // InputError unless 0 <= length <= Length()
  Session Fork() const;           // explicit deep copy
  void Reset();                   // empty cache, position 0
  // ABI 3's shift: drops [keep, keep + discard), moves the later positions down (engine.h).
  // InputError when the engine does not shift (EngineInfo::shifts) or the plugin refuses.
  void Shift(int64_t keep, int64_t discard);

  Session(Session&&) noexcept;
  Session& operator=(Session&&) noexcept;
  ~Session();

 private:
  friend class Engine;
  Session(std::shared_ptr<EngineState> engine, kvdiff_session* session);
  std::shared_ptr<EngineState> engine_;
  kvdiff_session* session_ = nullptr;
};

// One session's part of a batched call (engine.h's kvdiff_batch_item): BatchItem for
// Engine::AppendBatch, IsolatedBatchItem (isolated_engine.h) for IsolatedEngine::AppendBatch.
template <class SessionT>
struct BatchItemOf {
  SessionT* session = nullptr;
  Tokens tokens;
  std::vector<bool> output;  // per token: its row is returned; empty: every row
};
using BatchItem = BatchItemOf<Session>;

class Engine {
 public:
  const EngineInfo& Info() const;
  Session NewSession() const;
  // ABI 2: whether the plugin has append_batch.
  bool HasBatch() const;
  // One append_batch call; per item, the logits of its flagged rows [rows, vocab]. InputError
  // when the plugin is version 1, an item is empty or not a session of this engine, or a session
  // is named twice; the plugin's own errors as for Session::Append.
  std::vector<Logits> AppendBatch(const std::vector<BatchItem>& items) const;

 private:
  friend class Plugin;
  explicit Engine(std::shared_ptr<EngineState> state) : state_(std::move(state)) {}
  std::shared_ptr<EngineState> state_;
};

struct Library;  // the dlopen handle and the function table

class Plugin {
 public:
  // dlopens `path`, finds kvdiff_engine_entry, checks the ABI version and that every function is
  // present. InputError naming the file otherwise (another ABI version: both numbers).
  static Plugin Load(const std::filesystem::path& path);
  const std::string& Name() const;
  const std::string& Version() const;
  const std::filesystem::path& Path() const;
  // Opens a model directory with engine options ("key=value,key=value"; "" for defaults).
  Engine Open(const std::filesystem::path& model_dir, const std::string& options = "") const;

 private:
  explicit Plugin(std::shared_ptr<Library> library) : library_(std::move(library)) {}
  std::shared_ptr<Library> library_;
};

}  // namespace kvdiff::engines
