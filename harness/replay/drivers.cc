#include "harness/replay/drivers.h"

#include <fmt/format.h>

#include <map>
#include <stdexcept>

#include "format/error.h"

namespace kvdiff::harness {
namespace {

// What a driver needs of a backend's raw call.
enum class Needs { kNothing, kRawCall, kPositionArgument };

Needs NeedsOf(DriverKind kind) {
  switch (kind) {
    case DriverKind::kSession:
    case DriverKind::kUncached:
      return Needs::kNothing;
    case DriverKind::kRaw:
    case DriverKind::kReuse:
    case DriverKind::kQuantized:
      return Needs::kRawCall;
    case DriverKind::kPos0:
    case DriverKind::kStalePosition:
      return Needs::kPositionArgument;
  }
  throw std::logic_error("unknown DriverKind");
}

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
  void Shift(const std::string& conv, int64_t keep, int64_t discard) override {
    sessions_.at(conv)->Shift(keep, discard);
  }
  void End(const std::string& conv) override { sessions_.erase(conv); }
  std::vector<Logits> AppendBatch(const std::vector<DriverBatchItem>& items) override {
    std::vector<BatchItem> batch;
    for (const DriverBatchItem& item : items)
      batch.push_back({sessions_.at(item.conversation).get(), item.tokens, item.output});
    return backend_.AppendBatch(batch);
  }
  std::optional<int64_t> Length(const std::string& conv) const override {
    return sessions_.at(conv)->Length();
  }

 private:
  const Backend& backend_;
  std::map<std::string, std::unique_ptr<BackendSession>> sessions_;
};

// No cache at all: row p of ForwardFull(history) is the uncached answer for position p.
class UncachedDriver : public Driver {
 public:
  explicit UncachedDriver(const Backend& backend) : backend_(backend) { NewConversation("main"); }
  void NewConversation(const std::string& name) override { histories_[name].clear(); }
  // A trace of the call's rows would be a slice of the whole history's trace; not recorded.
  Logits Append(const std::string& conv, const Tokens& tokens, ForwardTrace* /*trace*/) override {
    Tokens history = histories_.at(conv);
    history.insert(history.end(), tokens.begin(), tokens.end());
    const Logits full = backend_.ForwardFull(history);  // (history, vocab)
    const auto n = static_cast<int64_t>(tokens.size());
    Logits rows = full.bottomRows(n);  // (n, vocab)
    histories_[conv] = std::move(history);
    return rows;
  }
  void Truncate(const std::string& conv, int64_t length) override {
    Tokens& history = histories_.at(conv);
    KVDIFF_CHECK(length >= 0 && length <= static_cast<int64_t>(history.size()),
                 "Truncate: length {} outside [0, {}]", length, history.size());
    history.resize(length);
  }
  void Fork(const std::string& from, const std::string& to) override {
    histories_[to] = histories_.at(from);
  }
  void Reset(const std::string& conv) override { histories_.at(conv).clear(); }
  void End(const std::string& conv) override { histories_.erase(conv); }
  std::optional<int64_t> Length(const std::string& conv) const override {
    return static_cast<int64_t>(histories_.at(conv).size());
  }

