// impl behind sessions that defer or size their work the way wrong engines do: a reset or a shift
// applied at the next append only (and forgotten by a fork before it), the dropped row of a
// truncate by one or of a truncate from past 300 to below it kept, a ninth session given the first
// one's cache. Each was a numpy mutant that passed `kvdiff check --cases 200` before the campaign's
// follow-ups (harness/campaign/follow_up.h) and conform's checks of deferred and sized work; the
// tests prove both catch them. Bug::kNone is the same wrapper without a bug.
#pragma once

#include <memory>
#include <optional>
#include <utility>

#include "harness/backend/backend.h"
#include "tests/harness/wrapped_backend.h"

namespace kvdiff::testing {

enum class Bug {
  kNone,
  kLazyResetForkForgets,  // reset cleared at the next append; a fork before it copies the old cache
  kLazyShiftForkForgets,  // shift applied at the next append; a fork before it is not shifted
  kTruncateByOneKeepsRow,    // a truncate by exactly one leaves the row in the cache
  kDeepTruncateKeepsRows,    // a truncate from past 300 to below 300 leaves [300, old) in the cache
  kNinthSessionReusesFirst,  // a ninth session alive gets the first one's cells, uncleared
};

class Deferring;

// impl's session with the bug: Length() is what the engine says; the inner session may hold more
// (stale rows), or not yet the reset or the shift the engine said it did.
class DeferringSession : public harness::BackendSession {
 public:
  DeferringSession(Bug bug, std::unique_ptr<harness::BackendSession> inner, int64_t length,
                   int* alive)
      : bug_(bug), inner_(std::move(inner)), length_(length), alive_(alive) {
    ++*alive_;
  }
  ~DeferringSession() override { --*alive_; }
  Logits Append(const Tokens& tokens, ForwardTrace* trace) override {
    Settle();
    Logits out = inner_->Append(tokens, trace);
    length_ += static_cast<int64_t>(tokens.size());
    return out;
  }
  int64_t Length() const override { return length_; }
  void Truncate(int64_t length) override {
    if (length < 0 || length > length_) return inner_->Truncate(length);  // its refusal
    Settle();
    const int64_t stale = inner_->Length() - length_;
    if (bug_ == Bug::kTruncateByOneKeepsRow && length == length_ - 1) {
      length_ = length;
      return;
    }
    const bool deep = bug_ == Bug::kDeepTruncateKeepsRows && length_ > 300 && length < 300;
    inner_->Truncate((deep ? 300 : length) + stale);
    length_ = length;
  }
  std::unique_ptr<harness::BackendSession> Fork() const override {
    // The forgetting fork copies what the cache holds now, without the pending reset or shift.
    const bool forgets = bug_ == Bug::kLazyResetForkForgets || bug_ == Bug::kLazyShiftForkForgets;
    if (!forgets) const_cast<DeferringSession*>(this)->Settle();
    return std::make_unique<DeferringSession>(bug_, inner_->Fork(), length_, alive_);
  }
  void Reset() override {
    length_ = 0;
    pending_shift_.reset();
    if (bug_ == Bug::kLazyResetForkForgets) {
      pending_reset_ = true;
      return;
    }
    inner_->Reset();
  }
  void Shift(int64_t keep, int64_t discard) override {
    if (keep < 0 || discard < 0 || keep > length_ || discard > length_ - keep || pending_shift_ ||
        bug_ != Bug::kLazyShiftForkForgets) {
      Settle();
      inner_->Shift(keep, discard);
      length_ = inner_->Length();
      return;
    }
    pending_shift_ = std::make_pair(keep, discard);
    length_ -= discard;
  }

 private:
  void Settle() {
    if (pending_reset_) inner_->Reset();
    pending_reset_ = false;
    if (pending_shift_) inner_->Shift(pending_shift_->first, pending_shift_->second);
    pending_shift_.reset();
  }

  Bug bug_;
  std::unique_ptr<harness::BackendSession> inner_;
  int64_t length_;
  int* alive_;
  bool pending_reset_ = false;
  std::optional<std::pair<int64_t, int64_t>> pending_shift_;
};

class Deferring : public WrappedBackend {
 public:
  Deferring(std::unique_ptr<harness::Backend> inner, Bug bug)
      : WrappedBackend(std::move(inner), Shifting()), bug_(bug) {}
  std::unique_ptr<harness::BackendSession> NewSession() const override {
    if (bug_ == Bug::kNinthSessionReusesFirst && alive_ >= 8 && first_) {
      // The first session's cells, uncleared, under a session that says it is empty.
      return std::make_unique<DeferringSession>(bug_, first_->Fork(), 0, &alive_);
    }
    auto inner = inner_backend().NewSession();
    auto session = std::make_unique<DeferringSession>(bug_, std::move(inner), 0, &alive_);
    if (alive_ == 1) first_ = session.get();
    return session;
  }

 private:
  static harness::BackendInfo Shifting() {
    harness::BackendInfo info;
    info.name = "deferring";
    info.dtype = "float32";
    info.shifts = true;
    return info;
  }
  const harness::Backend& inner_backend() const { return inner(); }
  Bug bug_;
  mutable int alive_ = 0;
  mutable const DeferringSession* first_ = nullptr;
};

}  // namespace kvdiff::testing
