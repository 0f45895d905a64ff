// The order a campaign's jobs claim its cases in: the costliest first, so that the long cases
// start while other jobs still have short ones to run beside them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "harness/scenario/scenario.h"

namespace kvdiff::harness {

// A forward call costs about as much as this many tokens of a prefill, whatever its size: every
// call reads all the weights once. On smollm2-135m a decode step takes ~15 ms and a prefill token
// ~1.3 ms (`kvdiff bench`, one thread), so a call is ~11 tokens; on smaller models calls weigh
// relatively more, and the order only has to be roughly right.
inline constexpr int64_t kCallCostInTokens = 11;

// A scenario's cost in tokens: per forward call kCallCostInTokens plus its tokens twice (cached,
// and again in the oracle's uncached ForwardFull of the history).
int64_t EstimatedCost(const Scenario& scenario);

// `cases` (indices into scenarios) ordered by EstimatedCost, costliest first; equal costs keep
// their order. A function of the scenarios alone, so every job count claims in the same order.
std::vector<size_t> CostliestFirst(const std::vector<Scenario>& scenarios,
                                   const std::vector<size_t>& cases);

}  // namespace kvdiff::harness
