// The power of the campaign's follow-ups (harness/campaign/follow_up.h): each wrong engine of
// tests/harness/deferring_backend.h (a reset or a shift applied at the next append only and
// forgotten by a fork, a truncate by one or from past 300 that keeps rows, a ninth session given
// the first one's cache) fails the default campaign's 200 cases; the same wrapper without a bug
// passes them. Each prints how many cases it fails with and without follow-ups.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <iostream>
#include <map>
#include <memory>

#include "harness/backend/registry.h"
#include "harness/campaign/campaign.h"
#include "tests/harness/deferring_backend.h"
#include "tests/harness/harness_test_util.h"
#include "tests/test_support.h"

namespace kvdiff::testing {
namespace {

constexpr int64_t kCases = 200;  // what the README's `ci/demo` runs

class FollowUpMutants : public ::testing::Test {
 protected:
  const harness::ModelSpec model_ = TinyModel();
  const std::shared_ptr<const format::ModelWeights> weights_ = harness::LoadModelFor(model_);
  const std::unique_ptr<harness::Backend> impl_ = harness::MakeBackend("impl", weights_, 1);
};

// Without follow-ups four of the five passed all 200 cases when this was written (the truncate by
// one failed a few): printed, not asserted, since the cases' own steps may come to catch them.
TEST_F(FollowUpMutants, EachDeferredOrSizedBugFailsTheDefaultCampaign) {
  for (Bug bug :
       {Bug::kLazyResetForkForgets, Bug::kLazyShiftForkForgets, Bug::kTruncateByOneKeepsRow,
        Bug::kDeepTruncateKeepsRows, Bug::kNinthSessionReusesFirst, Bug::kNone}) {
    const Deferring engine(harness::MakeBackend("impl", weights_, 1), bug);
    std::map<bool, int64_t> failed;
    for (bool follow_ups : {false, true}) {
      TempDir out;
      harness::CampaignOptions options;
      options.cases = kCases;
      options.out_dir = out.path();
      options.shrink_cases = 0;
      options.generation.follow_ups = follow_ups;
      const harness::CampaignReport report =
          harness::RunCampaign(model_, {&engine, impl_.get()}, options);
      for (const harness::CaseResult& r : report.results) failed[follow_ups] += !r.passed;
    }
    std::cout << fmt::format("figure: bug {}: {} of {} cases failed without follow-ups, {} with\n",
                             static_cast<int>(bug), failed[false], kCases, failed[true]);
    if (bug == Bug::kNone) {
      EXPECT_EQ(failed[true], 0);
    } else {
      EXPECT_GT(failed[true], 0) << static_cast<int>(bug);
    }
  }
}

}  // namespace
}  // namespace kvdiff::testing
