// The backend registry: the one table of the backends this kvdiff can build. `--backends`, the
// default set, help texts, error messages and every capability question read it; a new backend
// is one class and one Register call (see the README's "Adding a backend").
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "format/model_files.h"
#include "harness/backend.h"

namespace kvdiff::harness {

struct BackendOptions {
  int threads = 0;  // 0: every core
};

using BackendFactory = std::function<std::unique_ptr<Backend>(
    const BackendInfo& info, std::shared_ptr<const format::ModelWeights> weights,
    const BackendOptions& options)>;

class BackendRegistry {
 public:
  // The backends of this build: impl, and ref/ref64 when built with LibTorch.
  static BackendRegistry& Global();

  // InputError when the name is taken or empty.
  void Register(BackendInfo info, BackendFactory make);
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
  // The most precise backend (float64 before float32): what goldens are made with.
  // InputError when none computes in float64.
  std::string Arbiter() const;
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
  std::vector<Entry> entries_;
};

// Shorthands for the global registry.
std::unique_ptr<Backend> MakeBackend(const std::string& name,
                                     std::shared_ptr<const format::ModelWeights> weights,
                                     int threads = 0);
std::vector<std::string> AvailableBackends();
std::vector<std::string> DefaultBackends();

// Each backend family registers itself (impl_backend.cc, reference_backend.cc).
void RegisterImplBackend(BackendRegistry& registry);
void RegisterReferenceBackends(BackendRegistry& registry);

}  // namespace kvdiff::harness
