// Each kernel against a scalar, obviously-correct double-precision loop written here: dot,
// RMSNorm, softmax, SwiGLU, RoPE and attention. The linear layers are in linear_test.cc.
#include "impl/kernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "format/config.h"
#include "format/error.h"
#include "impl/thread_pool.h"
#include "tests/impl/impl_test_util.h"

namespace kvdiff::impl {
namespace {

using testing::MaxAbsDiff;
using testing::RandomVector;

TEST(KernelsTest, DotMatchesDoubleLoop) {
  for (int64_t n : {1, 5, 31, 32, 33, 64, 576, 1537}) {
    auto a = RandomVector(n, 1), b = RandomVector(n, 2);
    double expected = 0;
    for (int64_t i = 0; i < n; ++i) expected += static_cast<double>(a[i]) * b[i];
    // float32 accumulation of n products of magnitude <= 1: error grows like sqrt(n) * 6e-8.
    EXPECT_NEAR(Dot(a.data(), b.data(), n), expected, 1e-5 * std::sqrt(static_cast<double>(n)))
        << "n=" << n;
  }
}

TEST(KernelsTest, RmsNormMatchesDoubleLoop) {
  const int64_t s = 3, n = 96;
  const float eps = 1e-5f;
  auto x = RandomVector(s * n, 3, 2.0f), w = RandomVector(n, 4);
  std::vector<float> out(s * n);
  RmsNorm(x.data(), w.data(), s, n, eps, out.data());
  std::vector<double> expected(s * n);
  for (int64_t r = 0; r < s; ++r) {
    double ms = 0;
    for (int64_t i = 0; i < n; ++i) ms += static_cast<double>(x[r * n + i]) * x[r * n + i];
    ms /= n;
    for (int64_t i = 0; i < n; ++i) expected[r * n + i] = x[r * n + i] / std::sqrt(ms + eps) * w[i];
  }
  EXPECT_LT(MaxAbsDiff(out, expected), 1e-5);
}

// RMSNorm goes eight rows at a time: every row of a call must get the bits it gets alone, in a
// group of eight, in the rows past the last group, wherever it sits.
TEST(KernelsTest, RmsNormOfManyRowsIsEachRowAloneBitForBit) {
  const int64_t s = 19, n = 96;  // two groups of eight and three rows left over
  const float eps = 1e-5f;
  auto x = RandomVector(s * n, 8, 3.0f), w = RandomVector(n, 9);
  std::vector<float> together(s * n), alone(s * n);
  RmsNorm(x.data(), w.data(), s, n, eps, together.data());
  for (int64_t r = 0; r < s; ++r) RmsNorm(&x[r * n], w.data(), 1, n, eps, &alone[r * n]);
  EXPECT_EQ(together, alone);
}

// Hidden states of ~1e19 (make-model --scale demanding): each square is ~1e38, so a float32 sum of
// n = 64 of them overflows to inf and a naive RMSNorm returns a row of zeros. The row itself and
// its normalized values are ordinary float32 numbers.
TEST(KernelsTest, RmsNormSurvivesASumOfSquaresBeyondFloat32) {
  const int64_t n = 64;
  const float eps = 1e-5f;
  auto x = RandomVector(n, 6, 1.0f), w = RandomVector(n, 7);
  for (float& v : x) v *= 1e19f;
  float naive = 0;
  for (float v : x) naive += v * v;
  ASSERT_TRUE(std::isinf(naive)) << "the test needs a row whose float32 sum of squares overflows";
  std::vector<float> out(n);
  RmsNorm(x.data(), w.data(), 1, n, eps, out.data());
  double ms = 0;
  for (float v : x) ms += static_cast<double>(v) * v;
  ms /= n;
  std::vector<double> expected(n);
  for (int64_t i = 0; i < n; ++i) expected[i] = x[i] / std::sqrt(ms + eps) * w[i];
  EXPECT_LT(MaxAbsDiff(out, expected), 1e-5);
  EXPECT_GT(*std::max_element(out.begin(), out.end()), 0.1f) << "the row normalized to zeros";
}

TEST(KernelsTest, SoftmaxMatchesDoubleLoopAndSurvivesLargeScores) {
  auto x = RandomVector(50, 5, 30.0f);
  x[7] = 1000.0f;  // exp(1000) overflows float unless the max is subtracted first
  std::vector<double> expected(x.size());
  double max = -1e300, sum = 0;
  for (float v : x) max = std::max(max, static_cast<double>(v));
  for (size_t i = 0; i < x.size(); ++i) sum += expected[i] = std::exp(x[i] - max);
  for (double& e : expected) e /= sum;
  Softmax(x.data(), static_cast<int64_t>(x.size()));
  EXPECT_LT(MaxAbsDiff(x, expected), 1e-6);
}

TEST(KernelsTest, SoftmaxPropagatesNaN) {
  std::vector<float> x = {1.0f, NAN, 2.0f, 0.5f};
  Softmax(x.data(), 4);
  for (float v : x) EXPECT_TRUE(std::isnan(v));  // a NaN must never be hidden by a kernel
}

// Enough values to be split between threads (a prefill's gate rows): the same bits for any count.
TEST(KernelsTest, SwiGluMatchesDoubleLoopForAnyThreadCount) {
  const int64_t n = 20000;
  auto g = RandomVector(n, 6, 30.0f), u = RandomVector(n, 7, 3.0f);
  g[0] = 95.0f;  // beyond the float exp range on both sides
  g[1] = -95.0f;
  std::vector<double> expected(n);
  for (int64_t i = 0; i < n; ++i)
    expected[i] = g[i] / (1.0 + std::exp(-static_cast<double>(g[i]))) * u[i];
  std::vector<float> first;
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    std::vector<float> out(n);
    SwiGlu(pool, g.data(), u.data(), n, out.data());
    EXPECT_LT(MaxAbsDiff(out, expected), 1e-5) << "threads=" << threads;
    if (first.empty()) {
      first = out;
    } else {
      EXPECT_EQ(out, first) << "threads=" << threads << " differs from 1 thread";
    }
  }
}

format::LlamaConfig RopeConfig(int64_t head_dim, double theta, int64_t max_pos) {
  format::LlamaConfig c;
  c.head_dim = head_dim;
  c.rope_theta = theta;
  c.max_position_embeddings = max_pos;
  return c;
}

// Spec §3 written out in double, independently of the kernel's code: the llama3 blend included.
std::vector<double> ExpectedInvFreq(const format::LlamaConfig& c) {
  std::vector<double> f;
  for (int64_t i = 0; i < c.head_dim / 2; ++i) {
    double v = std::pow(c.rope_theta, -2.0 * i / c.head_dim);
    if (c.rope_scaling) {
      const auto& r = *c.rope_scaling;
      const double w = 2 * M_PI / v, orig = r.original_max_position_embeddings;
      if (w > orig / r.low_freq_factor) {
        v = v / r.factor;
      } else if (w >= orig / r.high_freq_factor) {
        const double smooth =
            (orig / w - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
        v = (1 - smooth) * v / r.factor + smooth * v;
      }
    }
    f.push_back(v);
  }
  return f;
}

TEST(KernelsTest, RopeTableMatchesDoubleUpToThousandsOfPositions) {
  auto c = RopeConfig(64, 100000.0, 8192);
  RopeTable table = BuildRopeTable(c);
  auto inv = ExpectedInvFreq(c);
  double worst = 0;
  for (int64_t p : {0, 1, 17, 511, 2047, 4000, 8191}) {
    for (int64_t i = 0; i < 32; ++i) {
      worst = std::max(worst, std::abs(table.Cos(p)[i] - std::cos(p * inv[i])));
      worst = std::max(worst, std::abs(table.Sin(p)[i] - std::sin(p * inv[i])));
    }
  }
  // Rounded once from double: half a float ulp of a value <= 1.
  EXPECT_LT(worst, 1e-7);
}

TEST(KernelsTest, Llama3ScalingKeepsHighSlowsLowAndBlendsTheMiddle) {
  auto c = RopeConfig(128, 500000.0, 131072);
  c.rope_scaling = format::RopeScaling{"llama3", 8.0, 1.0, 4.0, 8192};
  auto plain_config = c;
  plain_config.rope_scaling.reset();
  auto scaled = RopeInvFreq(c), plain = RopeInvFreq(plain_config), expected = ExpectedInvFreq(c);
  int kept = 0, slowed = 0, blended = 0;
  for (size_t i = 0; i < scaled.size(); ++i) {
    EXPECT_NEAR(scaled[i], expected[i], 1e-12 * expected[i]) << "i=" << i;
    if (scaled[i] == plain[i]) {
      ++kept;
    } else if (std::abs(scaled[i] - plain[i] / 8.0) < 1e-15) {
      ++slowed;
    } else {
      ++blended;
      EXPECT_LT(scaled[i], plain[i]);
      EXPECT_GT(scaled[i], plain[i] / 8.0);
    }
  }
  // With these Llama-3.1 parameters all three regimes occur.
  EXPECT_GT(kept, 0);
  EXPECT_GT(slowed, 0);
  EXPECT_GT(blended, 0);
}

TEST(KernelsTest, ApplyRopeMatchesRotateHalfInDouble) {
  auto c = RopeConfig(16, 10000.0, 600);
  RopeTable table = BuildRopeTable(c);
  auto inv = ExpectedInvFreq(c);
  const int64_t heads = 3, d = 16, half = 8, pos = 513;
  auto x = RandomVector(heads * d, 11);
  std::vector<double> expected(heads * d);
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t j = 0; j < d; ++j) {
      const double angle = pos * inv[j % half];
      const double rotated = j < half ? -x[h * d + j + half] : x[h * d + j - half];
      expected[h * d + j] = x[h * d + j] * std::cos(angle) + rotated * std::sin(angle);
    }
  }
  ApplyRope(x.data(), heads, half, table.Cos(pos), table.Sin(pos));
  EXPECT_LT(MaxAbsDiff(x, expected), 1e-6);
}