 private:
  const Backend& backend_;
  std::map<std::string, Tokens> histories_;
};

// The raw call: the caller holds each conversation's cache and its index_pos, right or wrong.
// Caches are shared_ptr because `reuse` hands one cache to several conversations.
class RawDriver : public Driver {
 public:
  RawDriver(DriverKind kind, const RawModel& model) : kind_(kind), model_(model) {
    NewConversation("main");
  }
  void NewConversation(const std::string& name) override {
    Conv conv;
    const bool reuses = kind_ == DriverKind::kReuse || kind_ == DriverKind::kQuantized;
    conv.cache = reuses && last_ ? last_->cache : model_.NewCache();
    // stale-position: the caller's position counter was never reset for the new conversation.
    if (kind_ == DriverKind::kStalePosition && last_) conv.index_pos = last_->index_pos;
    Use(convs_[name] = conv);
  }
  Logits Append(const std::string& name, const Tokens& tokens, ForwardTrace* trace) override {
    Conv& conv = Use(convs_.at(name));
    const int64_t index_pos = kind_ == DriverKind::kPos0 ? 0 : conv.index_pos;
    if (kind_ == DriverKind::kQuantized && index_pos == 0) conv.cache->Clear();
    Logits logits = model_.Forward(tokens, index_pos, *conv.cache, trace);
    conv.index_pos += static_cast<int64_t>(tokens.size());
    return logits;
  }
  void Truncate(const std::string& name, int64_t length) override {
    Conv& conv = Use(convs_.at(name));
    conv.cache->Crop(length);
    conv.index_pos = length;
  }
  void Fork(const std::string& from, const std::string& to) override {
    const Conv& src = convs_.at(from);
    Use(convs_[to] = Conv{src.cache->Fork(), src.index_pos});
  }
  void Reset(const std::string& name) override {
    Conv& conv = Use(convs_.at(name));
    // llama.rs has no way to clear a cache (reuse only restarts the position); stale-position
    // clears the cache but forgets the position.
    if (kind_ != DriverKind::kReuse) conv.cache->Clear();
    if (kind_ != DriverKind::kStalePosition) conv.index_pos = 0;
  }
  void End(const std::string& name) override {
    auto it = convs_.find(name);
    if (it == convs_.end()) return;
    // reuse hands the last-used cache to the next conversation, ended or not.
    if (last_ == &it->second) {
      retired_ = it->second;
      last_ = &retired_;
    }
    convs_.erase(it);
  }
  // The raw call used right keeps its cache as long as the conversation; the misuses do not.
  std::optional<int64_t> Length(const std::string& name) const override {
    if (kind_ != DriverKind::kRaw) return std::nullopt;
    return convs_.at(name).cache->Length();
  }

 private:
  struct Conv {
    std::shared_ptr<RawCache> cache;
    int64_t index_pos = 0;
  };
  Conv& Use(Conv& conv) {
    last_ = &conv;
    return conv;
  }
  DriverKind kind_;
  const RawModel& model_;
  std::map<std::string, Conv> convs_;  // std::map: last_ stays valid as conversations are added
  const Conv* last_ = nullptr;         // the most recently used conversation
  Conv retired_;                       // it, once ended
};

}  // namespace

void Driver::Shift(const std::string& conversation, int64_t keep, int64_t discard) {
  throw InputError(
      fmt::format("shift({},keep={},discard={}): only the session driver can shift a conversation",
                  conversation, keep, discard));
}

std::vector<Logits> Driver::AppendBatch(const std::vector<DriverBatchItem>& items) {
  std::vector<Logits> out;
  for (const DriverBatchItem& item : items)
    out.push_back(KeepOutputRows(Append(item.conversation, item.tokens, nullptr), item.output));
  return out;
}

std::string DriverNotApplicable(DriverKind kind, const BackendInfo& info) {
  const Needs needs = NeedsOf(kind);
  if (needs == Needs::kNothing) return {};
  const std::string name = DriverName(kind);
  if (info.raw_call == RawCall::kNone) {
    return fmt::format(
        "driver \"{}\" does not apply to backend \"{}\": it drives the raw call, and {} offers "
        "only the checked session API",
        name, info.name, info.name);
  }
  if (needs == Needs::kPositionArgument && info.raw_call != RawCall::kTakesPosition) {
    return fmt::format(
        "driver \"{}\" does not apply to backend \"{}\": its raw call takes no position (like "
        "transformers' forward, it reads it from its cache), so there is no index_pos to get "
        "wrong; {} runs on backends whose raw call takes index_pos",
        name, info.name, name);
  }
  return {};
}

std::unique_ptr<Driver> MakeDriver(DriverKind kind, const Backend& backend) {
  const std::string why = DriverNotApplicable(kind, backend.Info());
  KVDIFF_CHECK(why.empty(), "{}", why);
  switch (kind) {
    case DriverKind::kSession:
      return std::make_unique<SessionDriver>(backend);
    case DriverKind::kUncached:
      return std::make_unique<UncachedDriver>(backend);
    default:
      KVDIFF_CHECK(backend.Raw() != nullptr, "backend {} declares a raw call but has none",
                   backend.Name());
      return std::make_unique<RawDriver>(kind, *backend.Raw());
  }
}

}  // namespace kvdiff::harness
