// Outside engines: an engine plugin (include/kvdiff/engine.h, loaded by
// plugin_host/plugin_loader.h) behind the Backend interface, so every scenario, campaign, golden
// and repro experiment reaches its cache. A plugin reads a model directory; kvdiff writes the
// weights it holds (a preset, a converted llama2.c checkpoint, a directory already loaded) into a
// scratch folder in float32, so every backend of a run sees the same numbers. The plugin's uncached
// forward is a fresh session's Append of the whole history: its cached rows are held to its own
// one-shot prefill, and to the other backends' rows by the cross comparison. With
// BackendOptions::isolate (the default) the whole plugin lifecycle — dlopen, its constructors, the
// entry point, open, info, sessions, close — runs in a child process
// (plugin_host/isolated_engine.h), the same adapter over the other engine type: kvdiff itself never
// maps a plugin it runs isolated, so none of its code runs here. A batch (Backend::AppendBatch) is
// ONE append_batch call when the plugin has it (ABI 2), else one append per item; a shift step
// is the plugin's shift (ABI 3), and is refused before anything runs for a plugin without one.
// An engine program (`exec:COMMAND`, any language, speaking docs/protocol.md on its stdin/stdout)
// is the same adapter over the same IsolatedEngine: only how the child starts differs.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "format/error.h"
#include "format/input_file.h"
#include "format/scratch_dir.h"
#include "harness/backend/registry.h"
#include "plugin_host/batch_items.h"
#include "plugin_host/isolated_engine.h"
#include "plugin_host/plugin_loader.h"

namespace kvdiff::harness {
namespace {

// SessionT is engines::Session (in this process) or engines::IsolatedSession (in a child).
template <class SessionT>
class PluginSession : public BackendSession {
 public:
  // `backend` made it: a batched call takes only its own backend's sessions.
  PluginSession(SessionT session, const Backend* backend)
      : session_(std::move(session)), backend_(backend) {}
  // Plugins record no layer trace: --localize says so.
  Logits Append(const Tokens& tokens, ForwardTrace* /*trace*/) override {
    return session_.Append(tokens);
  }
  int64_t Length() const override { return session_.Length(); }
  void Truncate(int64_t length) override { session_.Truncate(length); }
  std::unique_ptr<BackendSession> Fork() const override {
    return std::make_unique<PluginSession>(session_.Fork(), backend_);
  }
  void Reset() override { session_.Reset(); }
  // Offered when the engine says it shifts (BackendInfo::shifts); its refusals come back as
  // they are (bad input, exit 2), and the replay holds Length() to the shortened history after.
  void Shift(int64_t keep, int64_t discard) override { session_.Shift(keep, discard); }

  SessionT& EngineSession() { return session_; }
  const Backend* Owner() const { return backend_; }

 private:
  SessionT session_;
  const Backend* backend_;
};

template <class EngineT>
class PluginBackend : public Backend {
 public:
  // `open` opens the engine on the model directory it is given.
  // `kind` says what the engine is in the description: "engine plugin", "engine program".
  template <class Open>
  PluginBackend(BackendInfo info, std::shared_ptr<const format::ModelWeights> weights, Open&& open,
                const char* kind = "engine plugin")
      : info_(std::move(info)), weights_(std::move(weights)), dir_("plugin-model") {
    format::SaveModel(dir_.path(), *weights_, format::DType::kF32);
    engine_ = std::make_unique<EngineT>(open(dir_.path()));
    const engines::EngineInfo& e = engine_->Info();
    // kvdiff wrote the model the engine opened: a vocabulary that differs is the engine's fault
    // (a failing engine, exit 1), not bad input.
    if (e.vocab_size != weights_->config.vocab_size) {
      throw EngineError(
          fmt::format("backend {}: the engine reports vocab_size {}, the model has {}", info_.name,
                      e.vocab_size, weights_->config.vocab_size));
    }
    const bool isolated = std::is_same_v<EngineT, engines::IsolatedEngine>;
    info_.description =
        fmt::format("{} {} {}, {} cache{}", kind, e.name, e.version, e.cache_dtype,
                    isolated && std::string(kind) == "engine plugin" ? ", isolated" : "");
    for (const auto& [what, size] : e.sizes) info_.interesting_sizes.push_back(size);
    if (e.cache_dtype != "f32") info_.cache_dtype = e.cache_dtype;
    info_.max_length = e.max_length;
    info_.max_sessions = e.max_sessions;
    info_.max_batch_tokens = e.max_batch_tokens;
    info_.shifts = e.shifts;  // ABI 3 with a shift call, or an engine program whose info says so
  }

