// Each kernel against a scalar, obviously-correct double-precision loop written here.
#include "impl/kernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <random>
#include <vector>

#include "format/config.h"
#include "format/error.h"
#include "format/safetensors.h"
#include "impl/gemm.h"
#include "impl/thread_pool.h"

namespace kvdiff::impl {
namespace {

std::vector<float> RandomVector(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Rounds every value of w to dtype in place and fills bits with the 16-bit patterns of a WeightView
// of that storage (wdtype); each rounded value must narrow exactly.
void RoundTo16Bits(std::vector<float>& w, format::DType dtype, WeightDtype wdtype,
                   std::vector<uint16_t>* bits) {
  bits->resize(w.size());
  for (size_t i = 0; i < w.size(); ++i) {
    w[i] = format::RoundToDType(w[i], dtype);
    ASSERT_TRUE(NarrowExact(w[i], wdtype, &(*bits)[i])) << "value " << i << ": " << w[i];
  }
}

double MaxAbsDiff(const std::vector<float>& a, const std::vector<double>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(static_cast<double>(a[i]) - b[i]));
  return m;
}

TEST(ThreadPoolTest, ChunksCoverTheRangeOnGrainBoundaries) {
  for (int threads : {1, 2, 3, 7}) {
    for (int64_t n : {1, 15, 16, 17, 100, 576, 49152}) {
      int64_t expected_begin = 0;
      for (int t = 0; t < threads; ++t) {
        auto [b, e] = ThreadPool::Chunk(n, 16, threads, t);
        EXPECT_EQ(b, expected_begin) << "n=" << n << " threads=" << threads << " t=" << t;
        EXPECT_LE(b, e);
        if (e < n) {
          EXPECT_EQ(e % 16, 0);
        }
        expected_begin = e;
      }
      EXPECT_EQ(expected_begin, n);
    }
  }
}

TEST(ThreadPoolTest, EveryIndexRunsExactlyOnceInChunksOnGrainBoundaries) {
  ThreadPool pool(3);
  for (int round = 0; round < 200; ++round) {
    std::vector<int> hits(1000, 0);
    std::vector<int> owner(1000, -1);
    std::vector<int64_t> begins;
    std::mutex mutex;
    pool.ParallelFor(1000, 7, [&](int64_t b, int64_t e, int t) {
      {
        std::lock_guard<std::mutex> lock(mutex);
        begins.push_back(b);
      }
      ASSERT_TRUE(t >= 0 && t < 3);
      for (int64_t i = b; i < e; ++i) {
        ++hits[i];
        owner[i] = t;
      }
    });
    for (int i = 0; i < 1000; ++i) ASSERT_EQ(hits[i], 1) << "index " << i << " round " << round;
    for (int64_t b : begins) ASSERT_EQ(b % 7, 0);
  }
}

TEST(ThreadPoolTest, ForEachRunsEveryItemOnceAndAlone) {
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    for (int64_t n : {int64_t{1}, int64_t{2}, int64_t{5}, int64_t{200}}) {
      std::vector<int> hits(n, 0);
      pool.ParallelForEach(n, [&](int64_t b, int64_t e, int t) {
        ASSERT_EQ(e, b + 1);
        ASSERT_TRUE(t >= 0 && t < threads);
        ++hits[b];
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i], 1) << "item " << i << " of " << n;
    }
  }
}

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

// The same linear layer with 1 and several threads, s == 1 (matrix-vector) and s > 1 (GEMM tiles),
// against a double loop; and bit-identical across thread counts.
TEST(KernelsTest, LinearMatchesDoubleLoopAndIsIdenticalForAnyThreadCount) {
  const int64_t in = 200, out = 300;
  auto w = RandomVector(out * in, 8, 0.1f);
  WeightView view{w.data(), out, in};
  for (int64_t s : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{4}, int64_t{5}, int64_t{7},
                    kLinearRowsMax, kLinearRowsMax + 1, int64_t{130}}) {
    auto x = RandomVector(s * in, 9 + s);
    std::vector<double> expected(s * out);
    for (int64_t r = 0; r < s; ++r) {
      for (int64_t o = 0; o < out; ++o) {
        double acc = 0;
        for (int64_t i = 0; i < in; ++i) acc += static_cast<double>(x[r * in + i]) * w[o * in + i];
        expected[r * out + o] = acc;
      }
    }
    std::vector<float> first;
    for (int threads : {1, 2, 3}) {
      ThreadPool pool(threads);
      std::vector<float> y(s * out);
      Linear(pool, x.data(), s, view, y.data());
      EXPECT_LT(MaxAbsDiff(y, expected), 1e-5) << "s=" << s << " threads=" << threads;
      if (first.empty()) {
        first = y;
      } else {
        EXPECT_EQ(y, first) << "s=" << s << " threads=" << threads << " differs from 1 thread";
      }
    }
  }
}

