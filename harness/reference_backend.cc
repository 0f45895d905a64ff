// The LibTorch backends: a ReferenceModel behind the Backend interface. A session is what a
// transformers user holds between calls: the model and one DynamicCache.
#include "harness/reference_backend.h"

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

class ReferenceBackend : public Backend {
 public:
  ReferenceBackend(std::string name, std::shared_ptr<const ref::ReferenceModel> model)
      : name_(std::move(name)), model_(std::move(model)) {}

  std::string Name() const override { return name_; }
  const format::LlamaConfig& config() const override { return model_->config(); }
  Logits ForwardFull(const Tokens& tokens, ForwardTrace* trace) const override {
    return model_->ForwardFull(tokens, trace);
  }
  std::unique_ptr<BackendSession> NewSession() const override {
    return std::make_unique<ReferenceSession>(model_, ref::DynamicCache());
  }

 private:
  std::string name_;
  std::shared_ptr<const ref::ReferenceModel> model_;
};

}  // namespace

std::unique_ptr<Backend> MakeReferenceBackend(const std::string& name,
                                              std::shared_ptr<const format::ModelWeights> weights,
                                              int threads) {
  KVDIFF_CHECK(name == "ref" || name == "ref64",
               "unknown reference backend \"{}\" (expected \"ref\" or \"ref64\")", name);
  const ref::Precision precision =
      name == "ref64" ? ref::Precision::kFloat64 : ref::Precision::kFloat32;
  auto model = std::make_shared<const ref::ReferenceModel>(std::move(weights), precision, threads);
  return std::make_unique<ReferenceBackend>(name, std::move(model));
}

}  // namespace kvdiff::harness