// The spec's attention in double: scores = q·Kᵀ/sqrt(d), key j hidden from row i iff j > past + i,
// softmax, weights·V; query head h reads KV head h / (nh / nkv).
std::vector<double> AttentionInDouble(const std::vector<float>& q, const std::vector<float>& keys,
                                      const std::vector<float>& values, int64_t s, int64_t past,
                                      int64_t nh, int64_t nkv, int64_t d) {
  const int64_t n_rep = nh / nkv;
  std::vector<double> expected(s * nh * d, 0.0);
  for (int64_t i = 0; i < s; ++i) {
    for (int64_t h = 0; h < nh; ++h) {
      const int64_t kvh = h / n_rep;
      std::vector<double> sc(past + i + 1);
      double max = -1e300, sum = 0;
      for (int64_t j = 0; j <= past + i; ++j) {
        double dot = 0;
        for (int64_t c = 0; c < d; ++c)
          dot += static_cast<double>(q[i * nh * d + h * d + c]) * keys[j * nkv * d + kvh * d + c];
        sc[j] = dot / std::sqrt(static_cast<double>(d));
        max = std::max(max, sc[j]);
      }
      for (double& v : sc) sum += v = std::exp(v - max);
      for (int64_t j = 0; j <= past + i; ++j) {
        for (int64_t c = 0; c < d; ++c)
          expected[i * nh * d + h * d + c] += sc[j] / sum * values[j * nkv * d + kvh * d + c];
      }
    }
  }
  return expected;
}

