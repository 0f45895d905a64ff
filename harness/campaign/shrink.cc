#include "harness/campaign/shrink.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <utility>
#include <vector>

#include "harness/scenario/conversations.h"

namespace kvdiff::harness {
namespace {

// The first `keep` tokens of a prompt, its chunk split cut to match.
void KeepFirstTokens(Step& step, int64_t keep) {
  step.tokens.resize(static_cast<size_t>(keep));
  step.text.reset();  // the tokens are what is written back now, not a text to tokenize again
  step.messages.reset();
  std::vector<int64_t> chunks;
  int64_t sum = 0;
  for (int64_t c : step.chunks) {
    if (sum == keep) break;
    chunks.push_back(std::min(c, keep - sum));
    sum += chunks.back();
  }
  step.chunks = chunks.size() > 1 ? chunks : std::vector<int64_t>{};
}

// Shorter lengths worth trying for something of `n` (>= 1): half of it, then one less.
std::vector<int64_t> ShorterLengths(int64_t n) {
  std::vector<int64_t> out;
  if (n > 2) out.push_back(n / 2);
  if (n > 1) out.push_back(n - 1);
  return out;
}

// Per step, whether it is a shift that leaves nothing after keep (keep + discard = the length,
// discard >= 1): a shape worth keeping while the steps before it shrink.
std::vector<bool> ShiftsToTheEnd(const Scenario& sc) {
  std::vector<bool> out;
  Conversations convs;
  for (const Step& s : sc.steps) {
    out.push_back(s.op == Op::kShift && convs.Exists(s.conversation) && s.discard > 0 &&
                  s.keep + s.discard == convs.At(s.conversation).length);
    convs.Apply(s);
  }
  return out;
}

// The shifts of a candidate fitted to its histories, which an earlier cut may have shortened:
// one that left nothing after keep (to_end, per step) still does, its keep kept where the length
// allows and its discard what is left; any other that now reaches past the end is moved to end
// there, keeping its discard where the length allows.
void FitShifts(Scenario& sc, const std::vector<bool>& to_end) {
  Conversations convs;
  for (size_t i = 0; i < sc.steps.size(); ++i) {
    Step& s = sc.steps[i];
    if (s.op == Op::kShift && convs.Exists(s.conversation)) {
      const int64_t length = convs.At(s.conversation).length;
      if (to_end[i] && length >= 1) {
        s.keep = std::min(s.keep, length - 1);
        s.discard = length - s.keep;
      } else if (s.keep > length || s.discard > length - s.keep) {
        s.discard = std::min(s.discard, length);
        s.keep = length - s.discard;
      }
    }
    convs.Apply(s);
  }
}

// Every one-edit-smaller scenario, the largest cuts first: first each step removed, the last
// first (Candidates counts on that order), then the edits of one step.
std::vector<Scenario> CandidatesAsCut(const Scenario& sc) {
  std::vector<Scenario> out;
  auto with_step = [&](size_t i, Step step) {
    Scenario c = sc;
    c.steps[i] = std::move(step);
    out.push_back(std::move(c));
  };
  for (size_t i = sc.steps.size(); i-- > 0;) {
    Scenario c = sc;
    c.steps.erase(c.steps.begin() + static_cast<std::ptrdiff_t>(i));
    out.push_back(std::move(c));
  }
  for (size_t i = 0; i < sc.steps.size(); ++i) {
    const Step& s = sc.steps[i];
    if (s.op == Op::kBatch) {
      for (size_t j = 0; s.items.size() > 1 && j < s.items.size(); ++j) {
        std::vector<BatchEntry> items = s.items;
        items.erase(items.begin() + static_cast<std::ptrdiff_t>(j));
        with_step(i, Step::Batch(std::move(items)));
      }
      for (size_t j = 0; j < s.items.size(); ++j) {
        for (int64_t keep : ShorterLengths(static_cast<int64_t>(s.items[j].tokens.size()))) {
          std::vector<BatchEntry> items = s.items;
          items[j].tokens.resize(static_cast<size_t>(keep));
          with_step(i, Step::Batch(std::move(items)));
        }
      }
    } else if (s.op == Op::kPrefill) {
      for (int64_t keep : ShorterLengths(static_cast<int64_t>(s.tokens.size()))) {
        Step step = s;
        KeepFirstTokens(step, keep);
        with_step(i, std::move(step));
      }
      if (!s.chunks.empty()) {
        Step step = s;
        step.chunks.clear();
        with_step(i, std::move(step));
      }
    } else if (s.op == Op::kDecode) {
      for (int64_t n : ShorterLengths(s.n)) with_step(i, Step::Decode(s.conversation, n));
    } else if (s.op == Op::kTruncate) {
      // A shorter truncate lets the steps before it shrink: a prompt or decode it depended on
      // to be long enough can then go.
      for (int64_t length : ShorterLengths(s.length))
        with_step(i, Step::Truncate(s.conversation, length));
      if (s.length == 1) with_step(i, Step::Truncate(s.conversation, 0));
    } else if (s.op == Op::kShift) {
      // A shorter discard or keep reaches less far into the conversation, so that the prompts
      // and decodes before it can shrink too.
      for (int64_t discard : ShorterLengths(s.discard))
        with_step(i, Step::Shift(s.conversation, s.keep, discard));
      for (int64_t keep : ShorterLengths(s.keep))
        with_step(i, Step::Shift(s.conversation, keep, s.discard));
      if (s.keep == 1) with_step(i, Step::Shift(s.conversation, 0, s.discard));
    }
  }
  return out;
}

// Every one-edit-smaller scenario, the largest cuts first (the shifts fitted to what is left).
std::vector<Scenario> Candidates(const Scenario& sc) {
  std::vector<Scenario> out = CandidatesAsCut(sc);
  const std::vector<bool> to_end = ShiftsToTheEnd(sc);
  for (size_t c = 0; c < out.size(); ++c) {
    std::vector<bool> flags = to_end;
    // The first candidates remove one step each, the last first (CandidatesAsCut).
    if (c < sc.steps.size())
      flags.erase(flags.begin() + static_cast<std::ptrdiff_t>(sc.steps.size() - 1 - c));
    FitShifts(out[c], flags);
  }
  return out;
}

bool Valid(const Scenario& sc, const format::LlamaConfig& config) {
  if (sc.steps.empty()) return false;
  try {
    ValidateScenario(sc, config);
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace

Shrink ShrinkScenario(const Scenario& failing, const format::LlamaConfig& config,
                      const std::function<bool(const Scenario&)>& still_fails,
                      const ShrinkBudget& budget) {
  const auto start = std::chrono::steady_clock::now();
  auto spent = [&](int64_t runs) {
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return runs >= budget.max_runs || seconds >= budget.max_seconds;
  };
  Shrink shrink;
  shrink.scenario = failing;
  for (bool smaller = true; smaller;) {
    smaller = false;
    for (Scenario& candidate : Candidates(shrink.scenario)) {
      if (spent(shrink.runs)) {
        shrink.exhausted = true;
        return shrink;
      }
      if (!Valid(candidate, config)) continue;
      ++shrink.runs;
      if (!still_fails(candidate)) continue;
      shrink.scenario = std::move(candidate);
      smaller = true;
      break;
    }
  }
  return shrink;
}

}  // namespace kvdiff::harness
