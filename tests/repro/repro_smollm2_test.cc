// The source document's exact failure on SmolLM2-135M's shape (the smollm2-135m preset, random
// weights): a 5-token prompt, 20 greedy tokens (24 cached positions: the 20th is never fed), and a
// 5-token second prompt on the same cache give candle's "cannot broadcast [5, 5] to [1, 9, 5, 29]".
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/repro/repro_test_util.h"
#include "tests/test_support.h"

namespace kvdiff::testing {
namespace {

using ::testing::HasSubstr;

TEST(ReproSmollm2, ReuseFailsWithTheSourceDocumentsExactError) {
  TempDir dir;
  const auto r = RunKvdiff("repro reuse --preset smollm2-135m", dir.path());
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out,
              HasSubstr("  second  error  Error: cannot broadcast [5, 5] to [1, 9, 5, 29]\n"));
  EXPECT_THAT(r.out, HasSubstr("  first   = ok"));
  EXPECT_THAT(r.out, HasSubstr("as documented:   yes"));
}

TEST(ReproSmollm2, TheShippedScenarioReplaysTheSameError) {
  TempDir dir;
  const auto r =
      RunKvdiff("run " KVDIFF_SOURCE_DIR "/examples/repro/reuse-smollm2.json", dir.path());
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("error: step 3 prefill(second,n=5) on impl: cannot broadcast "
                               "[5, 5] to [1, 9, 5, 29]"));
}

// The document's note on the other direction: a 13-token call at index_pos 32 on a cache that
// holds nothing. 13 prompt tokens + 19 fed = 32 positions reached by the first conversation.
TEST(ReproSmollm2, StalePositionFailsWithTheSourceDocumentsExactError) {
  TempDir dir;
  const auto r = RunKvdiff(
      "repro stale-position --preset smollm2-135m --tokens 1,2,3,4,5,6,7,8,9,10,11,12,13 "
      "--second-tokens 21,22,23,24,25,26,27,28,29,30,31,32,33 -n 20",
      dir.path());
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("Error: cannot broadcast [13, 45] to [1, 9, 13, 13]\n"));
  EXPECT_THAT(r.out, HasSubstr("as documented:   yes"));
}

}  // namespace
}  // namespace kvdiff::testing
