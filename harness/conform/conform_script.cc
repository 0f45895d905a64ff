// The Script every conform check is written as (conform_detail.h): its scenario replayed by the
// one replay, its rows held to the oracle by the one oracle check, its bad calls made between the
// replay's own by a Backend that wraps the engine.
#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <utility>

#include "format/error.h"
#include "format/prng.h"
#include "harness/campaign/case_generator.h"
#include "harness/compare/compare.h"
#include "harness/conform/conform_detail.h"

namespace kvdiff::harness::conform_detail {
namespace {

class CountedSession;

// The engine with bad calls made between the replay's calls. A bad call follows an append call (a
// batch is one): it is made once the replay has looked at the lengths, just before the next call
// to a session or to the engine, on the sessions alive then. A misuse modelled as a Backend, as
// tests/props/raw_drivers.cc does: the replay drives it like any engine, and the appends after a
// refusal are the replay's, held to the oracle like every other row.
class WithBadCalls : public Backend {
 public:
  struct Outcome {
    bool made = false;
    std::string refusal;  // the InputError's message
    std::string problem;  // what was wrong, when it was not a refusal that changed nothing
  };

  WithBadCalls(const Backend& engine, std::vector<std::pair<int64_t, BadCall>> calls)
      : engine_(engine), calls_(std::move(calls)), outcomes_(calls_.size()) {}

  const BackendInfo& Info() const override { return engine_.Info(); }
  const format::LlamaConfig& config() const override { return engine_.config(); }
  Logits ForwardFull(const Tokens& tokens, ForwardTrace* trace) const override {
    return engine_.ForwardFull(tokens, trace);
  }
  std::unique_ptr<BackendSession> NewSession() const override {
    MakeDue();
    return Wrap(engine_.NewSession());
  }
  std::vector<Logits> AppendBatch(const std::vector<BatchItem>& items) const override;

  std::unique_ptr<BackendSession> Wrap(std::unique_ptr<BackendSession> inner) const;
  void Forget(const CountedSession* session) const {
    live_.erase(std::find(live_.begin(), live_.end(), session));
  }
  // One more append call returned: the bad calls that follow it are due.
  void Appended() const;
  // Makes the bad calls that are due: a session or the engine is about to be called.
  void MakeDue() const;
  const std::vector<Outcome>& outcomes() const { return outcomes_; }

 private:
  void Make(size_t i) const;

  const Backend& engine_;
  std::vector<std::pair<int64_t, BadCall>> calls_;  // the append calls before each; the call
  mutable std::vector<Outcome> outcomes_;           // parallel to calls_
  mutable int64_t appends_ = 0;
  mutable std::vector<size_t> due_;            // into calls_
  mutable std::vector<CountedSession*> live_;  // in the order they were made
};

// A session of the engine whose appends WithBadCalls counts.
class CountedSession : public BackendSession {
 public:
  CountedSession(const WithBadCalls& owner, std::unique_ptr<BackendSession> inner)
      : owner_(owner), inner_(std::move(inner)) {}
  ~CountedSession() override { owner_.Forget(this); }
  Logits Append(const Tokens& tokens, ForwardTrace* trace) override {
    owner_.MakeDue();
    Logits logits = inner_->Append(tokens, trace);
    owner_.Appended();
    return logits;
  }
  int64_t Length() const override { return inner_->Length(); }
  void Truncate(int64_t length) override {
    owner_.MakeDue();
    inner_->Truncate(length);
  }
  std::unique_ptr<BackendSession> Fork() const override {
    owner_.MakeDue();
    return owner_.Wrap(inner_->Fork());
  }
  void Reset() override {
    owner_.MakeDue();
    inner_->Reset();
  }
  void Shift(int64_t keep, int64_t discard) override {
    owner_.MakeDue();
    inner_->Shift(keep, discard);
  }
  BackendSession& inner() const { return *inner_; }

