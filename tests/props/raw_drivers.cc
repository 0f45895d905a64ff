#include "tests/props/raw_drivers.h"

#include "format/error.h"
#include "impl/kv_cache.h"
#include "impl/model.h"

namespace kvdiff::props {

std::string DriverFaultName(DriverFault fault) {
  switch (fault) {
    case DriverFault::kNone:
      return "none";
    case DriverFault::kPos0:
      return "pos0";
    case DriverFault::kReuse:
      return "reuse";
    case DriverFault::kPosOffByOne:
      return "position-off-by-one";
    case DriverFault::kTruncateKeepsPosition:
      return "truncate-keeps-position";
  }
  return "?";
}

namespace {

class RawSession : public harness::BackendSession {
 public:
  RawSession(const impl::Model* model, DriverFault fault, std::shared_ptr<impl::KvCache> cache,
             int64_t position)
      : model_(model), fault_(fault), cache_(std::move(cache)), position_(position) {}

  Logits Append(const Tokens& tokens, ForwardTrace* /*trace*/) override {
    int64_t index_pos = position_;
    if (fault_ == DriverFault::kPos0) index_pos = 0;
    if (fault_ == DriverFault::kPosOffByOne && position_ > 0) index_pos = position_ + 1;
    const int64_t n = static_cast<int64_t>(tokens.size());
    // The raw call is unchecked; refuse here rather than let a faulty caller run past the
    // buffers (an exception is a failure the properties report like any other).
    KVDIFF_CHECK(cache_->Length() + n <= cache_->Capacity(),
                 "raw driver: cache length {} + {} exceeds its capacity {}", cache_->Length(), n,
                 cache_->Capacity());
    KVDIFF_CHECK(index_pos + n <= model_->config().max_position_embeddings,
                 "raw driver: index_pos {} + {} exceeds max_position_embeddings {}", index_pos, n,
                 model_->config().max_position_embeddings);
    Logits logits = model_->Forward(tokens, index_pos, *cache_);
    position_ += n;
    return logits;
  }
  int64_t Length() const override { return cache_->Length(); }
  void Truncate(int64_t length) override {
    KVDIFF_CHECK(length >= 0 && length <= cache_->Length(), "Truncate: length {} outside [0, {}]",
                 length, cache_->Length());
    cache_->SetLength(length);
    if (fault_ != DriverFault::kTruncateKeepsPosition) position_ = length;
  }
  std::unique_ptr<harness::BackendSession> Fork() const override {
    return std::make_unique<RawSession>(model_, fault_,
                                        std::make_shared<impl::KvCache>(cache_->Fork()), position_);
  }
  void Reset() override {
    if (fault_ != DriverFault::kReuse) cache_->Clear();
    position_ = 0;
  }

 private:
  const impl::Model* model_;
  DriverFault fault_;
  std::shared_ptr<impl::KvCache> cache_;
  int64_t position_;  // the caller's own running position
};

class RawDriverBackend : public harness::Backend {
 public:
  RawDriverBackend(std::shared_ptr<const format::ModelWeights> weights, DriverFault fault)
      : model_(std::move(weights), /*threads=*/1), fault_(fault) {
    if (fault_ == DriverFault::kReuse) shared_cache_ = NewCache();
    info_.name = "raw:" + DriverFaultName(fault_);
    info_.description = "impl's raw call driven by a faulty caller";
    info_.dtype = "float32";
  }
  const harness::BackendInfo& Info() const override { return info_; }
  const format::LlamaConfig& config() const override { return model_.config(); }
  Logits ForwardFull(const Tokens& tokens, ForwardTrace* trace) const override {
    return model_.ForwardFull(tokens, trace);
  }
  std::unique_ptr<harness::BackendSession> NewSession() const override {
    return std::make_unique<RawSession>(&model_, fault_, shared_cache_ ? shared_cache_ : NewCache(),
                                        0);
  }

 private:
  // Room for several conversations: the reuse fault keeps appending to one cache.
  std::shared_ptr<impl::KvCache> NewCache() const {
    return std::make_shared<impl::KvCache>(
        model_.NewCache(4 * model_.config().max_position_embeddings));
  }
  impl::Model model_;
  DriverFault fault_;
  harness::BackendInfo info_;
  std::shared_ptr<impl::KvCache> shared_cache_;
};

}  // namespace

std::unique_ptr<harness::Backend> MakeRawDriverBackend(
    std::shared_ptr<const format::ModelWeights> weights, DriverFault fault) {
  return std::make_unique<RawDriverBackend>(std::move(weights), fault);
}

}  // namespace kvdiff::props