// The rows path computes each element exactly as the matrix-vector product does: row i of a
// several-row call has the bits of a one-row call on that row (so a chunk and token-by-token
// decoding agree exactly in the projections); and the GEMM path agrees within float rounding.
TEST(KernelsTest, LinearRowsGivesTheBitsOfOneRowCallsAndAgreesWithGemm) {
  const int64_t in = 75, out = 37;  // not multiples of the lane count: the tails are exercised
  auto w = RandomVector(out * in, 21, 0.1f);
  WeightView view{w.data(), out, in};
  ThreadPool pool(2);
  for (int64_t s : {2, 3, 4, 6, 9, 13}) {
    auto x = RandomVector(s * in, 22 + s);
    std::vector<float> rows(s * out), gemm(s * out);
    LinearRows(pool, x.data(), s, view, rows.data());
    LinearGemm(pool, x.data(), s, view, gemm.data());
    for (int64_t i = 0; i < s; ++i) {
      std::vector<float> single(out);
      LinearRows(pool, x.data() + i * in, 1, view, single.data());
      for (int64_t o = 0; o < out; ++o) {
        ASSERT_EQ(rows[i * out + o], single[o]) << "s=" << s << " row " << i << " col " << o;
        ASSERT_EQ(single[o], Dot(w.data() + o * in, x.data() + i * in, in));
      }
    }
    EXPECT_LT(MaxAbsDiff(rows, std::vector<double>(gemm.begin(), gemm.end())), 1e-5) << "s=" << s;
  }
}

// The decode product (s == 1) takes its rows several at a time from streams far apart in each
// thread's run, plus a remainder one at a time: whatever the height of the matrix and the thread
// count, every output is Dot of its own row, bit for bit, in float32 and in bf16 storage. A wrong
// stream offset, output stride or remainder bound puts some row's dot in another's place.
TEST(KernelsTest, DecodeGivesEveryRowTheBitsOfItsOwnDot) {
  const int64_t in = 75;
  const auto x = RandomVector(in, 30);
  for (int64_t out = 1; out <= 60; ++out) {
    auto w = RandomVector(out * in, 31 + out, 0.1f);
    std::vector<uint16_t> bits;
    ASSERT_NO_FATAL_FAILURE(RoundTo16Bits(w, format::DType::kBF16, WeightDtype::kBF16, &bits));
    const WeightView f32{w.data(), out, in};
    const WeightView bf16{nullptr, out, in, bits.data(), WeightDtype::kBF16};
    for (int threads : {1, 2, 3}) {
      ThreadPool pool(threads);
      for (const WeightView& view : {f32, bf16}) {
        std::vector<float> y(out);
        Linear(pool, x.data(), 1, view, y.data());
        for (int64_t o = 0; o < out; ++o) {
          ASSERT_EQ(y[o], Dot(w.data() + o * in, x.data(), in))
              << out << " rows, row " << o << ", " << threads << " threads, "
              << (view.half ? "bf16" : "float32");
        }
      }
    }
  }
}

// The oracle of GemmTile, as its header states it: one fused multiply-add per step, in order.
std::vector<float> GemmOracle(const std::vector<float>& x, int64_t s, const std::vector<float>& w,
                              int64_t r0, int64_t n, int64_t k) {
  std::vector<float> c(s * n);
  for (int64_t i = 0; i < s; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      float acc = 0.0f;
      for (int64_t p = 0; p < k; ++p) acc = std::fma(x[i * k + p], w[(r0 + j) * k + p], acc);
      c[i * n + j] = acc;
    }
  }
  return c;
}