 private:
  const WithBadCalls& owner_;
  std::unique_ptr<BackendSession> inner_;
};

std::unique_ptr<BackendSession> WithBadCalls::Wrap(std::unique_ptr<BackendSession> inner) const {
  auto session = std::make_unique<CountedSession>(*this, std::move(inner));
  live_.push_back(session.get());
  return session;
}

std::vector<Logits> WithBadCalls::AppendBatch(const std::vector<BatchItem>& items) const {
  MakeDue();
  std::vector<BatchItem> inner = items;
  for (BatchItem& item : inner) item.session = &static_cast<CountedSession*>(item.session)->inner();
  std::vector<Logits> out = engine_.AppendBatch(inner);
  Appended();
  return out;
}

void WithBadCalls::Appended() const {
  ++appends_;
  for (size_t i = 0; i < calls_.size(); ++i)
    if (calls_[i].first == appends_) due_.push_back(i);
}

void WithBadCalls::MakeDue() const {
  const std::vector<size_t> due = std::move(due_);
  due_.clear();
  for (size_t i : due) Make(i);
}

void WithBadCalls::Make(size_t i) const {
  std::vector<BackendSession*> sessions;
  std::vector<int64_t> before;
  for (const CountedSession* s : live_) {
    sessions.push_back(&s->inner());
    before.push_back(s->inner().Length());
  }
  Outcome& outcome = outcomes_[i];
  outcome.made = true;
  try {
    calls_[i].second(engine_, sessions);
    outcome.problem = "expected a refusal as bad input, but the call succeeded";
    return;
  } catch (const InputError& e) {
    outcome.refusal = e.what();
  } catch (const std::exception& e) {
    outcome.problem =
        fmt::format("expected a refusal as bad input, got an engine failure: {}", e.what());
    return;
  }
  for (size_t k = 0; k < sessions.size(); ++k) {
    const int64_t after = sessions[k]->Length();
    if (after != before[k]) {
      outcome.problem =
          fmt::format("Length() is {} after the refusal, expected {} (session {} of {})", after,
                      before[k], k, sessions.size());
      return;
    }
  }
}

}  // namespace

Script::Script(const Backend& engine, const Backend& oracle, const Backend* arbiter,
               const Gate& gate, uint64_t seed)
    : engine_(engine), oracle_(oracle), arbiter_(arbiter), gate_(gate), rng_(seed) {}

Tokens Script::RandomTokens(int64_t n) {
  Tokens t(n);
  for (Token& token : t) token = static_cast<Token>(format::SplitMix64(rng_) % vocab());
  return t;
}

size_t Script::Add(Step step, std::string what) {
  switch (step.op) {  // the engine's append calls the step makes
    case Op::kPrefill:
      appends_ += step.chunks.empty() ? 1 : static_cast<int64_t>(step.chunks.size());
      break;
    case Op::kDecode:
      appends_ += step.n;
      break;
    case Op::kBatch:
      appends_ += 1;
      break;
    default:
      break;
  }
  scenario_.steps.push_back(std::move(step));
  what_.push_back(std::move(what));
  return scenario_.steps.size() - 1;
}

size_t Script::Append(const std::string& conversation, const Tokens& tokens, std::string what) {
  const auto n = static_cast<int64_t>(tokens.size());
  const int64_t per_call = engine_.Info().max_batch_tokens;
  std::vector<int64_t> chunks;
  for (int64_t done = 0; per_call > 0 && n > per_call && done < n; done += per_call)
    chunks.push_back(std::min(per_call, n - done));
  return Add(Step::Prefill(conversation, tokens, std::move(chunks)), std::move(what));
}

int64_t Script::max_positions() const {
  return CampaignMaxLength(engine_.config(), 0, {&engine_});  // the context, capped by max_length
}

std::string Script::max_positions_name() const {
  const int64_t declared = engine_.Info().max_length;
  if (declared > 0 && declared < engine_.config().max_position_embeddings)
    return fmt::format("max_length {}", declared);
  return fmt::format("max_position_embeddings {}", engine_.config().max_position_embeddings);
}

void Script::CheckFits() const {
  ValidateScenario(scenario_, engine_.config());
  try {
    ValidateScenarioFor(scenario_, engine_.Info());
  } catch (const InputError& e) {
    throw NotApplicable(fmt::format("the check needs more than the engine holds: {}", e.what()));
  }
}

void Script::Refuse(std::string what, BadCall call) {
  refusals_.push_back({std::move(what), std::move(call), appends_, scenario_.steps.size() - 1});
}

void Script::Same(std::string what, size_t step, std::string conversation, size_t other_step,
                  std::string other) {
  same_.push_back({std::move(what), step, other_step, std::move(conversation), std::move(other)});
}

std::string Script::At(size_t step, const std::string& message) const {
  return fmt::format("{}: {}", what_[step], message);
}

// The rows of step i held to the oracle's (after a shift, to the arbiter's); a batch's rows are
// named by their item.
void Script::CheckRows(Played& played, size_t i) const {
  const Step& step = scenario_.steps[i];
  const StepRecord& sr = played.recording.steps[i];
  for (size_t k = sr.rows_begin; k < sr.rows_end; ++k) {
    const RecordedRow& row = played.recording.rows[k];
    const bool shifted = row.after_shift;
    const std::optional<RowComparison>& cmp =
        shifted ? played.arbitrated[k] : played.oracle.rows[k];
    if (!cmp) continue;  // a failed oracle is the step's error
    double& worst = shifted ? played.shifted_worst : played.worst;
    worst = std::max(worst, cmp->max_abs_diff);
    ++(shifted ? played.shifted_rows : played.rows);
    if (cmp->within_tolerance) continue;
    std::string what = what_[i];
    for (size_t item = 0; step.op == Op::kBatch && item < step.items.size(); ++item) {
      if (step.items[item].conversation == row.conversation)
        what += fmt::format(", item {} of {}", item, step.items.size());
    }
    Fail("{}: position {} differs from {} by {:.3e} > {:.3e} (argmax {} vs {})", what, row.position,
         shifted ? fmt::format("{}'s after the same shifts", arbiter_->Name())
                 : fmt::format("{}'s uncached forward", oracle_.Name()),
         cmp->max_abs_diff, cmp->gate, cmp->argmax_a, cmp->argmax_b);
  }
}

// No uncached forward is the oracle of a row after a shift (the kept keys were computed with the
// dropped tokens in view): the arbiter replays the same scenario, shifts included, and each such
// row is held to the arbiter's row of the same step and conversation over the same history.
void Script::Arbitrate(Played& played) const {
  const Recording& rec = played.recording;
  played.arbitrated.assign(rec.rows.size(), std::nullopt);
  const bool any = std::any_of(rec.rows.begin(), rec.rows.end(),
                               [](const RecordedRow& r) { return r.after_shift; });
  if (!any) return;
  KVDIFF_CHECK(arbiter_ != nullptr, "conform: a script with shifts needs an arbiter");
  const Recording arb = Replay(scenario_, *arbiter_);
  if (const std::optional<size_t> i = arb.FirstError())
    Fail("{}",
         At(*i, fmt::format("the arbiter {} failed: {}", arbiter_->Name(), arb.steps[*i].message)));
  for (size_t k = 0; k < rec.rows.size(); ++k) {
    const RecordedRow& row = rec.rows[k];
    if (!row.after_shift) continue;
    const StepRecord& other = arb.steps[row.step];
    for (size_t j = other.rows_begin; j < other.rows_end; ++j) {
      const RecordedRow& want = arb.rows[j];
      if (want.conversation != row.conversation || want.position != row.position ||
          !rec.SameHistory(row, arb, want))
        continue;
      played.arbitrated[k] =
          CompareRows(row.logits.data(), want.logits.data(), vocab(),
                      gate_.Across(engine_.Info(), arbiter_->Info(), row.rope_reach));
      break;
    }
    if (!played.arbitrated[k])
      Fail("{}", At(row.step, fmt::format("position {} has no row of {} to compare with",
                                          row.position, arbiter_->Name())));
  }
}

Played Script::Play() const {
  std::vector<std::pair<int64_t, BadCall>> calls;
  for (const Refusal& r : refusals_) calls.emplace_back(r.after_append, r.call);
  CheckFits();
  const WithBadCalls engine(engine_, std::move(calls));
  Played played;
  played.recording = Replay(scenario_, engine);
  played.oracle = CheckAgainstOracle(played.recording, oracle_, [&](int64_t position) {
    return gate_.Across(engine_.Info(), oracle_.Info(), position);
  });
  Arbitrate(played);
  for (size_t i = 0; i < scenario_.steps.size(); ++i) {
    if (auto error = played.oracle.StepError(played.recording, i)) Fail("{}", At(i, *error));
    CheckRows(played, i);
    for (size_t r = 0; r < refusals_.size(); ++r) {
      if (refusals_[r].step != i) continue;
      const WithBadCalls::Outcome& outcome = engine.outcomes()[r];
      if (!outcome.made) Fail("{}: the call was never made", refusals_[r].what);
      if (!outcome.problem.empty()) Fail("{}: {}", refusals_[r].what, outcome.problem);
      played.refusals.push_back(outcome.refusal);
    }
  }
  const Recording& rec = played.recording;
  for (const SameRows& same : same_) {
    for (size_t k = rec.steps[same.step].rows_begin; k < rec.steps[same.step].rows_end; ++k) {
      const RecordedRow& got = rec.rows[k];
      if (got.conversation != same.conversation) continue;
      const RecordedRow* want = nullptr;
      const StepRecord& other = rec.steps[same.other_step];
      for (size_t j = other.rows_begin; j < other.rows_end && !want; ++j) {
        if (rec.rows[j].conversation == same.other && rec.rows[j].position == got.position)
          want = &rec.rows[j];
      }
      if (!want) Fail("{}: position {} has no row to compare with", same.what, got.position);
      // Both rows are the engine's own, its RoPE angles alike: the run's gate without allowance.
      const RowComparison cmp =
          CompareRows(got.logits.data(), want->logits.data(), vocab(), gate_.Own());
      played.same_worst = std::max(played.same_worst, cmp.max_abs_diff);
      ++played.same_rows;
      if (!cmp.within_tolerance) {
        Fail("{}: position {}: max |a-b| {:.3e} > {:.3e} (argmax {} vs {})", same.what,
             got.position, cmp.max_abs_diff, cmp.gate, cmp.argmax_a, cmp.argmax_b);
      }
    }
  }
  return played;
}

Recording Script::ReplayOnly() const {
  CheckFits();
  Recording rec = Replay(scenario_, engine_);
  if (const std::optional<size_t> i = rec.FirstError()) Fail("{}", At(*i, rec.steps[*i].message));
  return rec;
}

std::string Played::Figures() const {
  return fmt::format("{} rows, max |a-b| {:.1e}", rows, worst);
}

std::string Played::SameRowsFigure() const {
  return fmt::format("max |a-b| {:.1e} over {} rows", same_worst, same_rows);
}

std::string Played::Refused() const {
  std::string m = refusals.empty() ? "" : refusals.back();
  if (m.size() > 70) m = m.substr(0, 67) + "...";
  return "refused: " + m;
}

}  // namespace kvdiff::harness::conform_detail
