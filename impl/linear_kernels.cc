// The hot kernels of the linear layers (impl/linear.cc): the decode matrix-vector products and the
// rows path's dot products, for weights in any storage (float32, bf16, f16). Compiled once per
// instruction set (impl/isa.h, impl/CMakeLists.txt); each compilation sums every element in Dot's
// order (kernels.h), with explicit fused multiply-adds, so every variant gives the same bits.
#include <cmath>
#include <cstdint>

#include "impl/isa.h"
#include "impl/kernel_table.h"
#include "impl/kernels.h"
#include "impl/reduction.h"
#include "impl/simd.h"
#include "impl/weight_load.h"

namespace kvdiff::impl {
inline namespace KVDIFF_ISA {
namespace {

// The matrix-vector products stream every weight from DRAM once per token, and the hardware
// prefetcher alone keeps too few cache lines in flight for that: each weight line is asked for
// kPrefetchAhead bytes before the kernel reads it (rows lie back to back, so the hint runs on into
// the next rows). Measured on smollm2-135m shapes, one thread, weights from DRAM (kernels_bench
// BM_MatVecCold, 1536 x 576): bf16 5.8 -> 10.2 GB/s, float32 7.8 -> 10.7 GB/s; distances from 4 to
// 16 KiB do about as well, 32 KiB worse. With the decode rows taken from three streams (see
// DecodeRows) 2 to 4 KiB ahead per stream did as well as 8 and better than 6 (bf16 at context 512:
// 14.6-14.7 ms a step against 15.1), and 4 KiB is one page ahead.
constexpr uintptr_t kPrefetchAhead = 4096;
// Every line of the kLanes values of T at p, kPrefetchAhead bytes ahead.
template <class T, int kLanes>
inline void PrefetchLanesAhead(const T* p) {
  PrefetchLinesAhead(p, kPrefetchAhead, kLanes * sizeof(T));
}

// Dots of one weight row w with N input rows x, x + x_stride, ...: out[n] = Dot(w, x_n, cols),
// summed in exactly Dot's order (same lanes, same tree), so the rows path gives the same bits as
// the matrix-vector path. The N * 32 running sums are independent chains: the loop is bound by
// loads from L1, not by the latency of the adds. With 16-bit storage each weight is widened as it
// is loaded (Load::Get): the same products, the same sums, half the bytes read from memory.
#if defined(KVDIFF_HAS_VEC)
// With vector registers, Dot's 32 lanes are 32 / kVecWidth registers per input row, all N rows'
// in registers for the whole row of weights (the compiler's vectorization of the plain loop below
// spilled them: 4 rows of float32 took 2.3x the time of 2 rows, kernels_bench BM_LinearFewRows).
// Each weight vector is widened once and used for every input row before the next is loaded.
template <int N, class Load = LoadF32>
void DotRows(const typename Load::T* __restrict w, const float* __restrict x, int64_t x_stride,
             int64_t cols, float* out, int64_t out_stride) {
  constexpr int kLanes = 32, kVecs = kLanes / kVecWidth;
  Vec acc[N][kVecs];
  for (int n = 0; n < N; ++n) {
    for (int v = 0; v < kVecs; ++v) acc[n][v] = VecZero();
  }
  int64_t i = 0;
  for (; i + kLanes <= cols; i += kLanes) {
    PrefetchLanesAhead<typename Load::T, kLanes>(w + i);
    for (int v = 0; v < kVecs; ++v) {
      const Vec wv = VecWiden<Load>(w + i + v * kVecWidth);
      for (int n = 0; n < N; ++n) {
        acc[n][v] = VecFma(wv, VecLoad(x + n * x_stride + i + v * kVecWidth), acc[n][v]);
      }
    }
  }
  if (i == cols) {  // no tail: the tree in registers (a short row's dot is mostly its tree)
    for (int n = 0; n < N; ++n) out[n * out_stride] = VecFold32(acc[n]);
    return;
  }
  for (int n = 0; n < N; ++n) {
    float lanes[kLanes];
    for (int v = 0; v < kVecs; ++v) VecStore(lanes + v * kVecWidth, acc[n][v]);
    const float* xn = x + n * x_stride;
    for (int64_t t = i, j = 0; t < cols; ++t, ++j)
      lanes[j] = Fma(Load::Get(w + t), xn[t], lanes[j]);
    out[n * out_stride] = FoldLanes<kLanes>(lanes);
  }
}
// Input rows per pass over a weight row. AVX2: 3 (3 x 4 sums in 16 registers). AVX-512: 4, though
// 8 x 2 sums would fit its 32 registers: one pass of 8 rows took 1.5x the time of two passes of 4
// (BM_LinearFewRows s=8, float32, 2 threads: 376-386 against 253-262 us; the weight row is in L1
// for the second pass).
constexpr int kRowsPerPass = kVecWidth == 16 ? 4 : 3;
#else
template <int N, class Load = LoadF32>
void DotRows(const typename Load::T* __restrict w, const float* __restrict x, int64_t x_stride,
             int64_t cols, float* out, int64_t out_stride) {
  constexpr int kLanes = 32;
  float acc[N][kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= cols; i += kLanes) {
    PrefetchLanesAhead<typename Load::T, kLanes>(w + i);
    float wv[kLanes];
    for (int j = 0; j < kLanes; ++j) wv[j] = Load::Get(w + i + j);
    for (int n = 0; n < N; ++n) {
      const float* xn = x + n * x_stride;
      for (int j = 0; j < kLanes; ++j) acc[n][j] = Fma(wv[j], xn[i + j], acc[n][j]);
    }
  }
  for (int j = 0; i < cols; ++i, ++j) {
    const float wi = Load::Get(w + i);
    for (int n = 0; n < N; ++n) acc[n][j] = Fma(wi, x[n * x_stride + i], acc[n][j]);
  }
  for (int n = 0; n < N; ++n) out[n * out_stride] = FoldLanes<kLanes>(acc[n]);
}
constexpr int kRowsPerPass = 4;
#endif

// Dots of R weight rows w, w + w_stride, ... with one input row x: out[r * out_stride] =
// Dot(w_r, x, cols), each summed in exactly Dot's order. The decode matrix-vector product: one
// row alone is 2 vector chains of adds, bound by their latency; R rows at once are 2R independent
// chains, so the loop waits on memory, as a matrix-vector product should, not on the adder.
template <int R, class Load>
void DotWeightRows(const typename Load::T* __restrict w, int64_t w_stride,
                   const float* __restrict x, int64_t cols, float* out, int64_t out_stride) {
  constexpr int kLanes = 32;
  float acc[R][kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= cols; i += kLanes) {
    for (int r = 0; r < R; ++r) {
      const typename Load::T* wr = w + r * w_stride;
      PrefetchLanesAhead<typename Load::T, kLanes>(wr + i);
      for (int j = 0; j < kLanes; ++j) acc[r][j] = Fma(Load::Get(wr + i + j), x[i + j], acc[r][j]);
    }
  }
  for (int j = 0; i < cols; ++i, ++j) {
    for (int r = 0; r < R; ++r) acc[r][j] = Fma(Load::Get(w + r * w_stride + i), x[i], acc[r][j]);
  }
  for (int r = 0; r < R; ++r) out[r * out_stride] = FoldLanes<kLanes>(acc[r]);
}

// The last `rows` < kRowsPerPass input rows of RowsOfOne: DotRows instantiated for that count.
template <class Load, int N = 1>
void DotRowsTail(int rows, const typename Load::T* wr, const float* x, int64_t cols, float* out,
                 int64_t out_stride) {
  if constexpr (N < kRowsPerPass) {
    if (rows == N) return DotRows<N, Load>(wr, x, cols, cols, out, out_stride);
    DotRowsTail<Load, N + 1>(rows, wr, x, cols, out, out_stride);
  }
}

// y rows [r, r + 1) of one output, for every input row: the weight row is read from memory once,
// then from L1 for each group of up to kRowsPerPass input rows.
template <class Load>
void RowsOfOne(const float* x, int64_t s, const typename Load::T* wr, int64_t rows, int64_t cols,
               int64_t r, float* y) {
  int64_t i = 0;
  for (; i + kRowsPerPass <= s; i += kRowsPerPass) {
    DotRows<kRowsPerPass, Load>(wr, x + i * cols, cols, cols, y + i * rows + r, rows);
  }
  if (i < s)
    DotRowsTail<Load>(static_cast<int>(s - i), wr, x + i * cols, cols, y + i * rows + r, rows);
}

// y[r .. r + n) of one output for a single input row (decode), R weight rows at a time taken from
// R streams: the run is cut into R parts of q = n / R rows, and rows r + i, r + i + q, ... go
// together (the n - R * q rows left over go one at a time). Each row's sum is Dot's whatever its
// company, so the bits do not depend on the grouping. R rows at once keep 2R vector chains of adds
// in flight, not 2 (hot float32 576 x 576 on one core, kernels_bench BM_MatVec: 50 us one row at
// a time, 37 us four adjacent rows, 36 us three streams); taking them far apart rather than
// adjacent keeps R separate runs of pages streaming from DRAM, where adjacent rows share their
// pages and the hardware prefetcher follows one. Measured on the smollm2-135m
// shape, 2 threads, decode steps interleaved in one process (11 rounds, medians; a throwaway A/B
// harness): bf16 16.3 -> 13.2 ms a step at context 64, 17.2 -> 14.6 at 512 for three streams
// against four adjacent rows (two and four streams did about as well); float32 2-4% faster, within
// the noise. f16 rows go one at a time, where more measured slower with the compiler's widening,
// and so do bf16 rows on the paths without AVX-512 (three streams there were no faster in three
// alternations on an AMD EPYC). With AVX-512 the compiler widens the bf16 rows in 16-lane
// registers; a hand-written split-lane kernel (one 64-byte load of 32 bf16 weights split into even
// and odd lanes, git 02a6897) measured faster than the compiler's four adjacent rows on the first
// machine, but on an AMD EPYC (Zen 5 class, 2 threads, bf16 smollm2-135m) the compiler's three
// streams decoded 5% faster than it did in three streams, six alternations:
// 160-162 against 151-154 tok/s at context 64, 140-144 against 132-138 at 512.
constexpr int kDecodeStreams = 3;
#if defined(__AVX512F__)
constexpr int kBF16DecodeStreams = kDecodeStreams;
#else
constexpr int kBF16DecodeStreams = 1;
#endif
template <class Load, int R>
void DecodeRows(const float* x, const typename Load::T* w, int64_t cols, int64_t r, int64_t n,
                float* y) {
  const int64_t q = n / R;
  for (int64_t i = 0; i < q; ++i) {
    DotWeightRows<R, Load>(w + (r + i) * cols, q * cols, x, cols, y + r + i, q);
  }
  for (int64_t i = R * q; i < n; ++i) {
    DotWeightRows<1, Load>(w + (r + i) * cols, cols, x, cols, y + r + i, 1);
  }
}

}  // namespace

void DecodeRowsKernel(const float* x, const WeightView& w, int64_t r, int64_t n, float* y) {
  switch (w.dtype) {
    case WeightDtype::kF32:
      return DecodeRows<LoadF32, kDecodeStreams>(x, w.data, w.cols, r, n, y);
    case WeightDtype::kBF16:
      return DecodeRows<LoadBF16, kBF16DecodeStreams>(x, w.half, w.cols, r, n, y);
    case WeightDtype::kF16:
      return DecodeRows<LoadF16, 1>(x, w.half, w.cols, r, n, y);
  }
}

void RowsOfOneKernel(const float* x, int64_t s, const WeightView& w, int64_t r, float* y) {
  switch (w.dtype) {
    case WeightDtype::kF32:
      return RowsOfOne<LoadF32>(x, s, WeightRow(w, r), w.rows, w.cols, r, y);
    case WeightDtype::kBF16:
      return RowsOfOne<LoadBF16>(x, s, HalfWeightRow(w, r), w.rows, w.cols, r, y);
    case WeightDtype::kF16:
      return RowsOfOne<LoadF16>(x, s, HalfWeightRow(w, r), w.rows, w.cols, r, y);
  }
}

void DotRowsKernel(const float* w, const float* x, int64_t s, int64_t cols, float* out,
                   int64_t out_stride) {
  RowsOfOne<LoadF32>(x, s, w, out_stride, cols, 0, out);
}

#define KVDIFF_NAME_OF(isa) #isa
#define KVDIFF_NAME(isa) KVDIFF_NAME_OF(isa)
extern const KernelTable kKernels = {KVDIFF_NAME(KVDIFF_ISA), GemmTileKernel,
                                     DecodeRowsKernel,        RowsOfOneKernel,
                                     AttentionScoresKernel,   WeightedSumsKernel};

}  // namespace KVDIFF_ISA
}  // namespace kvdiff::impl