  const BackendInfo& Info() const override { return info_; }
  const format::LlamaConfig& config() const override { return weights_->config; }
  Logits ForwardFull(const Tokens& tokens, ForwardTrace* /*trace*/) const override {
    return engine_->NewSession().Append(tokens);
  }
  std::unique_ptr<BackendSession> NewSession() const override {
    return std::make_unique<Session>(engine_->NewSession(), this);
  }

  // A version-2 plugin runs the batch in ONE append_batch call; a version-1 plugin one append per
  // item (the default). Either way the refusals of engine.h's append_batch come first, so a batch
  // step means the same whatever the plugin's version, and what comes back is held to the shapes
  // the flags ask for: an engine under test may lie.
  std::vector<Logits> AppendBatch(const std::vector<BatchItem>& items) const override {
    engines::CheckBatchItems(fmt::format("backend {}", Name()), items, [this](BackendSession* s) {
      const auto* own = dynamic_cast<const Session*>(s);
      return own != nullptr && own->Owner() == this;
    });
    std::vector<Logits> out;
    if (engine_->HasBatch()) {
      std::vector<engines::BatchItemOf<EngineSession>> engine_items;
      for (const BatchItem& item : items) {
        engine_items.push_back(
            {&static_cast<Session*>(item.session)->EngineSession(), item.tokens, item.output});
      }
      out = engine_->AppendBatch(engine_items);
    } else {
      out = Backend::AppendBatch(items);
    }
    CheckBatchShapes(items, out);
    return out;
  }

 private:
  using EngineSession = decltype(std::declval<EngineT>().NewSession());
  using Session = PluginSession<EngineSession>;

  // EngineError naming the engine, the item and both shapes when `out` is not, per item, its
  // flagged rows by the vocab.
  void CheckBatchShapes(const std::vector<BatchItem>& items, const std::vector<Logits>& out) const {
    const std::string& engine = engine_->Info().name;
    if (out.size() != items.size()) {
      throw EngineError(fmt::format("{} (backend {}): a batch of {} items returned {} results",
                                    engine, Name(), items.size(), out.size()));
    }
    const int64_t vocab = weights_->config.vocab_size;
    for (size_t i = 0; i < items.size(); ++i) {
      const int64_t rows = items[i].OutputRows();
      if (out[i].rows() != rows || out[i].cols() != vocab) {
        throw EngineError(fmt::format(
            "{} (backend {}): batch item {} returned logits [{}, {}], expected [{}, {}] (its "
            "flagged rows, vocab)",
            engine, Name(), i, out[i].rows(), out[i].cols(), rows, vocab));
      }
    }
  }

