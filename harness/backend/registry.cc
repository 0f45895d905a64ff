#include "harness/backend/registry.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <utility>

#include "format/error.h"
#include "impl/thread_pool.h"

namespace kvdiff::harness {

BackendRegistry& BackendRegistry::Global() {
  static BackendRegistry* registry = [] {
    auto* r = new BackendRegistry();
    RegisterImplBackend(*r);
    r->RegisterFamily(kPluginPrefix, ResolvePluginBackend);
    r->RegisterFamily(kExecPrefix, ResolveExecBackend);
#ifdef KVDIFF_LLAMACPP_ENGINE_PATH
    // Flash attention off and an f32 cache: the settings held to the 1e-4 gate (docs/llama-cpp.md,
    // "Testing llama.cpp").
    RegisterNamedPlugin(
        *r, "llama.cpp", "llama.cpp through its C API, f32 KV cache", KVDIFF_LLAMACPP_ENGINE_PATH,
        "kv=f32,flash_attn=off",
        {// ggml's rope: theta = p · base^(-2i/d) in float
         "f32",
         // Measured: all-zero logits on tiny with --scale demanding (ref64's reach
         // 3e3), with kv=f32 and kv=f16 alike.
         "ggml's rms_norm squares each value in float32, which overflows to inf for "
         "hidden states of ~1e19 and normalizes them to 0",
         // llama_memory_seq_rm + llama_memory_seq_add (engines/llama_cpp/shift.h)
         true,
         // ggml's CPU matmul converts the activations to the weights' vec_dot type: bf16 for
         // bf16 weights, so every product's inputs are rounded to bf16 (measured against ref64
         // with the same bf16-valued weights: 2.1e-1, where weights=f32 stays within 1.2e-4)
         {{"weights=bf16", "bf16"}}});
#endif
#ifdef KVDIFF_HAVE_TORCH
    RegisterReferenceBackends(*r);
#else
    for (const char* name : {"ref", "ref64"}) {
      r->RegisterUnavailable(
          name,
          fmt::format("backend '{}' needs a build with LibTorch (KVDIFF_WITH_TORCH=ON)", name));
      // Their options ("ref?batch=no-position-ids") say the same, not "unknown backend".
      r->RegisterFamily(
          std::string(name) + "?",
          [](const std::string& spec) -> std::pair<BackendInfo, BackendFactory> {
            throw InputError(fmt::format(
                "backend '{}' needs a build with LibTorch (KVDIFF_WITH_TORCH=ON)", spec));
          });
    }
#endif
    return r;
  }();
  return *registry;
}

void BackendRegistry::Register(BackendInfo info, BackendFactory make) {
  KVDIFF_CHECK(!info.name.empty(), "a backend needs a name");
  KVDIFF_CHECK(Find(info.name) == nullptr, "backend '{}' is registered twice", info.name);
  entries_.push_back(Entry{std::move(info), std::move(make), ""});
}

void BackendRegistry::RegisterUnavailable(const std::string& name, const std::string& why) {
  KVDIFF_CHECK(Find(name) == nullptr, "backend '{}' is registered twice", name);
  Entry e;
  e.info.name = name;
  e.unavailable = why;
  entries_.push_back(std::move(e));
}

void BackendRegistry::RegisterFamily(const std::string& prefix, Resolver resolve) {
  families_.emplace_back(prefix, std::move(resolve));
}

const BackendRegistry::Entry* BackendRegistry::Find(const std::string& name) const {
  for (const Entry& e : entries_)
    if (e.info.name == name) return &e;
  for (const auto& e : resolved_)
    if (e->info.name == name) return e.get();
  return nullptr;
}

const BackendRegistry::Entry* BackendRegistry::Resolve(const std::string& name) const {
  if (const Entry* e = Find(name)) return e;
  for (const auto& [prefix, resolve] : families_) {
    if (name.rfind(prefix, 0) != 0) continue;
    auto [info, make] = resolve(name);
    resolved_.push_back(std::make_unique<Entry>(Entry{std::move(info), std::move(make), ""}));
    return resolved_.back().get();
  }
  return nullptr;
}

bool BackendRegistry::Has(const std::string& name) const {
  const Entry* e = Resolve(name);
  return e && e->unavailable.empty();
}

bool BackendRegistry::Knows(const std::string& name) const {
  if (Find(name)) return true;
  for (const auto& [prefix, resolve] : families_)
    if (name.rfind(prefix, 0) == 0) return true;
  return false;
}

const BackendInfo& BackendRegistry::Info(const std::string& name) const {
  const Entry* e = Resolve(name);
  if (!e) {
    throw InputError(fmt::format("unknown backend '{}' (available: {})", name, NamesText()));
  }
  if (!e->unavailable.empty()) {
    throw InputError(fmt::format("{}; this build has: {}", e->unavailable, NamesText()));
  }
  return e->info;
}

std::unique_ptr<Backend> BackendRegistry::Make(const std::string& name,
                                               std::shared_ptr<const format::ModelWeights> weights,
                                               const BackendOptions& options) const {
  const BackendInfo& info = Info(name);
  // Every backend, LibTorch's and the plugins' included, is held to the impl pool's bound.
  KVDIFF_CHECK(options.threads >= 0 && options.threads <= impl::kMaxThreads,
               "threads: expected 0 (every core) to {}, got {}", impl::kMaxThreads,
               options.threads);
  KVDIFF_CHECK(weights == nullptr || !weights->config.Windowed() || info.sliding_windows,
               "backend '{}' does not apply a sliding window, and this model has one "
               "(sliding_window {}): it would run a different model (sliding-window models run on "
               "impl, ref and ref64)",
               name, weights ? weights->config.sliding_window : 0);
  return Resolve(name)->make(info, std::move(weights), options);
}

std::vector<std::string> BackendRegistry::Names() const {
  std::vector<std::string> names;
  for (const Entry& e : entries_)
    if (e.unavailable.empty()) names.push_back(e.info.name);
  return names;
}

std::string BackendRegistry::NamesText() const {
  return fmt::format("{}", fmt::join(Names(), ", "));
}

std::vector<std::string> BackendRegistry::Defaults() const {
  std::vector<std::string> names;
  for (const Entry& e : entries_)
    if (e.unavailable.empty() && e.info.in_default_set) names.push_back(e.info.name);
  return names;
}

std::vector<std::string> BackendRegistry::ShiftingBackends() const {
  std::vector<std::string> names;
  for (const Entry& e : entries_)
    if (e.unavailable.empty() && e.info.shifts) names.push_back(e.info.name);
  return names;
}

const BackendRegistry::Entry* BackendRegistry::FindArbiter() const {
  for (const Entry& e : entries_)
    if (e.unavailable.empty() && e.info.dtype == "float64") return &e;
  return nullptr;
}

bool BackendRegistry::HasArbiter() const { return FindArbiter() != nullptr; }

std::string BackendRegistry::Arbiter() const {
  if (const Entry* e = FindArbiter()) return e->info.name;
  throw InputError(fmt::format(
      "no float64 backend in this build (available: {}); goldens are made with one, which needs "
      "a build with LibTorch",
      NamesText()));
}

std::string BackendRegistry::FirstWithRawCall(RawCall kind) const {
  for (const Entry& e : entries_)
    if (e.unavailable.empty() && e.info.raw_call == kind) return e.info.name;
  return "";
}

std::string BackendRegistry::HelpText() const {
  std::vector<std::string> parts;
  for (const Entry& e : entries_) {
    if (e.unavailable.empty())
      parts.push_back(fmt::format("{} ({})", e.info.name, e.info.description));
  }
  return fmt::format("{}", fmt::join(parts, ", "));
}

std::unique_ptr<Backend> MakeBackend(const std::string& name,
                                     std::shared_ptr<const format::ModelWeights> weights,
                                     int threads) {
  return BackendRegistry::Global().Make(name, std::move(weights), BackendOptions{threads});
}

std::vector<std::string> AvailableBackends() { return BackendRegistry::Global().Names(); }
std::vector<std::string> DefaultBackends() { return BackendRegistry::Global().Defaults(); }

}  // namespace kvdiff::harness
