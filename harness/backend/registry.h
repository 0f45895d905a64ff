// The backend registry: the one table of the backends this kvdiff can build. `--backends`, the
// default set, help texts, error messages and every capability question read it; a new backend
// is one class and one Register call (docs/engines.md, "Adding a backend").
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "format/model_files.h"
#include "harness/backend/backend.h"

namespace kvdiff::harness {

using BackendFactory = std::function<std::unique_ptr<Backend>(
    const BackendInfo& info, std::shared_ptr<const format::ModelWeights> weights,
    const BackendOptions& options)>;

class BackendRegistry {
 public:
  // The backends of this build: impl, and ref/ref64 when built with LibTorch.
  static BackendRegistry& Global();

  // InputError when the name is taken or empty.
  void Register(BackendInfo info, BackendFactory make);
  // Names that start with `prefix` ("plugin:") are resolved on first use by `resolve`, which
  // returns the backend's info and factory (or throws InputError).
  using Resolver = std::function<std::pair<BackendInfo, BackendFactory>(const std::string& name)>;
  void RegisterFamily(const std::string& prefix, Resolver resolve);
  // A backend this build knows of but cannot build; naming it is an InputError saying `why`.
  void RegisterUnavailable(const std::string& name, const std::string& why);

  bool Has(const std::string& name) const;    // registered and buildable here
  bool Knows(const std::string& name) const;  // registered, buildable here or not
  // InputError for an unknown or unavailable name, listing what is available.
  const BackendInfo& Info(const std::string& name) const;
  std::unique_ptr<Backend> Make(const std::string& name,
                                std::shared_ptr<const format::ModelWeights> weights,
                                const BackendOptions& options = {}) const;

  std::vector<std::string> Names() const;     // the buildable ones, in registration order
  std::string NamesText() const;              // "impl, ref, ref64"
  std::vector<std::string> Defaults() const;  // those with in_default_set
  // Those that can run shift steps (BackendInfo::shifts); named families such as impl? count as
  // their base name only.
  std::vector<std::string> ShiftingBackends() const;
  // The most precise backend (float64 before float32): what goldens are made with.
  // InputError when none computes in float64.
  std::string Arbiter() const;
  bool HasArbiter() const;  // whether Arbiter() has one to name
  // The first backend whose raw call is of this kind, or "" when none is.
  std::string FirstWithRawCall(RawCall kind) const;
  // "impl (Eigen, float32), ref (...), ..." for --help.
  std::string HelpText() const;

 private:
  struct Entry {
    BackendInfo info;
    BackendFactory make;
    std::string unavailable;  // not empty: why this build cannot make it
  };
  const Entry* Find(const std::string& name) const;
  const Entry* FindArbiter() const;  // nullptr when no buildable backend computes in float64
  // Resolves a family name into an entry, once; nullptr when no family claims the name.
  const Entry* Resolve(const std::string& name) const;
  std::vector<Entry> entries_;
  std::vector<std::pair<std::string, Resolver>> families_;
  mutable std::vector<std::unique_ptr<Entry>> resolved_;  // stable addresses
};

// Shorthands for the global registry.
std::unique_ptr<Backend> MakeBackend(const std::string& name,
                                     std::shared_ptr<const format::ModelWeights> weights,
                                     int threads = 0);
std::vector<std::string> AvailableBackends();
std::vector<std::string> DefaultBackends();

// Each backend family registers itself (impl_backend.cc, reference_backend.cc, plugin_backend.cc).
void RegisterImplBackend(BackendRegistry& registry);
void RegisterReferenceBackends(BackendRegistry& registry);
// Outside engines: "plugin:PATH[?key=value&...]" names any engine plugin (include/kvdiff/engine.h).
inline constexpr const char* kPluginPrefix = "plugin:";
std::pair<BackendInfo, BackendFactory> ResolvePluginBackend(const std::string& spec);
// Engine programs: "exec:COMMAND[?key=value&...]" runs COMMAND by /bin/sh -c and speaks the kvdiff
// engine protocol (docs/protocol.md) on its stdin and stdout; always in its own process.
inline constexpr const char* kExecPrefix = "exec:";
std::pair<BackendInfo, BackendFactory> ResolveExecBackend(const std::string& spec);
// The executable that serves isolated plugins (`kvdiff engine-host`): kvdiff's main sets itself;
// $KVDIFF_ENGINE_HOST overrides. Without either, an isolated plugin backend throws InputError.
void SetEngineHost(const std::filesystem::path& executable);
// A plugin built with kvdiff, registered under a plain name ("llama.cpp").
// What kvdiff knows of a named plugin's arithmetic beyond what its engine_info reports.
struct KnownArithmetic {
  std::string rope_angles;                    // BackendInfo::rope_angles
  std::string overflows_on_demanding_models;  // BackendInfo::overflows_on_demanding_models
  // BackendInfo::shifts before the engine is opened (what lists the backends that shift reads);
  // once opened, the engine's own answer replaces it.
  bool shifts = false;
  // Options of the engine that make it compute in a narrower type, and that type
  // (BackendInfo::compute_dtype), e.g. {"weights=bf16", "bf16"}: the engine's own options are the
  // declaration (engine_info has no field for it, and adding one is an ABI version). Another
  // value of the same key (weights=f32) declares float32 again; the last one given wins.
  std::vector<std::pair<std::string, std::string>> compute_dtype_by_option;
};
void RegisterNamedPlugin(BackendRegistry& registry, const std::string& name,
                         const std::string& description, const std::filesystem::path& path,
                         const std::string& options, const KnownArithmetic& known = {});

}  // namespace kvdiff::harness
