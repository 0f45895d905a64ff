// The linear layers: y = x W^T for the weights in any storage (float32, bf16, f16), by
// matrix-vector products that stream the weights for a few rows (decode) and by impl/gemm.h's tiles
// for many.
#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "impl/kernels.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "format/error.h"
#include "format/safetensors.h"
#include "format/tensor.h"
#include "impl/gemm.h"
#include "impl/reduction.h"
#include "impl/weight_load.h"

namespace kvdiff::impl {
namespace {

// Output rows per GEMM tile in prefill (a work item of the pool, claimed on its own). A function
// of the matrix shape only; the bits do not depend on it anyway (GemmTile sums each element in one
// fixed chain), but the balance does: a thread that finishes first waits for at most one tile.
// 64 rows splits the 576-, 192- and 1536-row matrices of SmolLM2 into 9, 3 and 24 tiles of two
// panels. Measured on its 128-token bf16 forward, 2 threads (a throwaway in-process A/B, medians of
// 20 alternated runs, two runs each): 96-row tiles in 8 chunks a call took 1.04-1.06x the time of
// 32-row tiles in 32 chunks, those 1.03-1.05x that of 64-row tiles in 32 chunks, and those
// 1.05-1.07x that of 64-row tiles claimed one at a time; 128-row tiles one at a time did as well.
int64_t GemmTileRows(int64_t rows) { return rows <= 2048 ? 64 : 256; }

// Rows per chunk in matrix-vector products: one chunk boundary per 16 rows keeps the split even.
constexpr int64_t kMatVecGrain = 16;

}  // namespace

namespace {

// The matrix-vector products stream every weight from DRAM once per token, and the hardware
// prefetcher alone keeps too few cache lines in flight for that: each weight line is asked for
// kPrefetchAhead bytes before the kernel reads it (rows lie back to back, so the hint runs on into
// the next rows). Measured on smollm2-135m shapes, one thread, weights from DRAM (kernels_bench
// BM_MatVecCold, 1536 x 576): bf16 5.8 -> 10.2 GB/s, float32 7.8 -> 10.7 GB/s; distances from 4 to
// 16 KiB do about as well, 32 KiB worse. With the decode rows taken from three streams (see
// DecodeRows) 2 to 4 KiB ahead per stream did as well as 8 and better than 6 (bf16 at context 512:
// 14.6-14.7 ms a step against 15.1), and 4 KiB is one page ahead. A hint only: it never faults,
// and computing its address as an integer keeps pointer arithmetic inside the matrix.
constexpr uintptr_t kPrefetchAhead = 4096;
template <class T>
inline void PrefetchAhead(const T* p) {
  const uintptr_t ahead = reinterpret_cast<uintptr_t>(p) + kPrefetchAhead;
  __builtin_prefetch(reinterpret_cast<const void*>(ahead));
}
// Every line of the kLanes values of T at p.
template <class T, int kLanes>
inline void PrefetchLanesAhead(const T* p) {
  for (int b = 0; b < static_cast<int>(kLanes * sizeof(T)); b += kCacheLine) {
    PrefetchAhead(reinterpret_cast<const char*>(p) + b);
  }
}

// Dots of one weight row w with N input rows x, x + x_stride, ...: out[n] = Dot(w, x_n, cols),
// summed in exactly Dot's order (same lanes, same tree), so the rows path gives the same bits as
// the matrix-vector path. The N * 32 running sums are independent chains: the loop is bound by
// loads from L1, not by the latency of the adds. With 16-bit storage each weight is widened as it
// is loaded (Load::Get): the same products, the same sums, half the bytes read from memory.
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
      for (int j = 0; j < kLanes; ++j) acc[n][j] += wv[j] * xn[i + j];
    }
  }
  for (int j = 0; i < cols; ++i, ++j) {
    const float wi = Load::Get(w + i);
    for (int n = 0; n < N; ++n) acc[n][j] += wi * x[n * x_stride + i];
  }
  for (int n = 0; n < N; ++n) out[n * out_stride] = FoldLanes<kLanes>(acc[n]);
}

