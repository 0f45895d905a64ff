#include "harness/campaign/follow_up.h"

#include <fmt/format.h>

#include <algorithm>

namespace kvdiff::harness {
namespace {

// Steps of a case's follow-ups, the conversations moved on with each.
class FollowUps {
 public:
  FollowUps(CaseRng& rng, const Conversations& convs, const FollowUpLimits& limits,
            int64_t& next_name)
      : rng_(rng), convs_(convs), limits_(limits), next_name_(next_name) {}

  std::vector<Step> Take() { return std::move(steps_); }
  const ConversationState& At(const std::string& name) const { return convs_.At(name); }
  int64_t Live() const { return static_cast<int64_t>(convs_.Names().size()); }
  bool CanAdd() const { return limits_.max_sessions <= 0 || Live() < limits_.max_sessions; }

  // The longest conversation (the first of the longest); "" when there is none.
  std::string Deepest() const {
    std::string out;
    for (const std::string& name : convs_.Names())
      if (out.empty() || At(name).length > At(out).length) out = name;
    return out;
  }

  // A shift that moves keys (keep + discard < length), then a call other than an append; false
  // when the conversation is too short to move any.
  bool ShiftThenAct(const std::string& name) {
    const int64_t length = At(name).length;
    if (!limits_.shifts || length < 2) return false;
    const int64_t keep = rng_.Chance(30) ? 0 : rng_.Between(0, length - 2);
    const int64_t discard = rng_.Between(1, length - keep - 1);
    Emit(Step::Shift(name, keep, discard));
    // Or a truncate above keep: the shifted keys stay, and so does what the shift left pending.
    ActThenContinue(name, [&] { Truncate(name, rng_.Between(keep + 1, At(name).length)); });
    return true;
  }

  // A reset, then a call other than a plain append of several tokens.
  void ResetThenAct(const std::string& name) {
    Emit(Step::Reset(name));
    // Or the source document's third bug: a one-token prompt on a reused cache.
    ActThenContinue(name, [&] { Prompt(name, 1); });
  }

  // At the depth `name` holds, in a random order: a truncate (by one, or anywhere below), and
  // now and then a fork and a batch; then now and then a reset.
  void DeepTour(const std::string& name) {
    std::vector<int> acts = {0, 1, 2};
    for (size_t i = acts.size(); i > 1; --i)
      std::swap(acts[i - 1], acts[rng_.Below(static_cast<int64_t>(i))]);
    for (int act : acts) {
      if (act != 2 && !rng_.Chance(70)) continue;
      if (act == 0) Fork(name);
      if (act == 1) Batch(name);
      if (act == 2) {
        const int64_t length = At(name).length;
        Truncate(name, rng_.Chance(25) ? length - 1 : rng_.Below(std::max<int64_t>(length, 1)));
        Continue(name);
      }
    }
    if (rng_.Chance(50)) ResetThenAct(name);
  }

  // Conversations until kMinCrowd..kMaxCrowd are alive (forks and new ones with a short
  // prompt), then one batch of all of them, then now and then a decode round of all.
  void Crowd() {
    const int64_t most =
        limits_.max_sessions > 0 ? std::min(kMaxCrowd, limits_.max_sessions) : kMaxCrowd;
    if (most < kMinCrowd || !limits_.batches) return;
    const int64_t target = rng_.Between(kMinCrowd, most);
    while (Live() < target) {
      const std::string name = NewName();
      if (rng_.Chance(40)) {
        Emit(Step::Fork(Any(), name));
      } else {
        Emit(Step::NewConversation(name));
        if (rng_.Chance(50)) Prompt(name, rng_.Between(1, 3));
      }
    }
    std::vector<BatchEntry> items;
    for (const std::string& name : convs_.Names()) {
      if (BatchEntry item = Item(name, 3); item.decode || !item.tokens.empty())
        items.push_back(std::move(item));
    }
    EmitBatch(std::move(items));
    if (!rng_.Chance(50)) return;
    std::vector<BatchEntry> decodes;
    for (const std::string& name : convs_.Names())
      if (At(name).has_last_row && Room(name) >= 1) decodes.push_back({name, {}, true});
    EmitBatch(std::move(decodes));
  }

 private:
  void Emit(const Step& s) {
    convs_.Apply(s);
    steps_.push_back(s);
  }
  // Right after a reset or a shift of `name`: a fork, a batch or `other`, one time in three
  // each; then what reads its cache.
  template <typename Other>
  void ActThenContinue(const std::string& name, Other other) {
    const int64_t act = rng_.Below(3);
    if (act == 0) Fork(name);
    if (act == 1) Batch(name);
    if (act == 2) other();
    Continue(name);
  }
  std::string NewName() { return fmt::format("c{}", next_name_++); }
  std::string Any() {
    return convs_.Names()[rng_.Below(static_cast<int64_t>(convs_.Names().size()))];
  }
  int64_t Room(const std::string& name) const { return limits_.context - At(name).length; }