// GemmTile gives the oracle's bits exactly: full and partial row blocks (s around 12), full and
// partial panels (n around 32), an offset r0, k with and without vector tails; from float32, bf16
// and f16 storage of the same values alike.
TEST(KernelsTest, GemmTileGivesTheBitsOfTheScalarOracle) {
  for (int64_t k : {1, 37, 576}) {
    const int64_t rows = 100;
    auto w = RandomVector(rows * k, 40 + k, 0.1f);
    for (int64_t s : {1, 5, 11, 12, 13, 25, 130}) {
      auto x = RandomVector(s * k, 50 + s);
      for (int64_t n : {1, 31, 32, 33, 64, 96}) {
        const int64_t r0 = rows - n;
        const std::vector<float> expected = GemmOracle(x, s, w, r0, n, k);
        std::vector<float> c(s * n, -1.0f);
        GemmTile(x.data(), s, WeightView{w.data(), rows, k}, r0, n, c.data(), n);
        ASSERT_EQ(c, expected) << "k=" << k << " s=" << s << " n=" << n;
      }
    }
    // 16-bit storage: the same bits as the float32 values they hold.
    for (auto [dtype, wdtype] : {std::pair{format::DType::kBF16, WeightDtype::kBF16},
                                 std::pair{format::DType::kF16, WeightDtype::kF16}}) {
      std::vector<float> wr(w);
      std::vector<uint16_t> bits;
      ASSERT_NO_FATAL_FAILURE(RoundTo16Bits(wr, dtype, wdtype, &bits));
      WeightView half{nullptr, rows, k, bits.data(), wdtype};
      const int64_t s = 13, n = 33, r0 = 7;
      auto x = RandomVector(s * k, 77);
      std::vector<float> c(s * n);
      GemmTile(x.data(), s, half, r0, n, c.data(), n);
      ASSERT_EQ(c, GemmOracle(x, s, wr, r0, n, k)) << "k=" << k;
    }
  }
}

// Linear on a 16-bit view gives the bits of Linear on the float32 values it holds, on the rows
// path (1..8 rows) and the GEMM path, for any thread count: 70 output rows (groups of rows and a
// remainder in the decode kernels), 75 inputs (two 32-wide blocks and a tail) or 64 (no tail).
TEST(KernelsTest, LinearOn16BitWeightsGivesTheBitsOfFloat32Weights) {
  const int64_t out = 70;
  for (int64_t in : {75, 64}) {
    for (auto [dtype, wdtype] : {std::pair{format::DType::kBF16, WeightDtype::kBF16},
                                 std::pair{format::DType::kF16, WeightDtype::kF16}}) {
      auto w = RandomVector(out * in, 60, 0.1f);
      std::vector<uint16_t> bits;
      ASSERT_NO_FATAL_FAILURE(RoundTo16Bits(w, dtype, wdtype, &bits));
      const WeightView f32{w.data(), out, in};
      const WeightView half{nullptr, out, in, bits.data(), wdtype};
      for (int threads : {1, 2, 3}) {
        ThreadPool pool(threads);
        for (int64_t s : {1, 2, 5, 8, 9, 40}) {
          auto x = RandomVector(s * in, 61 + s);
          std::vector<float> a(s * out), b(s * out);
          Linear(pool, x.data(), s, f32, a.data());
          Linear(pool, x.data(), s, half, b.data());
          ASSERT_EQ(a, b) << "s=" << s << " threads=" << threads;
          std::vector<float> row(in);
          WidenRow(half, 3, row.data());
          ASSERT_EQ(row, std::vector<float>(w.begin() + 3 * in, w.begin() + 4 * in));
        }
      }
    }
  }
}