// Attention on `threads` threads.
std::vector<float> AttentionOn(int threads, const std::vector<float>& q,
                               const std::vector<float>& keys, const std::vector<float>& values,
                               int64_t s, int64_t past, int64_t nh, int64_t nkv, int64_t d) {
  ThreadPool pool(threads);
  AttentionScratch scratch;
  scratch.Reserve(threads, s, past + s, nh, d);
  std::vector<float> out(s * nh * d);
  Attention(pool, q.data(), s, past, keys.data(), values.data(), nh, nkv, d, out.data(), scratch);
  return out;
}

// One attention block, prefill and decode, with GQA, against the spec's formula in double.
TEST(KernelsTest, AttentionMatchesDoubleLoopWithGqaAndPastKeys) {
  const int64_t nh = 6, nkv = 2, d = 8;
  for (int64_t past : {0, 5}) {
    for (int64_t s : {1, 4, 131}) {  // 131 > the query tile: two blocks of rows
      const int64_t total = past + s;
      auto q = RandomVector(s * nh * d, 20 + s, 2.0f);
      auto keys = RandomVector(total * nkv * d, 21 + s, 2.0f);
      auto values = RandomVector(total * nkv * d, 22 + s);
      const std::vector<double> expected = AttentionInDouble(q, keys, values, s, past, nh, nkv, d);
      std::vector<float> first;
      for (int threads : {1, 2}) {
        const std::vector<float> out = AttentionOn(threads, q, keys, values, s, past, nh, nkv, d);
        EXPECT_LT(MaxAbsDiff(out, expected), 1e-5) << "past=" << past << " s=" << s;
        if (first.empty())
          first = out;
        else
          EXPECT_EQ(out, first) << "past=" << past << " s=" << s << ": 2 threads differ from 1";
      }
    }
  }
}

