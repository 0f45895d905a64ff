// The comparison arithmetic on hand-made rows.
#include "harness/compare/compare.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "format/error.h"
#include "harness/compare/tolerance_profile.h"

namespace kvdiff::harness {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

RowComparison Compare(const std::vector<float>& a, const std::vector<float>& b, double tol) {
  return CompareRows(a.data(), b.data(), static_cast<int64_t>(a.size()), tol);
}

TEST(CompareRows, IdenticalRowsAgree) {
  const std::vector<float> a = {0.5f, 3.0f, -1.0f, 2.0f};
  const RowComparison c = Compare(a, a, 0.0);
  EXPECT_FALSE(c.nonfinite);
  EXPECT_EQ(c.max_abs_diff, 0.0);
  EXPECT_EQ(c.argmax_a, 1);
  EXPECT_EQ(c.argmax_b, 1);
  EXPECT_TRUE(c.argmax_agrees());
  EXPECT_EQ(c.top5_overlap, 4);     // only 4 values in the row
  EXPECT_DOUBLE_EQ(c.margin, 1.0);  // 3.0 - 2.0
  EXPECT_TRUE(c.within_tolerance);
}

TEST(CompareRows, MaxDiffArgmaxAndMarginOfTheOracle) {
  //                           0     1     2     3     4     5     6
  const std::vector<float> a = {1.0f, 5.0f, 2.0f, 0.0f, 4.0f, 0.5f, 3.0f};
  const std::vector<float> b = {1.0f, 4.0f, 2.5f, 0.0f, 4.25f, 0.5f, 3.0f};
  const RowComparison c = Compare(a, b, 0.5);
  EXPECT_DOUBLE_EQ(c.max_abs_diff, 1.0);
  EXPECT_EQ(c.max_diff_index, 1);
  EXPECT_EQ(c.argmax_a, 1);
  EXPECT_EQ(c.argmax_b, 4);
  EXPECT_FALSE(c.argmax_agrees());
  EXPECT_DOUBLE_EQ(c.margin, 0.25);  // b: 4.25 - 4.0
  // top5(a) = {1,4,6,2,0}; top5(b) = {4,1,6,2,0}: all five shared.
  EXPECT_EQ(c.top5_overlap, 5);
  EXPECT_FALSE(c.within_tolerance);
  EXPECT_TRUE(Compare(a, b, 1.0).within_tolerance) << "the gate is max |a-b| <= tolerance";
}

TEST(CompareRows, TopFiveOverlapCountsSharedIndices) {
  // a's top five: 0..4; b's top five: 3..7 -> shared {3, 4}.
  const std::vector<float> a = {9, 8, 7, 6, 5, 0, 0, 0, 0, 0};
  const std::vector<float> b = {0, 0, 0, 6, 5, 9, 8, 7, 0, 0};
  EXPECT_EQ(Compare(a, b, 100).top5_overlap, 2);
  EXPECT_EQ(Compare(a, a, 0).top5_overlap, 5);
}

TEST(CompareRows, NonFiniteIsReportedFirstWithBothValues) {
  const std::vector<float> a = {1.0f, 2.0f, 100.0f, kNaN, 1.0f, 1.0f};
  const std::vector<float> b = {1.0f, 2.0f, 0.0f, 3.0f, 1.0f, kInf};
  const RowComparison c = Compare(a, b, 1e9);
  EXPECT_TRUE(c.nonfinite);
  EXPECT_EQ(c.nonfinite_index, 3);
  EXPECT_TRUE(std::isnan(c.nonfinite_a));
  EXPECT_EQ(c.nonfinite_b, 3.0f);
  EXPECT_TRUE(std::isinf(c.max_abs_diff));
  EXPECT_FALSE(c.within_tolerance) << "a NaN never passes, whatever the tolerance";
  EXPECT_EQ(c.argmax_a, 2) << "NaN never wins the argmax";
}

TEST(CompareRows, InfinityInTheOracleAlsoFails) {
  const std::vector<float> a = {1.0f, 2.0f};
  const std::vector<float> b = {-kInf, 2.0f};
  const RowComparison c = Compare(a, b, 1.0);
  EXPECT_TRUE(c.nonfinite);
  EXPECT_EQ(c.nonfinite_index, 0);
  EXPECT_EQ(c.nonfinite_b, -kInf);
  EXPECT_FALSE(c.within_tolerance);
}

TEST(CompareRows, ArgmaxTakesTheFirstOfATie) {
  const std::vector<float> a = {1.0f, 3.0f, 3.0f};
  EXPECT_EQ(Argmax(a.data(), 3), 1);
  const RowComparison c = Compare(a, a, 0);
  EXPECT_EQ(c.margin, 0.0) << "a tie has no margin";
}

TEST(CompareRows, KlDivergenceOfTheSoftmaxes) {
  const std::vector<float> a = {0.0f, 0.0f}, b = {std::log(3.0f), 0.0f};
  // p_b = (3/4, 1/4), p_a = (1/2, 1/2): KL(p_b || p_a) = 3/4 ln(3/2) + 1/4 ln(1/2).
  const double want = 0.75 * std::log(1.5) + 0.25 * std::log(0.5);
  EXPECT_NEAR(Compare(a, b, 1.0).kl_divergence, want, 1e-7);
  EXPECT_EQ(Compare(b, b, 0.0).kl_divergence, 0.0);
  // A shift of every logit leaves the distribution, and so the KL, unchanged.
  const std::vector<float> shifted = {std::log(3.0f) + 100.0f, 100.0f};
  EXPECT_NEAR(Compare(shifted, b, 1000.0).kl_divergence, 0.0, 1e-9);
  EXPECT_EQ(Compare({kNaN, 0.0f}, b, 1.0).kl_divergence, 0.0);  // not finite: no KL
}

TEST(DistributionStats, CountsAgreementOverlapAndKl) {
  DistributionStats s;
  s.Add(Compare({1.0f, 0.0f}, {1.0f, 0.0f}, 0.0));
  s.Add(Compare({0.0f, 1.0f}, {1.0f, 0.0f}, 1.0));  // the argmax differs
  DistributionStats other;
  other.Add(Compare({1.0f, 0.0f}, {1.0f, 0.0f}, 0.0));
  s.Merge(other);
  EXPECT_EQ(s.rows, 3);
  EXPECT_EQ(s.argmax_agree, 2);
  EXPECT_EQ(s.top5_overlap_sum, 6);  // rows of two values: both always shared
  EXPECT_GT(s.kl_max, 0.4);          // (e - 1)/(e + 1) ~ 0.46
  EXPECT_DOUBLE_EQ(s.kl_sum, s.kl_max);
  EXPECT_EQ(s.Text().substr(0, 40), "argmax agrees on 2 of 3 rows (66.67%), t");
}

TEST(CompareRows, RefusesAnEmptyRow) {
  const float x = 0;
  EXPECT_THROW(CompareRows(&x, &x, 0, 1e-4), InputError);
}

// The relative gate (demanding models): max(abs, rel * max |b|), with the scale taken from b, the
// oracle row.
TEST(CompareRows, RelativeToleranceScalesWithTheOracleRow) {
  const std::vector<float> b = {-3000.0f, 1000.0f, 2.0f};
  const std::vector<float> a = {-2999.5f, 1000.0f, 2.0f};  // off by 0.5: 1.7e-4 of 3000
  EXPECT_FALSE(CompareRows(a.data(), b.data(), 3, 1e-4).within_tolerance);
  const RowComparison c = CompareRows(a.data(), b.data(), 3, Tolerance(1e-4, 1e-3));
  EXPECT_TRUE(c.within_tolerance);
  EXPECT_DOUBLE_EQ(c.scale, 3000.0);
  EXPECT_DOUBLE_EQ(c.gate, 3.0);
  EXPECT_NEAR(c.relative_diff(), 0.5 / 3000.0, 1e-12);
  EXPECT_FALSE(CompareRows(a.data(), b.data(), 3, Tolerance(1e-4, 1e-4)).within_tolerance);
  // Small logits: the absolute part still holds.
  const std::vector<float> small_b = {0.001f, 0.0f}, small_a = {0.00105f, 0.0f};
  EXPECT_TRUE(
      CompareRows(small_a.data(), small_b.data(), 2, Tolerance(1e-4, 1e-3)).within_tolerance);
  // NaN is never within, whatever the gate.
  const std::vector<float> nan_a = {std::nanf(""), 1000.0f, 2.0f};
  const RowComparison n = CompareRows(nan_a.data(), b.data(), 3, Tolerance(1e-4, 0.5));
  EXPECT_FALSE(n.within_tolerance);
  EXPECT_TRUE(std::isinf(n.relative_diff()));
  EXPECT_EQ(Tolerance(1e-4, 1e-3).ToString(), "abs 1.0e-04 or rel 1.0e-03 of max |logit|");
}

// A tolerance profile's KL gate (a quantized cache's): a row within the max-abs bound still fails
// when its next-token distribution moved further than kl_max; without a KL gate it passes.
TEST(CompareRows, AKlGateFailsARowWithinTheMaxAbsBoundWhoseDistributionMoved) {
  const std::vector<float> b = {4.0f, 3.0f, 0.0f, -1.0f};
  const std::vector<float> a = {3.0f, 4.0f, 0.0f, -1.0f};  // the top two swapped: 1.0 apart
  const RowComparison plain = CompareRows(a.data(), b.data(), 4, Tolerance(1.5));
  EXPECT_TRUE(plain.within_tolerance);
  EXPECT_FALSE(plain.beyond_kl_gate());
  const double kl = plain.kl_divergence;
  EXPECT_GT(kl, 0.2);  // p_b = (.71, .26, ...): KL = (.71 - .26) * 1.0 = 0.45 nats
  const RowComparison gated = CompareRows(a.data(), b.data(), 4, Tolerance(1.5, 0, 0.1));
  EXPECT_FALSE(gated.within_tolerance);
  EXPECT_TRUE(gated.beyond_kl_gate());
  EXPECT_DOUBLE_EQ(gated.kl_gate, 0.1);
  EXPECT_TRUE(CompareRows(a.data(), b.data(), 4, Tolerance(1.5, 0, 2 * kl)).within_tolerance);
  EXPECT_TRUE(CompareRows(b.data(), b.data(), 4, Tolerance(1e-4, 0, 1e-9)).within_tolerance);
  EXPECT_EQ(Tolerance(1.5, 0, 0.1).ToString(), "abs 1.5e+00, KL <= 1.0e-01");
}

// A profile is chosen by what a backend declares: its cache dtype, its compute dtype, the looser
// of the two when both have one; nothing for float32 or an unmeasured dtype.
TEST(ToleranceProfile, IsChosenByTheDeclaredCacheOrComputeDtype) {
  BackendInfo info;
  EXPECT_EQ(ProfileFor(info), nullptr);
  info.cache_dtype = "q5_1";
  EXPECT_EQ(ProfileFor(info), nullptr);
  info.cache_dtype = "q8_0";
  ASSERT_NE(ProfileFor(info), nullptr);
  EXPECT_EQ(ProfileName(*ProfileFor(info)), "q8_0");
  EXPECT_GT(ProfileFor(info)->kl_max, 0);
  EXPECT_LT(ProfileFor(info)->own_max_abs, ProfileFor(info)->max_abs);
  info.cache_dtype = "f16";
  info.compute_dtype = "bf16";
  ASSERT_NE(ProfileFor(info), nullptr);
  EXPECT_EQ(ProfileName(*ProfileFor(info)), "compute bf16");  // looser than f16's
  info.cache_dtype = "";
  info.compute_dtype = "f16";  // a cache profile's dtype, not a compute one's
  EXPECT_EQ(ProfileFor(info), nullptr);
}

}  // namespace
}  // namespace kvdiff::harness
