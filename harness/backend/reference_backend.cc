// The LibTorch backends ("ref" float32, "ref64" float64): a ReferenceModel behind the Backend
// interface. A session is what a transformers user holds between calls: the model and one
// DynamicCache; the raw call is model(input_ids, past_key_values=cache), which reads the position
// from the cache. Compiled only with KVDIFF_WITH_TORCH; it includes reference/'s torch-free header.
#include <utility>

#include "format/error.h"
#include "harness/backend/model_backend.h"
#include "harness/backend/registry.h"
#include "reference/reference_model.h"

namespace kvdiff::harness {
namespace {

// A transformers user's session is the model and one DynamicCache, which is also the raw call's
// cache: model(input_ids, past_key_values=cache) reads the position from the cache length.
struct ReferenceOps {
  using Model = ref::ReferenceModel;
  using Session = ref::DynamicCache;
  using Cache = ref::DynamicCache;
  static Session NewSession(const Model&) { return ref::DynamicCache(); }
  static Logits Append(const Model& model, Session& cache, const Tokens& tokens,
                       ForwardTrace* trace) {
    return model.Forward(tokens, cache, trace);
  }
  static void Truncate(Session& cache, int64_t length) { cache.Crop(length); }
  static void Reset(Session& cache) { cache.Reset(); }
  static Cache NewCache(const Model&) { return ref::DynamicCache(); }
  static int64_t Length(const Cache& cache) { return cache.GetSeqLength(); }
  static void Crop(Cache& cache, int64_t length) { cache.Crop(length); }
  static void Clear(Cache& cache) { cache.Reset(); }
  static Cache Fork(const Cache& cache) { return cache.Fork(); }
  // transformers takes no position: index_pos is ignored, as RawCall::kPositionFromCache says.
  static Logits Forward(const Model& model, const Tokens& tokens, int64_t /*index_pos*/,
                        Cache& cache, ForwardTrace* trace) {
    return model.Forward(tokens, cache, trace);
  }
  // No batched forward yet: Backend::AppendBatch runs the items one after another.
  static constexpr bool kBatched = false;
  static std::vector<Logits> AppendBatch(const Model&, const std::vector<Session*>&,
                                         const std::vector<BatchItem>&) {
    return {};
  }
};
using ReferenceBackend = ModelBackend<ReferenceOps>;

}  // namespace

void RegisterReferenceBackends(BackendRegistry& registry) {
  struct Variant {
    const char* name;
    const char* description;
    const char* dtype;
    ref::Precision precision;
    bool in_default_set;
    const char* rope_angles;  // transformers' float32 angles in ref; float64 in ref64
  };
  const Variant variants[] = {
      {"ref", "LibTorch, float32, transformers' semantics", "float32", ref::Precision::kFloat32,
       true, "f32"},
      {"ref64", "LibTorch, float64 throughout: the arbiter", "float64", ref::Precision::kFloat64,
       false, ""},
  };
  for (const Variant& v : variants) {
    BackendInfo info;
    info.name = v.name;
    info.description = v.description;
    info.dtype = v.dtype;
    info.raw_call = RawCall::kPositionFromCache;
    info.in_default_set = v.in_default_set;
    info.rope_angles = v.rope_angles;
    info.gemms_in_blas = true;
    if (v.precision == ref::Precision::kFloat32) {
      // Measured: on tiny with --scale demanding, ref's logits are all 0 (ref64's reach 3e3).
      info.overflows_on_demanding_models =
          "transformers' LlamaRMSNorm squares the hidden state in float32, which overflows to inf "
          "for hidden states of ~1e19 and normalizes them to 0, as transformers itself does";
    }
    const ref::Precision precision = v.precision;
    registry.Register(std::move(info), [precision](const BackendInfo& info,
                                                   std::shared_ptr<const format::ModelWeights> w,
                                                   const BackendOptions& options) {
      return std::make_unique<ReferenceBackend>(
          info,
          std::make_shared<const ref::ReferenceModel>(std::move(w), precision, options.threads));
    });
  }
}

}  // namespace kvdiff::harness
