// The Eigen backend ("impl"): impl::Model behind the Backend interface. Its session is
// impl::Session (the checked API); its raw call is impl::Model::Forward(tokens, index_pos, cache),
// candle's llama.rs semantics, on the same model (no second copy of the weights).
#include <fmt/format.h>

#include <string>
#include <utility>

#include "format/error.h"
#include "harness/backend/registry.h"
#include "impl/kernels.h"
#include "impl/kv_cache.h"
#include "impl/model.h"
#include "impl/session.h"

namespace kvdiff::harness {
namespace {

class ImplSession : public BackendSession {
 public:
  // The session keeps its model alive: a session may outlive the backend that made it.
  ImplSession(std::shared_ptr<const impl::Model> model, impl::Session session)
      : model_(std::move(model)), session_(std::move(session)) {}

  Logits Append(const Tokens& tokens, ForwardTrace* trace) override {
    return session_.Append(tokens, trace);
  }
  int64_t Length() const override { return session_.Length(); }
  void Truncate(int64_t length) override { session_.Truncate(length); }
  std::unique_ptr<BackendSession> Fork() const override {
    return std::make_unique<ImplSession>(model_, session_.Fork());
  }
  void Reset() override { session_.Reset(); }

 private:
  std::shared_ptr<const impl::Model> model_;
  impl::Session session_;
};

class ImplRawCache : public RawCache {
 public:
  explicit ImplRawCache(impl::KvCache cache) : cache_(std::move(cache)) {}
  int64_t Length() const override { return cache_.Length(); }
  void Crop(int64_t length) override { cache_.SetLength(length); }
  void Clear() override { cache_.Clear(); }
  std::unique_ptr<RawCache> Fork() const override {
    return std::make_unique<ImplRawCache>(cache_.Fork());
  }
  impl::KvCache& cache() { return cache_; }

 private:
  impl::KvCache cache_;
};

class ImplRawModel : public RawModel {
 public:
  explicit ImplRawModel(const impl::Model& model) : model_(model) {}
  std::unique_ptr<RawCache> NewCache() const override {
    return std::make_unique<ImplRawCache>(model_.NewCache());
  }
  Logits Forward(const Tokens& tokens, int64_t index_pos, RawCache& cache,
                 ForwardTrace* trace) const override {
    // Every cache this model hands out is an ImplRawCache; the drivers never mix backends.
    return model_.Forward(tokens, index_pos, static_cast<ImplRawCache&>(cache).cache(), trace);
  }

 private:
  const impl::Model& model_;
};

class ImplBackend : public Backend {
 public:
  ImplBackend(BackendInfo info, std::shared_ptr<const impl::Model> model)
      : info_(std::move(info)), model_(std::move(model)), raw_(*model_) {}

  const BackendInfo& Info() const override { return info_; }
  const format::LlamaConfig& config() const override { return model_->config(); }
  Logits ForwardFull(const Tokens& tokens, ForwardTrace* trace) const override {
    return model_->ForwardFull(tokens, trace);
  }
  std::unique_ptr<BackendSession> NewSession() const override {
    return std::make_unique<ImplSession>(model_, model_->NewSession());
  }
  const RawModel* Raw() const override { return &raw_; }

 private:
  BackendInfo info_;
  std::shared_ptr<const impl::Model> model_;
  ImplRawModel raw_;
};

}  // namespace

namespace {

// "impl" and "impl?weights=auto|f32": how the model keeps its matrices (impl::WeightStorage).
impl::WeightStorage ParseImplOptions(const std::string& name) {
  const size_t q = name.find('?');
  if (q == std::string::npos) return impl::WeightStorage::kAuto;
  const std::string option = name.substr(q + 1);
  if (option == "weights=auto") return impl::WeightStorage::kAuto;
  if (option == "weights=f32") return impl::WeightStorage::kF32;
  throw InputError(fmt::format(
      "backend '{}': expected impl?weights=auto or impl?weights=f32, found option '{}'", name,
      option));
}

std::pair<BackendInfo, BackendFactory> ImplEntry(const std::string& name) {
  const impl::WeightStorage storage = ParseImplOptions(name);
  BackendInfo info;
  info.name = name;
  info.description = storage == impl::WeightStorage::kF32
                         ? "Eigen, float32, kvdiff's own, weights widened to float32 at load"
                         : "Eigen, float32, kvdiff's own";
  info.dtype = "float32";
  info.raw_call = RawCall::kTakesPosition;
  info.in_default_set = name == "impl";
  // Where impl's kernels change path: LinearRows up to kLinearRowsMax rows, then the GEMM;
  // attention in query tiles of kAttentionQueryTile rows.
  info.interesting_sizes = {impl::kLinearRowsMax, impl::kAttentionQueryTile};
  BackendFactory make = [storage](const BackendInfo& info,
                                  std::shared_ptr<const format::ModelWeights> weights,
                                  const BackendOptions& options) -> std::unique_ptr<Backend> {
    return std::make_unique<ImplBackend>(
        info, std::make_shared<const impl::Model>(std::move(weights), options.threads, storage));
  };
  return {std::move(info), std::move(make)};
}

}  // namespace

void RegisterImplBackend(BackendRegistry& registry) {
  // impl keeps a bf16/f16 checkpoint's matrices in 16 bits (bit-identical logits, half the bytes);
  // impl?weights=f32 widens them at load.
  auto [info, make] = ImplEntry("impl");
  registry.Register(std::move(info), std::move(make));
  registry.RegisterFamily("impl?", ImplEntry);
}

}  // namespace kvdiff::harness
