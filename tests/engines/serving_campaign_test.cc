// The default campaign's batch steps through every kind of engine, from the command line: the
// example plugin (ABI 2, one append_batch per step), a version-1 plugin (the default: items one
// after another), and llama.cpp (one llama_decode over its unified cache) with a micro-batch of 7
// tokens so that batch steps are split; each passes, and llama.cpp's split size is crossed. Then
// the test-only faults of impl's own batched forward (impl/batch_fault.h, impl?fault=) and of
// llama.cpp's batched call (engines/llama_cpp, fault=) are each caught by the default campaign,
// shrunk to a replay file of a few steps holding a batch step, which fails again when replayed.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "tests/mutant_campaign_support.h"
#include "tests/test_support.h"

namespace kvdiff::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(ServingCampaign, TheExamplePluginOfAbi2PassesTheDefaultCampaignsBatchSteps) {
  TempDir dir;
  const CommandResult r = RunKvdiff(
      std::string("check --cases 200 --backends impl,plugin:") + KVDIFF_EXAMPLE_ENGINE, dir.path());
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("  batches:  "));
  EXPECT_THAT(r.out, HasSubstr("PASS: 200 of 200 cases run"));
}

TEST(ServingCampaign, AVersion1PluginPassesThemThroughTheDefault) {
  TempDir dir;
  const CommandResult r = RunKvdiff(
      std::string("check --cases 200 --backends impl,plugin:") + KVDIFF_BROKEN_ENGINE, dir.path());
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("PASS: 200 of 200 cases run"));
}

TEST(ServingCampaign, EachFaultOfImplsBatchedForwardIsCaughtAndShrunkToAFewSteps) {
  for (const char* fault : {"batch-mask-of-part0", "batch-shared-positions", "batch-rows-swapped",
                            "batch-sees-other-sequence"}) {
    ExpectCaughtAndShrunkTo("batch", std::string("impl,impl?fault=") + fault, 6, "batch(");
  }
}

TEST(ServingCampaign, ImplWithoutAFaultPassesTheSameCampaign) {
  TempDir dir;
  const CommandResult r =
      RunKvdiff("check --cases 200 --backends 'impl,impl?fault=none'", dir.path());
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
}

#ifdef KVDIFF_LLAMACPP_ENGINE
TEST(ServingCampaign, LlamaCppWithAMicroBatchOf7PassesAndTheSplitSizeIsCrossed) {
  TempDir dir;
  const CommandResult r =
      RunKvdiff("check --cases 200 --backends 'impl,llama.cpp?ubatch=7'", dir.path());
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("PASS: 200 of 200 cases run"));
  EXPECT_THAT(r.out, HasSubstr("7 llama.cpp?ubatch=7 calls"));
  EXPECT_THAT(r.out, Not(HasSubstr("warning: boundary 7")));
}

// A llama.cpp context of 64 positions a session, 3 sessions and 64 tokens a call: the campaign's
// cases stay within all three (none is refused) and the report says how far they reached.
TEST(ServingCampaign, AnEngineOfSmallLimitsGetsCasesWithinThem) {
  TempDir dir;
  const CommandResult r =
      RunKvdiff("check --cases 100 --backends 'impl,llama.cpp?max_length=64&batch=64&sessions=3'",
                dir.path());
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("longest history 64 of 64"));
  EXPECT_THAT(r.out, HasSubstr("PASS: 100 of 100 cases run"));
}

TEST(ServingCampaign, EachFaultOfLlamaCppsBatchedCallIsCaughtAndShrunkToAFewSteps) {
  for (const char* fault : {"batch-shared-positions", "batch-rows-swapped", "batch-one-seq"})
    ExpectCaughtAndShrunkTo("batch", std::string("impl,llama.cpp?fault=") + fault, 6, "batch(");
}
#endif

}  // namespace
}  // namespace kvdiff::testing
