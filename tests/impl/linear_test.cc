// The linear layers (impl/linear.cc, impl/gemm.cc) against a double-precision loop and against
// each other: the rows path, the decode product and the GEMM tiles, from float32 and 16-bit
// weights, for any thread count.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "format/error.h"
#include "format/safetensors.h"
#include "impl/gemm.h"
#include "impl/kernels.h"
#include "impl/thread_pool.h"
#include "tests/impl/impl_test_util.h"

namespace kvdiff::impl {
namespace {

using testing::MaxAbsDiff;
using testing::RandomVector;

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

}  // namespace
}  // namespace kvdiff::impl
