// The LibTorch backends ("ref" float32, "ref64" float64): a ReferenceModel behind the Backend
// interface. A session is what a transformers user holds between calls: the model and one
// DynamicCache; the raw call is model(input_ids, past_key_values=cache), which reads the position
// from the cache. Compiled only with KVDIFF_WITH_TORCH; it includes reference/'s torch-free header.
#include "harness/backend/registry.h"

#include <utility>

#include "format/error.h"
#include "reference/reference_model.h"

namespace kvdiff::harness {
namespace {

class ReferenceSession : public BackendSession {
 public:
  ReferenceSession(std::shared_ptr<const ref::ReferenceModel> model, ref::DynamicCache cache)
      : model_(std::move(model)), cache_(std::move(cache)) {}

  // model(input_ids, past_key_values=cache): positions come from the cache length.
  Logits Append(const Tokens& tokens, ForwardTrace* trace) override {
    return model_->Forward(tokens, cache_, trace);
  }
  int64_t Length() const override { return cache_.GetSeqLength(); }
  void Truncate(int64_t length) override { cache_.Crop(length); }
  std::unique_ptr<BackendSession> Fork() const override {
    return std::make_unique<ReferenceSession>(model_, cache_.Fork());
  }
  void Reset() override { cache_.Reset(); }

 private:
  std::shared_ptr<const ref::ReferenceModel> model_;  // shared: a session may outlive its backend
  ref::DynamicCache cache_;
};

class ReferenceRawCache : public RawCache {
 public:
  explicit ReferenceRawCache(ref::DynamicCache cache) : cache_(std::move(cache)) {}
  int64_t Length() const override { return cache_.GetSeqLength(); }
  void Crop(int64_t length) override { cache_.Crop(length); }
  void Clear() override { cache_.Reset(); }
  std::unique_ptr<RawCache> Fork() const override {
    return std::make_unique<ReferenceRawCache>(cache_.Fork());
  }
  ref::DynamicCache& cache() { return cache_; }

 private:
  ref::DynamicCache cache_;
};

class ReferenceRawModel : public RawModel {
 public:
  explicit ReferenceRawModel(const ref::ReferenceModel& model) : model_(model) {}
  std::unique_ptr<RawCache> NewCache() const override {
    return std::make_unique<ReferenceRawCache>(ref::DynamicCache());
  }
  // transformers takes no position: index_pos is ignored, as RawCall::kPositionFromCache says.
  Logits Forward(const Tokens& tokens, int64_t /*index_pos*/, RawCache& cache,
                 ForwardTrace* trace) const override {
    return model_.Forward(tokens, static_cast<ReferenceRawCache&>(cache).cache(), trace);
  }

 private:
  const ref::ReferenceModel& model_;
};

class ReferenceBackend : public Backend {
 public:
  ReferenceBackend(BackendInfo info, std::shared_ptr<const ref::ReferenceModel> model)
      : info_(std::move(info)), model_(std::move(model)), raw_(*model_) {}

  const BackendInfo& Info() const override { return info_; }
  const format::LlamaConfig& config() const override { return model_->config(); }
  Logits ForwardFull(const Tokens& tokens, ForwardTrace* trace) const override {
    return model_->ForwardFull(tokens, trace);
  }
  std::unique_ptr<BackendSession> NewSession() const override {
    return std::make_unique<ReferenceSession>(model_, ref::DynamicCache());
  }
  const RawModel* Raw() const override { return &raw_; }

 private:
  BackendInfo info_;
  std::shared_ptr<const ref::ReferenceModel> model_;
  ReferenceRawModel raw_;
};

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
          info, std::make_shared<const ref::ReferenceModel>(std::move(w), precision,
                                                            options.threads));
    });
  }
}

}  // namespace kvdiff::harness