  // Room for `n` more positions on `name`: a truncate a few positions back when it has too few
  // (itself a truncate at its depth); false when a sliding window forbids one.
  bool MakeRoom(const std::string& name, int64_t n) {
    if (Room(name) >= n) return true;
    const int64_t to = limits_.context - n - rng_.Below(3);
    if (to < ShortestTruncate(At(name), limits_.window) || to < 0) return false;
    Emit(Step::Truncate(name, to));
    return true;
  }
  Tokens RandomTokens(int64_t n) {
    Tokens t(n);
    for (Token& x : t) x = static_cast<Token>(rng_.Below(limits_.vocab));
    return t;
  }
  int64_t CallCap(int64_t n) const {
    return limits_.max_call_tokens > 0 ? std::min(n, limits_.max_call_tokens) : n;
  }
  void Prompt(const std::string& name, int64_t n) {
    n = CallCap(n);
    if (!MakeRoom(name, n)) return;
    Emit(Step::Prefill(name, RandomTokens(n)));
  }
  // What reads `name`'s cache after an act: a decode or a short prompt.
  void Continue(const std::string& name) {
    if (At(name).has_last_row && Room(name) >= 1 && rng_.Chance(50)) {
      Emit(Step::Decode(name, rng_.Between(1, std::min<int64_t>(3, Room(name)))));
    } else {
      Prompt(name, rng_.Between(1, 4));
    }
  }
  // A truncate to `length`, moved up to where a sliding window allows one.
  void Truncate(const std::string& name, int64_t length) {
    Emit(Step::Truncate(name, std::max(length, ShortestTruncate(At(name), limits_.window))));
  }
  // A fork of `name`; both go on, then the fork is freed when sessions are scarce.
  void Fork(const std::string& name) {
    if (!CanAdd()) return;
    const std::string child = NewName();
    Emit(Step::Fork(name, child));
    Continue(child);
    Continue(name);
    if (limits_.max_sessions > 0 && !CanAdd()) Emit(Step::End(child));
  }
  // `name`'s item of a batch: one greedy token when it has a last row (now and then), else a
  // prompt of 1..most tokens; empty when it has no room.
  BatchEntry Item(const std::string& name, int64_t most) {
    BatchEntry item;
    item.conversation = name;
    if (Room(name) < 1) return item;
    item.decode = At(name).has_last_row && rng_.Chance(50);
    if (!item.decode) item.tokens = RandomTokens(rng_.Between(1, std::min(most, Room(name))));
    item.logits = item.decode || rng_.Chance(70) ? BatchLogits::kAll : BatchLogits::kLast;
    return item;
  }
  // `name` in a batch with one to three others (a new request among them when sessions allow).
  void Batch(const std::string& name) {
    if (!limits_.batches || !MakeRoom(name, 4)) return;
    std::vector<BatchEntry> items = {Item(name, 4)};
    if (CanAdd() && rng_.Chance(50)) Emit(Step::NewConversation(NewName()));
    std::vector<std::string> others;
    for (const std::string& other : convs_.Names())
      if (other != name && Room(other) >= 1) others.push_back(other);
    for (size_t i = others.size(); i > 1; --i)
      std::swap(others[i - 1], others[rng_.Below(static_cast<int64_t>(i))]);
    others.resize(std::min<size_t>(others.size(), rng_.Between(1, 3)));
    for (const std::string& other : others) items.push_back(Item(other, 4));
    if (rng_.Chance(50)) std::swap(items.front(), items.back());  // not always the first row
    EmitBatch(std::move(items));
  }
  void EmitBatch(std::vector<BatchEntry> items) {
    FitBatch(items, limits_.max_call_tokens);
    if (!items.empty()) Emit(Step::Batch(std::move(items)));
  }

  CaseRng& rng_;
  Conversations convs_;
  const FollowUpLimits& limits_;
  int64_t& next_name_;
  std::vector<Step> steps_;
};

}  // namespace

void FitBatch(std::vector<BatchEntry>& items, int64_t cap) {
  if (cap <= 0) return;
  int64_t total = 0;
  for (const BatchEntry& item : items) total += item.Size();
  while (total > cap) {
    auto longest = std::max_element(items.begin(), items.end(), [](const auto& a, const auto& b) {
      return a.Size() < b.Size();
    });
    if (longest->Size() > 1) {
      const int64_t keep = std::max<int64_t>(1, longest->Size() - (total - cap));
      total -= longest->Size() - keep;
      longest->tokens.resize(static_cast<size_t>(keep));
    } else {
      items.pop_back();
      --total;
    }
  }
}

std::vector<Step> DrawFollowUps(CaseRng& rng, const Conversations& convs,
                                const FollowUpLimits& limits, bool long_case, int64_t& next_name) {
  FollowUps f(rng, convs, limits, next_name);
  const std::string deepest = f.Deepest();
  if (deepest.empty()) return {};  // no conversation left (a scenario that ended them all)
  if (long_case) {
    f.DeepTour(deepest);
  } else if (rng.Chance(60)) {
    const int64_t lead = rng.Below(100);
    if (lead < 45 || !f.ShiftThenAct(deepest)) f.ResetThenAct(deepest);
  }
  if (rng.Chance(15)) f.Crowd();
  return f.Take();
}

}  // namespace kvdiff::harness
