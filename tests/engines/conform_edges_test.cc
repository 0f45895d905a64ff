// conform's checks of deferred and sized work (harness/conform/conform_edges.cc, and after-shift
// in conform_shift.cc) prove their power: impl behind a session that defers a reset or a shift to
// the next append (and forgets it on a fork), keeps the dropped row of a truncate by one or of a
// truncate from past 300 to below it, or gives a ninth session the first one's cache, fails the
// check written for that bug (tests/harness/deferring_backend.h; the default campaign's
// follow-ups catch them too: tests/harness/follow_up_test.cc). The same wrapper without a bug
// passes every check.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "harness/backend/registry.h"
#include "harness/conform/conform.h"
#include "harness/run/differential_run.h"
#include "tests/engines/conform_table.h"
#include "tests/harness/deferring_backend.h"
#include "tests/harness/harness_test_util.h"

namespace kvdiff::testing {
namespace {

using ::testing::HasSubstr;

class ConformEdges : public ::testing::Test {
 protected:
  harness::ConformReport Run(Bug bug) const {
    const Deferring engine(harness::MakeBackend("impl", weights_, 1), bug);
    harness::ConformOptions options;
    options.campaign_cases = 0;
    return harness::RunConformance(model_, engine, *impl_, options);
  }
  const harness::ModelSpec model_ = TinyModel();
  const std::shared_ptr<const format::ModelWeights> weights_ = harness::LoadModelFor(model_);
  const std::unique_ptr<harness::Backend> impl_ = harness::MakeBackend("impl", weights_, 1);
};

TEST_F(ConformEdges, TheWrapperWithoutABugPassesEveryCheck) {
  const harness::ConformReport report = Run(Bug::kNone);
  EXPECT_TRUE(report.Passed()) << report.Table();
  EXPECT_EQ(report.checks.size(), 21u) << report.Table();
}

TEST_F(ConformEdges, EachDeferredOrSizedBugFailsTheCheckWrittenForIt) {
  const std::pair<Bug, const char*> cases[] = {
      {Bug::kLazyResetForkForgets, "after-reset"},
      {Bug::kLazyShiftForkForgets, "after-shift"},
      {Bug::kTruncateByOneKeepsRow, "truncate-by-one"},
      {Bug::kDeepTruncateKeepsRows, "long-history"},
      {Bug::kNinthSessionReusesFirst, "many-sessions"},
  };
  for (const auto& [bug, check] : cases) {
    const harness::ConformReport report = Run(bug);
    EXPECT_THAT(RowOf("\n" + report.Table(), check), HasSubstr("FAIL")) << check << "\n"
                                                                        << report.Table();
  }
}

}  // namespace
}  // namespace kvdiff::testing
