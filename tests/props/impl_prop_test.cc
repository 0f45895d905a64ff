// Properties 1-4, 6 and 7 on the impl backend (harness::MakeBackend("impl")): random small models,
// and the fixed "tiny" preset.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <iostream>

#include "tests/props/prop_test_support.h"
#include "tests/props/properties.h"

namespace kvdiff::props {
namespace {

Target Impl() { return Target{ImplFactory(), nullptr}; }
Target ImplTiny() {
  Target target = Impl();
  target.models = GenPresetModel("tiny");
  target.max_positions = 64;  // of its 512
  return target;
}

RC_GTEST_PROP(ImplProps, ChunkingInvariance, ()) { ChunkingProperty(Impl()); }
RC_GTEST_PROP(ImplProps, DecodeMatchesUncachedGreedy, ()) { DecodeProperty(Impl()); }
RC_GTEST_PROP(ImplProps, ResetOrNewSessionLeaksNothing, ()) { ReuseProperty(Impl()); }
RC_GTEST_PROP(ImplProps, OneTokenPromptAfterResetLeaksNothing, ()) {
  ReuseProperty(Impl(), ReuseOptions{1, 1});
}
RC_GTEST_PROP(ImplProps, TruncateThenAppendEqualsScratch, ()) { TruncateProperty(Impl()); }
RC_GTEST_PROP(ImplProps, ForkEvolvesIndependently, ()) { ForkProperty(Impl()); }
KVDIFF_PROP(ImplProps, StatefulConversations, 200) { StatefulProperty(Impl()); }

// Property 7 with its measurement printed: the bound it asserts (kBatchAloneTolerance) is a
// measured figure, so the test says how close impl came to it.
void BatchEqualsAloneMeasured(const Target& target, int default_cases) {
  BatchAloneMeasured() = {};
  CheckGTestWithCases(default_cases, [target] { BatchEqualsAloneProperty(target); });
  const BatchAloneFigures& f = BatchAloneMeasured();
  std::cout << fmt::format(
      "figure: impl batched vs alone: worst max |a-b| {:.1e} over {} rows of {} cases (bound "
      "{:.0e})\n",
      f.worst, f.rows, f.cases, kBatchAloneTolerance);
}
TEST(ImplProps, BatchEqualsItemsAlone) { BatchEqualsAloneMeasured(Impl(), 100); }
TEST(ImplTinyProps, BatchEqualsItemsAlone) { BatchEqualsAloneMeasured(ImplTiny(), 30); }

KVDIFF_PROP(ImplTinyProps, ChunkingInvariance, 30) { ChunkingProperty(ImplTiny()); }
KVDIFF_PROP(ImplTinyProps, DecodeMatchesUncachedGreedy, 30) { DecodeProperty(ImplTiny()); }
KVDIFF_PROP(ImplTinyProps, StatefulConversations, 30) { StatefulProperty(ImplTiny()); }

}  // namespace
}  // namespace kvdiff::props