  BackendInfo info_;
  std::shared_ptr<const format::ModelWeights> weights_;
  format::ScratchDir dir_;  // the model as the plugin reads it; lives as long as the engine
  std::unique_ptr<EngineT> engine_;
};

std::filesystem::path& EngineHostPath() {
  static std::filesystem::path host;
  return host;
}

// The executable that hosts isolated engines: $KVDIFF_ENGINE_HOST, else what SetEngineHost named
// (kvdiff's main names itself). Never a guess such as /proc/self/exe: a test binary started as
// `engine-host` would run its own tests instead.
std::filesystem::path EngineHost() {
  if (const char* env = std::getenv("KVDIFF_ENGINE_HOST"); env && *env) return env;
  KVDIFF_CHECK(!EngineHostPath().empty(),
               "isolated engine plugins need an engine host (a kvdiff executable): set "
               "KVDIFF_ENGINE_HOST, or run the plugin in process");
  return EngineHostPath();
}

// "key=value&key=value" (URL style, after the '?') as engine.h's "key=value,key=value". A key
// given twice is refused: the engine would take one of them and the tolerance profile maybe the
// other, as a JSON key given twice would be (`spec` names the backend in the message).
std::string EngineOptions(const std::string& spec, std::string query) {
  std::set<std::string> keys;
  for (size_t begin = 0; begin <= query.size();) {
    const size_t end = std::min(query.find('&', begin), query.size());
    const std::string item = query.substr(begin, end - begin);
    const std::string key = item.substr(0, item.find('='));
    KVDIFF_CHECK(item.empty() || keys.insert(key).second,
                 "backend '{}': option \"{}\" is given twice (expected each key at most once)",
                 spec, key);
    begin = end + 1;
  }
  for (char& c : query)
    if (c == '&') c = ',';
  return query;
}

BackendFactory PluginFactory(const std::filesystem::path& path, const std::string& options) {
  return
      [path, options](const BackendInfo& info, std::shared_ptr<const format::ModelWeights> weights,
                      const BackendOptions& backend_options) -> std::unique_ptr<Backend> {
        if (backend_options.isolate) {
          return std::make_unique<PluginBackend<engines::IsolatedEngine>>(
              info, std::move(weights), [&](const std::filesystem::path& dir) {
                return engines::IsolatedEngine::Start(
                    {EngineHost(), path, dir, options, backend_options.isolate_timeout_seconds});
              });
        }
        const engines::Plugin plugin = engines::Plugin::Load(path);
        return std::make_unique<PluginBackend<engines::Engine>>(
            info, std::move(weights),
            [&](const std::filesystem::path& dir) { return plugin.Open(dir, options); });
      };
}

}  // namespace

void SetEngineHost(const std::filesystem::path& executable) { EngineHostPath() = executable; }

std::pair<BackendInfo, BackendFactory> ResolveExecBackend(const std::string& spec) {
  const std::string rest = spec.substr(std::string(kExecPrefix).size());
  // The options start at the last '?', as for plugin: (a command keeps its own '?' before it).
  const size_t q = rest.rfind('?');
  const std::string command = rest.substr(0, q);
  KVDIFF_CHECK(command.find_first_not_of(" \t") != std::string::npos,
               "backend '{}': expected exec:COMMAND[?key=value&...], a command run by /bin/sh -c "
               "that speaks the kvdiff engine protocol on its stdin and stdout (docs/protocol.md)",
               spec);
  const std::string options = q == std::string::npos ? "" : EngineOptions(spec, rest.substr(q + 1));
  BackendInfo info;
  info.name = spec;
  info.description = fmt::format("engine program {}", command);
  info.dtype = "float32";  // the logits; the cache's dtype is the engine's to say
  info.raw_call = RawCall::kNone;
  BackendFactory make = [command, options](
                            const BackendInfo& info,
                            std::shared_ptr<const format::ModelWeights> weights,
                            const BackendOptions& backend_options) -> std::unique_ptr<Backend> {
    // A program is a process of its own: there is no in-process way to run it.
    KVDIFF_CHECK(backend_options.isolate,
                 "backend '{}': an engine program always runs in its own process; --in-process "
                 "applies to engine plugins only",
                 info.name);
    return std::make_unique<PluginBackend<engines::IsolatedEngine>>(
        info, std::move(weights),
        [&](const std::filesystem::path& dir) {
          return engines::IsolatedEngine::StartProgram(
              {command, dir, options, backend_options.isolate_timeout_seconds});
        },
        "engine program");
  };
  return {info, std::move(make)};
}

std::pair<BackendInfo, BackendFactory> ResolvePluginBackend(const std::string& spec) {
  const std::string rest = spec.substr(std::string(kPluginPrefix).size());
  const size_t q = rest.find('?');
  const std::filesystem::path path = rest.substr(0, q);
  KVDIFF_CHECK(!path.empty(), "backend '{}': expected plugin:PATH[?key=value&...]", spec);
  const std::string options = q == std::string::npos ? "" : EngineOptions(spec, rest.substr(q + 1));
  // Only the path is checked here (a FIFO would block dlopen, a directory is no plugin): loading
  // runs the plugin's code, which belongs to the process the options choose (the factory).
  format::CheckInputFile(path, "engine plugin");
  BackendInfo info;
  info.name = spec;
  info.description = fmt::format("engine plugin {}", path.string());
  info.dtype = "float32";  // the logits; the cache's dtype is the engine's to say
  info.raw_call = RawCall::kNone;
  // dlopen reads a name without a '/' as a library to search for, not as a file here: the plugin
  // is loaded by the path of the file that was checked (the engine host runs elsewhere, too).
  return {info, PluginFactory(std::filesystem::absolute(path), options)};
}

namespace {

// The compute dtype `options` ("k=v,k=v", in the order given) declare through
// KnownArithmetic::compute_dtype_by_option; "" for float32.
std::string ComputeDtypeOf(const std::string& options, const KnownArithmetic& known) {
  std::string dtype;
  for (size_t start = 0; start < options.size();) {
    const size_t comma = std::min(options.find(',', start), options.size());
    const std::string item = options.substr(start, comma - start);
    start = comma + 1;
    const std::string key = item.substr(0, item.find('='));
    bool key_known = false;
    std::string declared;
    for (const auto& [option, type] : known.compute_dtype_by_option) {
      if (option.substr(0, option.find('=')) != key) continue;
      key_known = true;
      if (option == item) declared = type;
    }
    if (key_known) dtype = declared;
  }
  return dtype;
}

}  // namespace

void RegisterNamedPlugin(BackendRegistry& registry, const std::string& name,
                         const std::string& description, const std::filesystem::path& path,
                         const std::string& options, const KnownArithmetic& known) {
  // NAME, and NAME?key=value&... with the options after the built-in ones (a key given overrides
  // a built-in one; a key given twice is refused by EngineOptions).
  // A plugin built with kvdiff knows the key "threads": unless one is given, it gets the
  // command's --threads, as every other backend does.
  auto entry = [name, description, path, options, known](const std::string& spec) {
    BackendInfo info;
    info.name = spec;
    info.description = description;
    info.dtype = "float32";
    info.rope_angles = known.rope_angles;
    info.overflows_on_demanding_models = known.overflows_on_demanding_models;
    info.shifts = known.shifts;
    info.raw_call = RawCall::kNone;
    const size_t q = spec.find('?');
    std::string all = options;
    if (q != std::string::npos) all += "," + EngineOptions(spec, spec.substr(q + 1));
    info.compute_dtype = ComputeDtypeOf(all, known);
    BackendFactory make = [path, all](const BackendInfo& info,
                                      std::shared_ptr<const format::ModelWeights> weights,
                                      const BackendOptions& backend_options) {
      std::string with_threads = all;
      if (backend_options.threads > 0 && ("," + all).find(",threads=") == std::string::npos) {
        with_threads += fmt::format(",threads={}", backend_options.threads);
      }
      return PluginFactory(path, with_threads)(info, std::move(weights), backend_options);
    };
    return std::pair<BackendInfo, BackendFactory>{std::move(info), std::move(make)};
  };
  auto [info, make] = entry(name);
  registry.Register(std::move(info), std::move(make));
  registry.RegisterFamily(name + "?", entry);
}

}  // namespace kvdiff::harness
