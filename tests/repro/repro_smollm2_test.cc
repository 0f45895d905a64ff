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
      RunKvdiff("run " KVDIFF_SOURCE_DIR "/harness/repro/reuse-smollm2.json", dir.path());
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("error: step 3 prefill(second,n=5) on impl: cannot broadcast "
                               "[5, 5] to [1, 9, 5, 29]"));
}

}  // namespace
}  // namespace kvdiff::testing