// LinearMany (Q, K, V in one region) gives each output the bits of its own Linear call, on both
// paths and for any thread count; outputs of different sizes share the pool's chunks.
TEST(KernelsTest, LinearManyGivesTheBitsOfSeparateLinearCalls) {
  const int64_t in = 48;
  auto wq = RandomVector(80 * in, 31, 0.1f), wk = RandomVector(16 * in, 32, 0.1f),
       wv = RandomVector(33 * in, 33, 0.1f);
  const WeightView q{wq.data(), 80, in}, k{wk.data(), 16, in}, v{wv.data(), 33, in};
  for (int64_t s : {int64_t{1}, int64_t{5}, kLinearRowsMax + 3}) {
    auto x = RandomVector(s * in, 34 + s);
    std::vector<float> q1(s * 80), k1(s * 16), v1(s * 33);
    ThreadPool one(1);
    Linear(one, x.data(), s, q, q1.data());
    Linear(one, x.data(), s, k, k1.data());
    Linear(one, x.data(), s, v, v1.data());
    for (int threads : {1, 2, 3}) {
      ThreadPool pool(threads);
      std::vector<float> q2(s * 80), k2(s * 16), v2(s * 33);
      const LinearOutput outputs[] = {{q, q2.data()}, {k, k2.data()}, {v, v2.data()}};
      LinearMany(pool, x.data(), s, outputs, 3);
      EXPECT_EQ(q2, q1) << "s=" << s << " threads=" << threads;
      EXPECT_EQ(k2, k1) << "s=" << s << " threads=" << threads;
      EXPECT_EQ(v2, v1) << "s=" << s << " threads=" << threads;
    }
  }
}

TEST(KernelsTest, LinearManyRefusesMismatchedInputsAndCounts) {
  std::vector<float> w(64), x(8), y(64);
  ThreadPool pool(1);
  const LinearOutput mixed[] = {{{w.data(), 8, 8}, y.data()}, {{w.data(), 4, 16}, y.data()}};
  try {
    LinearMany(pool, x.data(), 1, mixed, 2);
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(), "LinearMany: output 1 has 16 input features, output 0 has 8");
  }
  try {
    LinearMany(pool, x.data(), 1, mixed, 0);
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(), "LinearMany: expected 1..4 outputs, got 0");
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

// One attention block, prefill and decode, with GQA, against the spec's formula in double:
// scores = q·Kᵀ/sqrt(d), key j hidden from row i iff j > past + i, softmax, weights·V.
TEST(KernelsTest, AttentionMatchesDoubleLoopWithGqaAndPastKeys) {
  const int64_t nh = 6, nkv = 2, d = 8, n_rep = nh / nkv;
  for (int64_t past : {0, 5}) {
    for (int64_t s : {1, 4, 131}) {  // 131 > the query tile: two blocks of rows
      const int64_t total = past + s;
      auto q = RandomVector(s * nh * d, 20 + s, 2.0f);
      auto keys = RandomVector(total * nkv * d, 21 + s, 2.0f);
      auto values = RandomVector(total * nkv * d, 22 + s);
      std::vector<double> expected(s * nh * d, 0.0);
      for (int64_t i = 0; i < s; ++i) {
        for (int64_t h = 0; h < nh; ++h) {
          const int64_t kvh = h / n_rep;
          std::vector<double> sc(past + i + 1);
          double max = -1e300, sum = 0;
          for (int64_t j = 0; j <= past + i; ++j) {
            double dot = 0;
            for (int64_t c = 0; c < d; ++c)
              dot +=
                  static_cast<double>(q[i * nh * d + h * d + c]) * keys[j * nkv * d + kvh * d + c];
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
      std::vector<float> first;
      for (int threads : {1, 2}) {
        ThreadPool pool(threads);
        AttentionScratch scratch;
        scratch.Reserve(threads, std::min<int64_t>(s, kAttentionQueryTile) * total);
        std::vector<float> out(s * nh * d);
        Attention(pool, q.data(), s, past, keys.data(), values.data(), nh, nkv, d, out.data(),
                  scratch);
        EXPECT_LT(MaxAbsDiff(out, expected), 1e-5) << "past=" << past << " s=" << s;
        if (first.empty())
          first = out;
        else
          EXPECT_EQ(out, first) << "past=" << past << " s=" << s << ": 2 threads differ from 1";
      }
    }
  }
}

}  // namespace
}  // namespace kvdiff::impl
