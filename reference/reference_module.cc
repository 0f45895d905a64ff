// The module's side of reference_module.h: ReferenceModel and DynamicCache behind its interfaces,
// and the one exported entry point. Everything else in the module stays hidden
// (reference/CMakeLists.txt links it with --exclude-libs and hidden visibility).
#include "reference/reference_module.h"

#include <memory>
#include <utility>
#include <vector>

#include "format/error.h"

namespace kvdiff::ref {
namespace {

class Cache final : public ModuleCache {
 public:
  explicit Cache(DynamicCache cache) : cache_(std::move(cache)) {}
  int64_t GetSeqLength() const override { return cache_.GetSeqLength(); }
  void Crop(int64_t length) override { cache_.Crop(length); }
  void Reset() override { cache_.Reset(); }
  std::unique_ptr<ModuleCache> Fork() const override {
    return std::make_unique<Cache>(cache_.Fork());
  }
  DynamicCache& get() { return cache_; }

 private:
  DynamicCache cache_;
};

DynamicCache& Own(ModuleCache& cache) {
  auto* own = dynamic_cast<Cache*>(&cache);
  KVDIFF_CHECK(own != nullptr, "the reference was given a cache that it did not make");
  return own->get();
}

class Model final : public ModuleModel {
 public:
  explicit Model(ReferenceModel model) : model_(std::move(model)) {}
  const format::LlamaConfig& config() const override { return model_.config(); }
  std::unique_ptr<ModuleCache> NewCache() const override {
    return std::make_unique<Cache>(DynamicCache());
  }
  Logits ForwardFull(const Tokens& tokens, ForwardTrace* trace) const override {
    return model_.ForwardFull(tokens, trace);
  }
  Logits Forward(const Tokens& tokens, ModuleCache& cache, ForwardTrace* trace) const override {
    return model_.Forward(tokens, Own(cache), trace);
  }
  std::vector<Logits> ForwardBatch(const std::vector<ModuleBatchPart>& parts,
                                   BatchPositions positions) const override {
    std::vector<BatchPart> own;
    own.reserve(parts.size());
    for (const ModuleBatchPart& p : parts) {
      own.push_back({p.cache ? &Own(*p.cache) : nullptr, p.tokens, p.output});
    }
    return model_.ForwardBatch(own, positions);
  }
  void Shift(ModuleCache& cache, int64_t keep, int64_t discard) const override {
    model_.Shift(Own(cache), keep, discard);
  }

 private:
  ReferenceModel model_;
};

std::unique_ptr<ModuleModel> MakeModel(std::shared_ptr<const format::ModelWeights> weights,
                                       Precision precision, int threads) {
  return std::make_unique<Model>(ReferenceModel(std::move(weights), precision, threads));
}

}  // namespace
}  // namespace kvdiff::ref

// The entry point reference_module.h names (kKvdiffReferenceEntry); its type is MakeModuleModel.
extern "C" __attribute__((visibility("default"))) kvdiff::ref::MakeModuleModel
kvdiff_reference_make_model_v1() {
  return &kvdiff::ref::MakeModel;
}