// Makes key row j of every KV head g give the first query head of g the score `score`: the row is
// that query scaled (q·k / sqrt(d) = score).
void PlantScore(const std::vector<float>& q, std::vector<float>& keys, int64_t j, int64_t nh,
                int64_t nkv, int64_t d, double score) {
  for (int64_t g = 0; g < nkv; ++g) {
    const float* query = q.data() + g * (nh / nkv) * d;
    double norm2 = 0;
    for (int64_t c = 0; c < d; ++c) norm2 += static_cast<double>(query[c]) * query[c];
    for (int64_t c = 0; c < d; ++c) {
      keys[(j * nkv + g) * d + c] = static_cast<float>(query[c] * score * std::sqrt(d) / norm2);
    }
  }
}

// Decode attention cuts the keys into chunks of 256 and combines them (impl/kernels.cc,
// AttendOneRow), on smollm2's head shape (9 query heads over 3 KV heads of 64). Key counts on
// both sides of a chunk and of a block of 32 rows; flat scores and peaked ones (the row's max in
// the last chunk, far above the others); 1-4 threads, which cut the work into chunks or into a
// chunk's KV heads: the same bits every time.
TEST(KernelsTest, DecodeAttentionOverKeyChunksMatchesDoubleLoop) {
  const int64_t nh = 9, nkv = 3, d = 64;
  for (bool peaked : {false, true}) {
    for (int64_t keys_n : {1, 31, 33, 255, 256, 257, 300, 513, 700}) {
      SCOPED_TRACE(::testing::Message() << keys_n << " keys" << (peaked ? ", peaked" : ""));
      const int64_t past = keys_n - 1;
      const uint32_t seed = static_cast<uint32_t>(keys_n * 10) + (peaked ? 1u : 0u);
      auto q = RandomVector(nh * d, seed, 2.0f);
      auto keys = RandomVector(keys_n * nkv * d, seed + 1, 1.0f);
      auto values = RandomVector(keys_n * nkv * d, seed + 2);
      if (peaked) {  // the row's max in the last chunk, a score 5 below it in the one before:
        // both far above the first chunk's (~10), past float's exp range unless each chunk is
        // rescaled from the row's own max
        if (keys_n > 256) PlantScore(q, keys, keys_n - 1, nh, nkv, d, 155.0);
        if (keys_n > 512) PlantScore(q, keys, 300, nh, nkv, d, 150.0);
      }
      const std::vector<double> expected = AttentionInDouble(q, keys, values, 1, past, nh, nkv, d);
      const std::vector<float> first = AttentionOn(1, q, keys, values, 1, past, nh, nkv, d);
      EXPECT_LT(MaxAbsDiff(first, expected), 1e-5);
      for (int threads : {2, 3, 4}) {
        EXPECT_EQ(AttentionOn(threads, q, keys, values, 1, past, nh, nkv, d), first)
            << threads << " threads differ from 1";
      }
    }
  }
}

}  // namespace
}  // namespace kvdiff::impl
