// The LibTorch backends ("ref" float32, "ref64" float64): the reference behind the Backend
// interface. A session is what a transformers user holds between calls: the model and one
// DynamicCache; the raw call is model(input_ids, past_key_values=cache), which reads the position
// from the cache; a batched call is one forward of a left-padded batch with an attention mask and
// per-row position_ids (ReferenceModel::ForwardBatch). Compiled only with KVDIFF_WITH_TORCH. The
// reference itself is the module kvdiff_reference_module, loaded when the first ref or ref64
// backend is built (reference/reference_module.h says why); this file sees its torch-free header.
#include <dlfcn.h>
#include <fmt/format.h>

#include <filesystem>
#include <mutex>
#include <string>
#include <utility>

#include "format/error.h"
#include "harness/backend/model_backend.h"
#include "harness/backend/registry.h"
#include "reference/reference_module.h"

namespace kvdiff::harness {
namespace {

// Where the module is: installed (cmake --install, the .deb) beside the installed executable, in
// <prefix>/<libdir>/kvdiff/ (cmake/Packaging.cmake); else where this build tree made it.
std::string ReferenceModulePath() {
  std::error_code error;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", error);
  if (!error) {
    const std::filesystem::path installed = exe.parent_path().parent_path() /
                                            KVDIFF_INSTALL_LIBDIR / "kvdiff" /
                                            KVDIFF_REFERENCE_MODULE_FILE;
    if (std::filesystem::exists(installed, error)) return installed.string();
  }
  return KVDIFF_REFERENCE_MODULE_PATH;
}

// The module's entry, loaded once per process on first use and never unloaded (the logits,
// errors and caches it made may outlive any one backend). A module that cannot be loaded is an
// installation fault, reported as bad input: exit 2, naming the file and what dlopen said.
ref::MakeModuleModel ReferenceModule() {
  static std::once_flag once;
  static ref::MakeModuleModel make = nullptr;
  static std::string error;
  std::call_once(once, [] {
    const std::string path = ReferenceModulePath();
    void* module = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (module == nullptr) {
      error = fmt::format("cannot load the LibTorch reference module that ref and ref64 need: {}",
                          ::dlerror());
      return;
    }
    using Entry = ref::MakeModuleModel (*)();
    auto* entry = reinterpret_cast<Entry>(::dlsym(module, ref::kKvdiffReferenceEntry));
    if (entry == nullptr) {
      error = fmt::format("the LibTorch reference module {} has no {}: it is of another kvdiff",
                          path, ref::kKvdiffReferenceEntry);
      return;
    }
    make = entry();
  });
  if (make == nullptr) throw InputError(error);
  return make;
}

// The reference as a transformers user drives it: the model, and how that user's batched calls
// make position_ids (right, or not at all: `ref?batch=no-position-ids`).
struct ReferenceUser {
  std::unique_ptr<ref::ModuleModel> model;
  ref::BatchPositions batch_positions;

