#include "impl/session.h"

#include <cmath>
#include <map>
#include <vector>

#include "format/error.h"
#include "impl/kernels.h"
#include "impl/model.h"

namespace kvdiff::impl {

Session::Session(const Model& model, int64_t capacity)
    : model_(&model), cache_(model.config(), capacity) {}

Session::Session(const Model* model, KvCache cache) : model_(model), cache_(std::move(cache)) {}

Logits Session::Append(const Tokens& tokens, ForwardTrace* trace) {
  // Everything is validated before the cache is touched, so a throwing call changes nothing.
  model_->CheckTokens(tokens);
  const int64_t n = static_cast<int64_t>(tokens.size());
  KVDIFF_CHECK(Length() + n <= Capacity(),
               "Append: {} tokens at length {} need {} positions, beyond the session capacity {}",
               n, Length(), Length() + n, Capacity());
  ApplyPendingShift();
  // The position is the session's own: index_pos == Length() always, so the raw call's mask and
  // RoPE rows agree with the cache by construction.
  return model_->Forward(tokens, Length(), cache_, trace);
}

Logits Session::AppendBatch(const std::vector<BatchAppend>& items,
                            const std::vector<bool>& output) {
  KVDIFF_CHECK(!items.empty(), "AppendBatch: no items (expected at least one)");
  const Model* model = items.front().session ? items.front().session->model_ : nullptr;
  std::vector<ForwardPart> parts;
  for (size_t i = 0; i < items.size(); ++i) {
    Session* s = items[i].session;
    KVDIFF_CHECK(s != nullptr && items[i].tokens != nullptr, "AppendBatch: item {} is empty", i);
    KVDIFF_CHECK(s->model_ == model, "AppendBatch: item {} is a session of another model", i);
    const int64_t n = static_cast<int64_t>(items[i].tokens->size());
    KVDIFF_CHECK(s->Length() + n <= s->Capacity(),
                 "AppendBatch: item {}: {} tokens at length {} need {} positions, beyond the "
                 "session capacity {}",
                 i, n, s->Length(), s->Length() + n, s->Capacity());
    parts.push_back({items[i].tokens, s->Length(), &s->cache_});
  }
  for (const BatchAppend& item : items) item.session->ApplyPendingShift();
  // The model checks the rest (tokens, a cache named twice) before it runs anything.
  return model->ForwardBatch(parts, output);
}

void Session::Truncate(int64_t length) {
  cache_.CheckTruncate(length);  // the range, and what a sliding window has dropped
  cache_.SetLength(length);
}

void Session::Shift(int64_t keep, int64_t discard) {
  KVDIFF_CHECK(keep >= 0 && discard >= 0 && keep <= Length() && discard <= Length() - keep,
               "Shift: keep {} and discard {} must be >= 0 with keep + discard <= {} (the session "
               "length)",
               keep, discard, Length());
  // A shift moves positions under a window that counts them: no engine defines it (llama.cpp
  // refuses to shift an SWA cache), so neither does kvdiff.
  KVDIFF_CHECK(!model_->config().Windowed(),
               "Shift: this model has a sliding window ({} positions): a sliding-window "
               "conversation cannot shift its context",
               model_->config().sliding_window);
  using Bookkeeping = KvCache::ShiftBookkeeping;
  switch (model_->InjectedFault()) {
    case BatchFault::kShiftDeltaOverwritten:
      cache_.Shift(keep, discard, Bookkeeping::kOverwriteDelta);
      break;
    case BatchFault::kShiftSkippedWhenEmpty:
      cache_.Shift(keep, discard, Bookkeeping::kFlagFromThisShift);
      break;
    default:
      cache_.Shift(keep, discard);
  }
}

void Session::ApplyPendingShift() {
  if (!cache_.ShiftPending()) {
    cache_.SpendPendingShift();  // deltas without the flag: the fault that lost it
    return;
  }
  if (model_->InjectedFault() != BatchFault::kShiftNotRerotated) {
    // R(delta): angle[i] = delta · inv_freq[i], exact in double and rounded once, the inv_freq of
    // the RoPE table (llama3 rope_scaling included); one table per distinct delta.
    const std::vector<double> inv_freq = RopeInvFreq(model_->config());
    const auto half = static_cast<int64_t>(inv_freq.size());
    std::map<int64_t, std::vector<float>> tables;  // delta -> cos (half) then sin (half)
    for (int64_t p = 0; p < Length(); ++p) {
      const int64_t delta = cache_.PendingDelta(p);
      if (delta == 0) continue;
      std::vector<float>& t = tables[delta];
      if (t.empty()) {
        t.resize(2 * half);
        for (int64_t i = 0; i < half; ++i) {
          const double angle = static_cast<double>(delta) * inv_freq[i];
          t[i] = static_cast<float>(std::cos(angle));
          t[half + i] = static_cast<float>(std::sin(angle));
        }
      }
      cache_.RotateKey(p, half, t.data(), t.data() + half);
    }
  }
  cache_.SpendPendingShift();
}

Session Session::Fork() const { return Session(model_, cache_.Fork()); }

void Session::Reset() { cache_.Clear(); }

}  // namespace kvdiff::impl