#if defined(__AVX512F__)
// DotWeightRows<R, LoadBF16> (which calls it), bit for bit, with the widening at one operation per
// 16 weights.
// A 64-byte load holds 32 bf16 weights: weight 2k in the low half of 32-bit lane k, weight 2k + 1
// in its high half. Shifting every lane left by 16 gives weights 0, 2, ..., 30 as float32; masking
// off the low halves gives weights 1, 3, ..., 31. The accumulators keep that split (Dot's even
// lanes j in one register, its odd lanes in another), so each acc[j] receives the same fused
// multiply-adds in the same order; x is split alike (two permutes per 32 inputs, shared by the R
// rows), and the sums are interleaved back into Dot's lanes before its tail and its tree.
template <int R>
void DotWeightRowsBF16(const uint16_t* __restrict w, int64_t w_stride, const float* __restrict x,
                       int64_t cols, float* out, int64_t out_stride) {
  constexpr int kLanes = 32;
  const __m512i even_lanes =
      _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd_lanes =
      _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  const __m512i high_halves = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  __m512 even[R], odd[R];
  for (int r = 0; r < R; ++r) even[r] = odd[r] = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + kLanes <= cols; i += kLanes) {
    const __m512 x_lo = _mm512_loadu_ps(x + i);
    const __m512 x_hi = _mm512_loadu_ps(x + i + 16);
    const __m512 x_even = _mm512_permutex2var_ps(x_lo, even_lanes, x_hi);
    const __m512 x_odd = _mm512_permutex2var_ps(x_lo, odd_lanes, x_hi);
    for (int r = 0; r < R; ++r) {
      PrefetchAhead(w + r * w_stride + i);  // the 64 bytes of this row's next 32 weights
      const __m512i v = _mm512_loadu_si512(w + r * w_stride + i);
      const __m512 w_even = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
      const __m512 w_odd = _mm512_castsi512_ps(_mm512_and_si512(v, high_halves));
      even[r] = _mm512_fmadd_ps(w_even, x_even, even[r]);
      odd[r] = _mm512_fmadd_ps(w_odd, x_odd, odd[r]);
    }
  }
  // Dot's lanes 0..15 are even[0], odd[0], even[1], odd[1], ...; lanes 16..31 the rest.
  const __m512i interleave_lo =
      _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i interleave_hi =
      _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
  for (int r = 0; r < R; ++r) {
    float acc[kLanes];
    _mm512_storeu_ps(acc, _mm512_permutex2var_ps(even[r], interleave_lo, odd[r]));
    _mm512_storeu_ps(acc + 16, _mm512_permutex2var_ps(even[r], interleave_hi, odd[r]));
    const uint16_t* wr = w + r * w_stride;
    for (int64_t t = i, j = 0; t < cols; ++t, ++j) acc[j] += LoadBF16::Get(wr + t) * x[t];
    out[r * out_stride] = FoldLanes<kLanes>(acc);
  }
}
#endif

// Dots of R weight rows w, w + w_stride, ... with one input row x: out[r * out_stride] =
// Dot(w_r, x, cols), each summed in exactly Dot's order. The decode matrix-vector product: one
// row alone is 2 vector chains of adds, bound by their latency; R rows at once are 2R independent
// chains, so the loop waits on memory, as a matrix-vector product should, not on the adder.
template <int R, class Load>
void DotWeightRows(const typename Load::T* __restrict w, int64_t w_stride,
                   const float* __restrict x, int64_t cols, float* out, int64_t out_stride) {
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<Load, LoadBF16>) {
    return DotWeightRowsBF16<R>(w, w_stride, x, cols, out, out_stride);
  }
#endif
  constexpr int kLanes = 32;
  float acc[R][kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= cols; i += kLanes) {
    for (int r = 0; r < R; ++r) {
      const typename Load::T* wr = w + r * w_stride;
      PrefetchLanesAhead<typename Load::T, kLanes>(wr + i);
      for (int j = 0; j < kLanes; ++j) acc[r][j] += Load::Get(wr + i + j) * x[i + j];
    }
  }
  for (int j = 0; i < cols; ++i, ++j) {
    for (int r = 0; r < R; ++r) acc[r][j] += Load::Get(w + r * w_stride + i) * x[i];
  }
  for (int r = 0; r < R; ++r) out[r * out_stride] = FoldLanes<kLanes>(acc[r]);
}

}  // namespace