  const format::LlamaConfig& config() const { return model->config(); }
  Logits ForwardFull(const Tokens& tokens, ForwardTrace* trace) const {
    return model->ForwardFull(tokens, trace);
  }
};

// A transformers user's session is the model and one DynamicCache, which is also the raw call's
// cache: model(input_ids, past_key_values=cache) reads the position from the cache length.
struct ReferenceOps {
  using Model = ReferenceUser;
  using Session = std::unique_ptr<ref::ModuleCache>;
  using Cache = std::unique_ptr<ref::ModuleCache>;
  static Session NewSession(const Model& user) { return user.model->NewCache(); }
  static Logits Append(const Model& user, Session& cache, const Tokens& tokens,
                       ForwardTrace* trace) {
    return user.model->Forward(tokens, *cache, trace);
  }
  static void Truncate(Session& cache, int64_t length) { cache->Crop(length); }
  static void Reset(Session& cache) { cache->Reset(); }
  static void Shift(const Model& user, Session& cache, int64_t keep, int64_t discard) {
    user.model->Shift(*cache, keep, discard);
  }
  static Cache NewCache(const Model& user) { return user.model->NewCache(); }
  static int64_t Length(const Cache& cache) { return cache->GetSeqLength(); }
  static void Crop(Cache& cache, int64_t length) { cache->Crop(length); }
  static void Clear(Cache& cache) { cache->Reset(); }
  static Cache Fork(const Cache& cache) { return cache->Fork(); }
  // transformers takes no position: index_pos is ignored, as RawCall::kPositionFromCache says.
  static Logits Forward(const Model& user, const Tokens& tokens, int64_t /*index_pos*/,
                        Cache& cache, ForwardTrace* trace) {
    return user.model->Forward(tokens, *cache, trace);
  }
  // transformers' padded batch: the items' caches and tokens left-padded, one forward.
  static constexpr bool kBatched = true;
  static std::vector<Logits> AppendBatch(const Model& user, const std::vector<Session*>& caches,
                                         const std::vector<BatchItem>& items) {
    std::vector<ref::ModuleBatchPart> parts;
    for (size_t i = 0; i < items.size(); ++i) {
      parts.push_back({caches[i]->get(), &items[i].tokens, items[i].output});
    }
    return user.model->ForwardBatch(parts, user.batch_positions);
  }
};
using ReferenceBackend = ModelBackend<ReferenceOps>;

struct Variant {
  const char* name;
  const char* description;
  const char* dtype;
  ref::Precision precision;
  bool in_default_set;
  const char* rope_angles;  // transformers' float32 angles in ref; float64 in ref64
};

constexpr Variant kVariants[] = {
    {"ref", "LibTorch, float32, transformers' semantics", "float32", ref::Precision::kFloat32, true,
     "f32"},
    {"ref64", "LibTorch, float64 throughout: the arbiter", "float64", ref::Precision::kFloat64,
     false, ""},
};

// "ref", "ref?batch=position-ids" (the same) and "ref?batch=no-position-ids"; likewise ref64.
ref::BatchPositions ParseReferenceOptions(const Variant& v, const std::string& name) {
  const size_t q = name.find('?');
  if (q == std::string::npos) return ref::BatchPositions::kFromAttentionMask;
  const std::string option = name.substr(q + 1);
  if (option == "batch=position-ids") return ref::BatchPositions::kFromAttentionMask;
  if (option == "batch=no-position-ids") return ref::BatchPositions::kCachePosition;
  throw InputError(fmt::format(
      "backend '{}': expected {}?batch=position-ids or {}?batch=no-position-ids, found option '{}'",
      name, v.name, v.name, option));
}

std::pair<BackendInfo, BackendFactory> ReferenceEntry(const Variant& v, const std::string& name) {
  const ref::BatchPositions positions = ParseReferenceOptions(v, name);
  BackendInfo info;
  info.name = name;
  info.description = v.description;
  if (positions == ref::BatchPositions::kCachePosition) {
    info.description += "; batched calls pass no position_ids (a user bug, reproduced)";
  }
  info.dtype = v.dtype;
  info.raw_call = RawCall::kPositionFromCache;
  info.shifts = true;
  info.sliding_windows = true;
  info.in_default_set = v.in_default_set && name == v.name;
  info.rope_angles = v.rope_angles;
  info.gemms_in_blas = true;
  if (v.precision == ref::Precision::kFloat32) {
    // Measured: on tiny with --scale demanding, ref's logits are all 0 (ref64's reach 3e3).
    info.overflows_on_demanding_models =
        "transformers' LlamaRMSNorm squares the hidden state in float32, which overflows to inf "
        "for hidden states of ~1e19 and normalizes them to 0, as transformers itself does";
  }
  const ref::Precision precision = v.precision;
  BackendFactory make = [precision, positions](const BackendInfo& info,
                                               std::shared_ptr<const format::ModelWeights> w,
                                               const BackendOptions& options) {
    return std::make_unique<ReferenceBackend>(
        info, std::make_shared<const ReferenceUser>(ReferenceUser{
                  ReferenceModule()(std::move(w), precision, options.threads), positions}));
  };
  return {std::move(info), std::move(make)};
}

}  // namespace

void RegisterReferenceBackends(BackendRegistry& registry) {
  for (const Variant& v : kVariants) {
    auto [info, make] = ReferenceEntry(v, v.name);
    registry.Register(std::move(info), std::move(make));
    registry.RegisterFamily(std::string(v.name) + "?",
                            [&v](const std::string& name) { return ReferenceEntry(v, name); });
  }
}

}  // namespace kvdiff::harness
