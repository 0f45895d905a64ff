// A failing case, shrunk to a replay file a person can read: the campaign's cases are long
// (dozens of steps, hundreds of tokens) so that they reach the places bugs live, and a failure
// found that way is easier to fix once everything it does not need is gone.
//
//   Shrink shrink = ShrinkScenario(failing, config, still_fails, budget);
//   // shrink.scenario: no step, batch item or token can be removed and keep it failing
//
// Greedy and deterministic: it tries, in turn, removing each step (from the last), each item of a
// batch step, the second half of a prompt or of a batch item's tokens, a prompt's chunk split,
// half of a decode's tokens, and half of a shift's discard or keep (or one less), each candidate's
// shifts fitted to the histories a cut shortened (one that left nothing after keep still does),
// keeps every candidate that still fails, and starts over until no candidate does or the budget is
// spent. A candidate the scenario rules refuse (ValidateScenario: a step on a conversation a
// removed step created, ...) is skipped unrun.
#pragma once

#include <cstdint>
#include <functional>

#include "format/config.h"
#include "harness/scenario/scenario.h"

namespace kvdiff::harness {

struct ShrinkBudget {
  int64_t max_runs = 400;   // replays of candidates
  double max_seconds = 60;  // wall time; the budget that binds on a large model
};

struct Shrink {
  Scenario scenario;       // the smallest failing scenario found (the input when none smaller)
  int64_t runs = 0;        // candidates replayed
  bool exhausted = false;  // stopped by the budget, not because no candidate failed
};

// `still_fails(candidate)`: whether a valid candidate fails the way the original did. The input
// must fail so (it is not checked here).
Shrink ShrinkScenario(const Scenario& failing, const format::LlamaConfig& config,
                      const std::function<bool(const Scenario&)>& still_fails,
                      const ShrinkBudget& budget = {});

}  // namespace kvdiff::harness
