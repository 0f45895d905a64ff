// CompareRows (one fused pass for all but the KL) against the straightforward version it replaced
// (compare_reference.h): every field bit for bit, on random rows, rows full of ties, rows of
// every length around the top-5's size, and rows with NaN and inf where they fall.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "harness/compare/compare.h"
#include "tests/harness/compare_reference.h"

namespace kvdiff::harness {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// Bit equality: a result equal to the reference but for the last bit of a double is a change.
template <typename T>
bool SameBits(T x, T y) {
  return std::memcmp(&x, &y, sizeof(T)) == 0;
}

void ExpectSame(const std::vector<float>& a, const std::vector<float>& b, const Tolerance& tol,
                const std::string& what) {
  const auto n = static_cast<int64_t>(a.size());
  const RowComparison got = CompareRows(a.data(), b.data(), n, tol);
  const RowComparison want = reference::CompareRows(a.data(), b.data(), n, tol);
  SCOPED_TRACE(what);
  EXPECT_EQ(got.nonfinite, want.nonfinite);
  EXPECT_EQ(got.nonfinite_index, want.nonfinite_index);
  EXPECT_TRUE(SameBits(got.nonfinite_a, want.nonfinite_a));
  EXPECT_TRUE(SameBits(got.nonfinite_b, want.nonfinite_b));
  EXPECT_TRUE(SameBits(got.max_abs_diff, want.max_abs_diff))
      << got.max_abs_diff << " vs " << want.max_abs_diff;
  EXPECT_EQ(got.max_diff_index, want.max_diff_index);
  EXPECT_EQ(got.argmax_a, want.argmax_a);
  EXPECT_EQ(got.argmax_b, want.argmax_b);
  EXPECT_EQ(got.top5_overlap, want.top5_overlap);
  EXPECT_TRUE(SameBits(got.margin, want.margin)) << got.margin << " vs " << want.margin;
  EXPECT_TRUE(SameBits(got.kl_divergence, want.kl_divergence))
      << got.kl_divergence << " vs " << want.kl_divergence;
  EXPECT_TRUE(SameBits(got.scale, want.scale));
  EXPECT_TRUE(SameBits(got.gate, want.gate));
  EXPECT_EQ(got.within_tolerance, want.within_tolerance);
}

// b a logits-like row, a = b plus a small error (a cached row against its oracle).
TEST(CompareRowsEquivalence, RandomRowsOfEveryWidth) {
  std::mt19937 rng(36);
  std::normal_distribution<float> logit(0.0f, 4.0f), error(0.0f, 1e-4f);
  for (int64_t n : {1, 2, 3, 4, 5, 6, 7, 11, 64, 256, 4099, 49152}) {
    for (int trial = 0; trial < (n > 1000 ? 4 : 40); ++trial) {
      std::vector<float> a(n), b(n);
      for (int64_t i = 0; i < n; ++i) {
        b[i] = logit(rng);
        a[i] = trial % 4 == 0 ? b[i] : b[i] + error(rng);
      }
      ExpectSame(a, b, Tolerance(1e-4, trial % 2 ? 1e-3 : 0), "random n=" + std::to_string(n));
      ExpectSame(b, a, Tolerance(), "random swapped n=" + std::to_string(n));
    }
  }
}

// Values drawn from a handful of levels: ties everywhere, in the argmax, across the fifth place,
// in max |a-b|, and signed zeros (0.0f == -0.0f ties too).
TEST(CompareRowsEquivalence, RowsFullOfTies) {
  std::mt19937 rng(7);
  const std::vector<float> levels = {-2.0f, -0.0f, 0.0f, 0.5f, 1.0f, 3.0f, 3.0f, 1e30f, -1e30f};
  std::uniform_int_distribution<size_t> pick(0, levels.size() - 1);
  for (int64_t n : {1, 2, 5, 6, 9, 33, 1000}) {
    for (int trial = 0; trial < 60; ++trial) {
      std::vector<float> a(n), b(n);
      for (int64_t i = 0; i < n; ++i) {
        a[i] = levels[pick(rng)];
        b[i] = trial % 3 == 0 ? a[i] : levels[pick(rng)];
      }
      ExpectSame(a, b, Tolerance(1e-4), "ties n=" + std::to_string(n));
    }
  }
  ExpectSame({3, 3, 3, 3, 3, 3, 3}, {3, 3, 3, 3, 3, 3, 3}, Tolerance(), "all equal");
  ExpectSame({1, 3, 3}, {1, 3, 3}, Tolerance(), "ArgmaxTakesTheFirstOfATie");
}

// NaN and inf (either sign) put at random places in one row or both, once or many times: the
// first one is reported, and argmax and top-5 still rank NaN below everything.
TEST(CompareRowsEquivalence, NonFiniteRows) {
  std::mt19937 rng(11);
  std::normal_distribution<float> logit(0.0f, 4.0f);
  const std::vector<float> bad = {kNaN, kInf, -kInf, -kNaN};
  std::uniform_int_distribution<size_t> pick(0, bad.size() - 1);
  for (int64_t n : {1, 2, 5, 6, 17, 300}) {
    std::uniform_int_distribution<int64_t> where(0, n - 1);
    for (int trial = 0; trial < 80; ++trial) {
      std::vector<float> a(n), b(n);
      for (int64_t i = 0; i < n; ++i) a[i] = b[i] = logit(rng);
      const int count = 1 + trial % 6;
      for (int k = 0; k < count; ++k) {
        std::vector<float>& row = (trial + k) % 3 == 0 ? a : b;
        row[where(rng)] = bad[pick(rng)];
      }
      if (trial % 10 == 0) std::fill(a.begin(), a.end(), bad[pick(rng)]);  // a whole bad row
      ExpectSame(a, b, Tolerance(1e-4, 1e-3), "nonfinite n=" + std::to_string(n));
    }
  }
  ExpectSame({kNaN, -kInf, 1}, {kNaN, kNaN, kNaN}, Tolerance(), "NaN beside -inf");
}

}  // namespace
}  // namespace kvdiff::harness