namespace {

// The work items of a LinearMany call, in order: output k owns items [begin[k], begin[k + 1]).
// An item is a weight row (rows path) or a tile of GemmTileRows rows (GEMM path).
struct LinearItems {
  int64_t begin[kLinearManyMax + 1];
  int count;
  int64_t Total() const { return begin[count]; }
  int Owner(int64_t item) const {  // the output an item belongs to (count is tiny: a scan)
    int k = 0;
    while (item >= begin[k + 1]) ++k;
    return k;
  }
};

LinearItems CountItems(const LinearOutput* outputs, int count, bool gemm) {
  KVDIFF_CHECK(count >= 1 && count <= kLinearManyMax, "LinearMany: expected 1..{} outputs, got {}",
               kLinearManyMax, count);
  LinearItems items{};
  items.count = count;
  for (int k = 0; k < count; ++k) {
    const int64_t rows = outputs[k].w.rows;
    const int64_t n = gemm ? (rows + GemmTileRows(rows) - 1) / GemmTileRows(rows) : rows;
    items.begin[k + 1] = items.begin[k] + n;
  }
  return items;
}

// y rows [r, r + 1) of one output, for every input row: the weight row is read from memory once,
// then from L1 for each group of up to 4 input rows.
template <class Load>
void RowsOfOne(const float* x, int64_t s, const typename Load::T* wr, int64_t rows, int64_t cols,
               int64_t r, float* y) {
  int64_t i = 0;
  for (; i + 4 <= s; i += 4) DotRows<4, Load>(wr, x + i * cols, cols, cols, y + i * rows + r, rows);
  switch (s - i) {
    case 3:
      DotRows<3, Load>(wr, x + i * cols, cols, cols, y + i * rows + r, rows);
      break;
    case 2:
      DotRows<2, Load>(wr, x + i * cols, cols, cols, y + i * rows + r, rows);
      break;
    case 1:
      DotRows<1, Load>(wr, x + i * cols, cols, cols, y + i * rows + r, rows);
      break;
    default:
      break;
  }
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
// and so do bf16 rows where the build has no AVX-512 (no split-lane kernel).
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

void DecodeRows(const float* x, const WeightView& w, int64_t r, int64_t n, float* y) {
  switch (w.dtype) {
    case WeightDtype::kF32:
      return DecodeRows<LoadF32, kDecodeStreams>(x, w.data, w.cols, r, n, y);
    case WeightDtype::kBF16:
      return DecodeRows<LoadBF16, kBF16DecodeStreams>(x, w.half, w.cols, r, n, y);
    case WeightDtype::kF16:
      return DecodeRows<LoadF16, 1>(x, w.half, w.cols, r, n, y);
  }
}

void RowsOfOne(const float* x, int64_t s, const WeightView& w, int64_t r, float* y) {
  switch (w.dtype) {
    case WeightDtype::kF32:
      return RowsOfOne<LoadF32>(x, s, w.Row(r), w.rows, w.cols, r, y);
    case WeightDtype::kBF16:
      return RowsOfOne<LoadBF16>(x, s, w.HalfRow(r), w.rows, w.cols, r, y);
    case WeightDtype::kF16:
      return RowsOfOne<LoadF16>(x, s, w.HalfRow(r), w.rows, w.cols, r, y);
  }
}

// Tile t of one output: y[:, t*tile .. +rows] = x · W[t*tile .. +rows]ᵀ by the packed-panel
// micro-kernel (impl/gemm.h): each element one fused multiply-add chain over the input features.
void GemmTileOfOne(const float* x, int64_t s, const WeightView& w, int64_t t, float* y) {
  const int64_t tile = GemmTileRows(w.rows);
  const int64_t r0 = t * tile;
  GemmTile(x, s, w, r0, std::min(tile, w.rows - r0), y + r0, w.rows);
}

void RunLinear(ThreadPool& pool, const float* x, int64_t s, const LinearOutput* outputs, int count,
               bool gemm) {
  const LinearItems items = CountItems(outputs, count, gemm);
  if (gemm) {  // a tile is tens of microseconds: each is claimed on its own
    pool.ParallelForEach(items.Total(), [&](int64_t item, int64_t, int) {
      const int k = items.Owner(item);
      GemmTileOfOne(x, s, outputs[k].w, item - items.begin[k], outputs[k].y);
    });
    return;
  }
  // Rows: chunk boundaries every 16 rows keep the split even.
  pool.ParallelFor(items.Total(), kMatVecGrain, [&](int64_t begin, int64_t end, int) {
    int k = items.Owner(begin);
    if (s == 1) {  // runs of rows of one output at a time
      for (int64_t item = begin; item < end;) {
        while (item >= items.begin[k + 1]) ++k;
        const int64_t n = std::min(end, items.begin[k + 1]) - item;
        DecodeRows(x, outputs[k].w, item - items.begin[k], n, outputs[k].y);
        item += n;
      }
      return;
    }
    for (int64_t item = begin; item < end; ++item) {
      while (item >= items.begin[k + 1]) ++k;
      RowsOfOne(x, s, outputs[k].w, item - items.begin[k], outputs[k].y);
    }
  });
}

}  // namespace

void LinearRows(ThreadPool& pool, const float* x, int64_t s, const WeightView& w, float* y) {
  const LinearOutput output{w, y};
  RunLinear(pool, x, s, &output, 1, false);
}

void LinearGemm(ThreadPool& pool, const float* x, int64_t s, const WeightView& w, float* y) {
  const LinearOutput output{w, y};
  RunLinear(pool, x, s, &output, 1, true);
}

void LinearMany(ThreadPool& pool, const float* x, int64_t s, const LinearOutput* outputs,
                int count) {
  for (int k = 1; k < count; ++k) {
    KVDIFF_CHECK(outputs[k].w.cols == outputs[0].w.cols,
                 "LinearMany: output {} has {} input features, output 0 has {}", k,
                 outputs[k].w.cols, outputs[0].w.cols);
  }
  RunLinear(pool, x, s, outputs, count, s > kLinearRowsMax);
}

void Linear(ThreadPool& pool, const float* x, int64_t s, const WeightView& w, float* y) {
  const LinearOutput output{w, y};
  RunLinear(pool, x, s, &output, 1, s > kLinearRowsMax);
}

}  // namespace kvdiff::impl
