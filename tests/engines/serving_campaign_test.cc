// The default campaign's batch steps through every kind of engine, from the command line: the
// example plugin (ABI 2, one append_batch per step), a version-1 plugin (the default: items one
// after another), and llama.cpp (one llama_decode over its unified cache) with a micro-batch of 7
// tokens so that batch steps are split; each passes, and llama.cpp's split size is crossed. Then
// the three test-only faults of llama.cpp's batched call (engines/llama_cpp, fault=) are each
// caught with a replay file holding a batch step.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

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

TEST(ServingCampaign, EachFaultOfLlamaCppsBatchedCallIsCaughtWithABatchReplayFile) {
  for (const char* fault : {"batch-shared-positions", "batch-rows-swapped", "batch-one-seq"}) {
    TempDir dir;
    const CommandResult r =
        RunKvdiff(std::string("check --cases 200 --backends 'impl,llama.cpp?fault=") + fault + "'",
                  dir.path());
    EXPECT_EQ(r.exit_code, 1) << fault << "\n" << r.out << r.err;
    const size_t first = r.out.find("FAIL case ");
    ASSERT_NE(first, std::string::npos) << fault << "\n" << r.out;
    const std::string line = r.out.substr(first, r.out.find('\n', first) - first);
    EXPECT_THAT(line, HasSubstr("batch(")) << fault;
    const size_t replay = r.out.find("replay: kvdiff run ", first);
    ASSERT_NE(replay, std::string::npos) << fault;
    const std::string file = r.out.substr(replay + 19, r.out.find('\n', replay) - replay - 19);
    EXPECT_THAT(ReadFile(dir.path() / file), HasSubstr("\"op\":\"batch\"")) << fault;
    std::cout << "figure: " << fault << ": " << line << "\n";
  }
}
#endif

}  // namespace
}  // namespace kvdiff::testing
