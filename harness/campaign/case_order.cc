#include "harness/campaign/case_order.h"

#include <algorithm>

#include "harness/scenario/conversations.h"

namespace kvdiff::harness {

int64_t EstimatedCost(const Scenario& scenario) {
  Conversations convs;
  int64_t cost = 0;
  for (const Step& s : scenario.steps) {
    for (const ForwardCall& call : convs.CallsOf(s)) cost += kCallCostInTokens + 2 * call.size;
    convs.Apply(s);
  }
  return cost;
}

std::vector<size_t> CostliestFirst(const std::vector<Scenario>& scenarios,
                                   const std::vector<size_t>& cases) {
  std::vector<int64_t> cost(scenarios.size(), 0);
  for (size_t i : cases) cost[i] = EstimatedCost(scenarios[i]);
  std::vector<size_t> order = cases;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return cost[a] > cost[b]; });
  return order;
}

}  // namespace kvdiff::harness
