#include "harness/drivers.h"

#include <fmt/format.h>

#include <map>

#include "format/error.h"
#include "impl/kv_cache.h"
#include "impl/model.h"
#ifdef KVDIFF_HAVE_TORCH
#include "reference/reference_model.h"
#endif

namespace kvdiff::harness {
namespace {

// The checked API: one BackendSession per conversation.
class SessionDriver : public Driver {
 public:
  explicit SessionDriver(const Backend& backend) : backend_(backend) { NewConversation("main"); }
  void NewConversation(const std::string& name) override {
    sessions_[name] = backend_.NewSession();
  }
  Logits Append(const std::string& conv, const Tokens& tokens, ForwardTrace* trace) override {
    return sessions_.at(conv)->Append(tokens, trace);
  }
  void Truncate(const std::string& conv, int64_t length) override {
    sessions_.at(conv)->Truncate(length);
  }
  void Fork(const std::string& from, const std::string& to) override {
    sessions_[to] = sessions_.at(from)->Fork();
  }
  void Reset(const std::string& conv) override { sessions_.at(conv)->Reset(); }

 private:
  const Backend& backend_;
  std::map<std::string, std::unique_ptr<BackendSession>> sessions_;
};

// candle llama.rs on impl's raw call. The caller tracks index_pos (or, for pos0, doesn't).
// Caches are shared_ptr because `reuse` hands one cache to several conversations.
class ImplRawDriver : public Driver {
 public:
  ImplRawDriver(DriverKind kind, std::shared_ptr<const format::ModelWeights> weights, int threads)
      : kind_(kind), model_(std::move(weights), threads) {
    NewConversation("main");
  }
  void NewConversation(const std::string& name) override {
    Conv conv;
    if (kind_ == DriverKind::kReuse && last_) {
      conv.cache = last_;  // the seed's bug: the previous conversation's cache, index_pos from 0
    } else {
      conv.cache = std::make_shared<impl::KvCache>(model_.NewCache());
    }
    convs_[name] = conv;
    last_ = conv.cache;
  }
  Logits Append(const std::string& name, const Tokens& tokens, ForwardTrace* trace) override {
    Conv& conv = convs_.at(name);
    last_ = conv.cache;
    // pos0: the seed's loop never passes a position (right for the first call only).
    const int64_t index_pos = kind_ == DriverKind::kPos0 ? 0 : conv.index_pos;
    Logits logits = model_.Forward(tokens, index_pos, *conv.cache, trace);
    conv.index_pos += static_cast<int64_t>(tokens.size());
    return logits;
  }
  void Truncate(const std::string& name, int64_t length) override {
    Conv& conv = convs_.at(name);
    last_ = conv.cache;
    conv.cache->SetLength(length);
    conv.index_pos = length;
  }
  void Fork(const std::string& from, const std::string& to) override {
    const Conv& src = convs_.at(from);
    Conv conv{std::make_shared<impl::KvCache>(src.cache->Fork()), src.index_pos};
    convs_[to] = conv;
    last_ = conv.cache;
  }
  void Reset(const std::string& name) override {
    Conv& conv = convs_.at(name);
    last_ = conv.cache;
    conv.index_pos = 0;
    // llama.rs has no way to clear a cache: under `reuse` a reset only restarts the position.
    if (kind_ != DriverKind::kReuse) conv.cache->Clear();
  }

 private:
  struct Conv {
    std::shared_ptr<impl::KvCache> cache;
    int64_t index_pos = 0;
  };
  DriverKind kind_;
  impl::Model model_;
  std::map<std::string, Conv> convs_;
  std::shared_ptr<impl::KvCache> last_;  // the most recently used cache
};

#ifdef KVDIFF_HAVE_TORCH
// transformers with a DynamicCache: positions come from the cache, so the only misuse is reuse.
class RefRawDriver : public Driver {
 public:
  RefRawDriver(ref::Precision precision, std::shared_ptr<const format::ModelWeights> weights,
               int threads)
      : model_(std::move(weights), precision, threads) {
    NewConversation("main");
  }
  void NewConversation(const std::string& name) override {
    auto cache = last_ ? last_ : std::make_shared<ref::DynamicCache>();
    convs_[name] = cache;
    last_ = cache;
  }
  Logits Append(const std::string& name, const Tokens& tokens, ForwardTrace* trace) override {
    auto& cache = convs_.at(name);
    last_ = cache;
    return model_.Forward(tokens, *cache, trace);
  }
  void Truncate(const std::string& name, int64_t length) override {
    auto& cache = convs_.at(name);
    last_ = cache;
    cache->Crop(length);
  }
  void Fork(const std::string& from, const std::string& to) override {
    convs_[to] = std::make_shared<ref::DynamicCache>(convs_.at(from)->Fork());
    last_ = convs_[to];
  }
  // A user who reuses one DynamicCache never clears it: a reset keeps it as it is.
  void Reset(const std::string& name) override { last_ = convs_.at(name); }

 private:
  ref::ReferenceModel model_;
  std::map<std::string, std::shared_ptr<ref::DynamicCache>> convs_;
  std::shared_ptr<ref::DynamicCache> last_;
};
#endif

}  // namespace

std::string DriverNotApplicable(DriverKind kind, const std::string& backend_name) {
  if (kind == DriverKind::kPos0 && backend_name != "impl") {
    return fmt::format(
        "driver \"pos0\" does not apply to backend \"{}\": transformers' forward takes no "
        "position (it reads it from the DynamicCache), so there is no index_pos to pass as 0; "
        "pos0 runs on impl only",
        backend_name);
  }
  return {};
}

std::unique_ptr<Driver> MakeDriver(DriverKind kind, const Backend& backend,
                                   std::shared_ptr<const format::ModelWeights> weights,
                                   int threads) {
  if (kind == DriverKind::kSession) return std::make_unique<SessionDriver>(backend);
  const std::string name = backend.Name();
  const std::string why = DriverNotApplicable(kind, name);
  KVDIFF_CHECK(why.empty(), "{}", why);
  if (name == "impl") return std::make_unique<ImplRawDriver>(kind, std::move(weights), threads);
#ifdef KVDIFF_HAVE_TORCH
  if (name == "ref" || name == "ref64") {
    return std::make_unique<RefRawDriver>(
        name == "ref" ? ref::Precision::kFloat32 : ref::Precision::kFloat64, std::move(weights),
        threads);
  }
#endif
  throw InputError(
      fmt::format("driver \"{}\": no raw driver for backend \"{}\"", DriverName(kind), name));
}

}  // namespace kvdiff::harness
