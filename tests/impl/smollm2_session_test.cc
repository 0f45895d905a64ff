// The smollm2-135m preset (the real SmolLM2-135M-Instruct shape: 30 layers, 9 heads, 3 KV heads,
// tied 49152-token head) with random weights: a short prompt, cached against uncached.
#include <gtest/gtest.h>

#include <cstdio>

#include "impl/model.h"
#include "impl/session.h"
#include "tests/impl/impl_test_util.h"

namespace kvdiff::impl {
namespace {

// The project's gate. The preset's attention is tempered with depth (format/random_model.cc) so
// that float32 summation-order noise stays well under it (~5e-5) on this 30-layer shape.
constexpr double kSmollm2Tolerance = testing::kTolerance;
using testing::RandomTokens;
using testing::RowDiff;

TEST(Smollm2SessionTest, TokenByTokenAndChunkedEqualUncachedOn16Tokens) {
  Model model(testing::PresetModel("smollm2-135m", 3), 0);
  const Tokens tokens = RandomTokens(16, model.config().vocab_size, 4);
  const Logits full = model.ForwardFull(tokens);
  for (const std::vector<int>& chunks :
       std::vector<std::vector<int>>{std::vector<int>(16, 1), {5, 11}, {3, 1, 12}}) {
    Session session = model.NewSession();
    double worst = 0;
    int64_t at = 0;
    for (int n : chunks) {
      const Logits got = session.Append(Tokens(tokens.begin() + at, tokens.begin() + at + n));
      for (int64_t i = 0; i < n; ++i) {
        const double diff = RowDiff(got, i, full, at + i);
        worst = std::max(worst, diff);
        EXPECT_LE(diff, kSmollm2Tolerance)
            << "chunks of " << chunks.size() << ", position " << at + i;
      }
      at += n;
    }
    std::printf("smollm2-135m, %zu chunks: max |cached - uncached| over 16 positions = %.3g\n",
                chunks.size(), worst);
  }
  // After Reset, exactly what a new session gives.
  Session used = model.NewSession(64), fresh = model.NewSession(64);
  used.Append(Tokens(tokens.begin(), tokens.begin() + 9));
  used.Reset();
  EXPECT_TRUE(used.Append(Tokens(tokens.begin() + 9, tokens.end())) ==
              fresh.Append(Tokens(tokens.begin() + 9, tokens.end())));
}

}  // namespace
}  // namespace kvdiff::impl
