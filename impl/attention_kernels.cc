// The two products of a decode step's attention for one KV head (impl/kernels.cc's AttendOneRow):
// the scores of its n_rep query heads over its keys, and their weighted sums of its values. At a
// long context they read the whole KV cache once per layer, and that read is their cost. Compiled
// once per instruction set (impl/isa.h, impl/CMakeLists.txt); every variant sums each score in
// Dot's order (DotRowsKernel) and each output in key order with fused multiply-adds, so every
// variant gives the same bits.
#include <algorithm>
#include <cstdint>

#include "impl/isa.h"
#include "impl/kernel_table.h"
#include "impl/simd.h"
#include "impl/weight_load.h"

namespace kvdiff::impl {
inline namespace KVDIFF_ISA {
namespace {

// A KV head's rows are 64 floats of every kv_dim, and a decode step finds them in DRAM (a layer's
// weights are read between two visits), where the hardware prefetcher alone kept too few lines
// in flight: each row is asked for kRowsAhead rows before it is read. kernels_bench
// BM_AttentionDecodeCold, 512 keys, 2 threads: 84-90 us per layer without the hint, 35-39 with
// it (16 and 64 rows ahead did worse than 32; into L2 rather than L1, 57-59 against 43 on one
// thread).
constexpr int64_t kRowsAhead = 32;
inline void PrefetchRowAhead(const float* row, int64_t stride, int64_t floats) {
  PrefetchLinesAhead(row, static_cast<uintptr_t>(kRowsAhead * stride) * sizeof(float),
                     static_cast<uintptr_t>(floats) * sizeof(float));
}

// The scores of N <= kScoreQueries queries against a block of kVecWidth keys (d a multiple of
// 32): each key row is read once for the N queries, each dot summed in Dot's 32 lanes as
// DotRowsKernel sums it, and the block's kVecWidth trees folded together (VecFoldEach, the same
// pairs in the same order), which a row at a time took most of the scores' time: one fold is a
// chain of dependent shuffles and adds per dot.
#if defined(KVDIFF_HAS_VEC)
constexpr int64_t kScoreQueries = 4;
template <int N>
void ScoreBlock(const float* q, const float* keys, int64_t kv_dim, int64_t d, float* scores,
                int64_t scores_stride) {
  constexpr int kVecs = 32 / kVecWidth;
  Vec partials[N][kVecWidth];
  for (int k = 0; k < kVecWidth; ++k) {
    const float* row = keys + k * kv_dim;
    PrefetchRowAhead(row, kv_dim, d);
    Vec acc[N][kVecs];
    for (int n = 0; n < N; ++n) {
      for (int v = 0; v < kVecs; ++v) acc[n][v] = VecZero();
    }
    for (int64_t i = 0; i < d; i += 32) {
      for (int v = 0; v < kVecs; ++v) {
        const Vec key = VecLoad(row + i + v * kVecWidth);
        for (int n = 0; n < N; ++n) {
          acc[n][v] = VecFma(key, VecLoad(q + n * d + i + v * kVecWidth), acc[n][v]);
        }
      }
    }
    for (int n = 0; n < N; ++n) partials[n][k] = VecFoldToWidth(acc[n]);
  }
  for (int n = 0; n < N; ++n) VecStore(scores + n * scores_stride, VecFoldEach(partials[n]));
}
// ScoreBlock for 1 <= queries <= kScoreQueries queries (a count known at run time).
template <int N = 1>
void ScoreBlockOf(int queries, const float* q, const float* keys, int64_t kv_dim, int64_t d,
                  float* scores, int64_t scores_stride) {
  if constexpr (N < kScoreQueries) {
    if (queries != N)
      return ScoreBlockOf<N + 1>(queries, q, keys, kv_dim, d, scores, scores_stride);
  }
  ScoreBlock<N>(q, keys, kv_dim, d, scores, scores_stride);
}
#endif

// WeightedSumsKernel for N heads: every value row is read once for all N; the N x kVecs running
// sums are independent chains, bound by the loads rather than by the adder's latency.
#if defined(KVDIFF_HAS_VEC)
// Heads per pass: AVX-512 4 (4 x up to 4 sums of its 32 registers), AVX2 2 (2 x up to 4 of 16).
constexpr int kSumHeads = kVecWidth == 16 ? 4 : 2;
template <int N, int kVecs>
void WeightedSumsPass(const float* p, int64_t p_stride, int64_t visible, const float* v,
                      int64_t v_stride, float* out, int64_t out_stride, bool accumulate) {
  Vec acc[N][kVecs];
  for (int n = 0; n < N; ++n) {
    for (int u = 0; u < kVecs; ++u) {
      acc[n][u] = accumulate ? VecLoad(out + n * out_stride + u * kVecWidth) : VecZero();
    }
  }
  for (int64_t j = 0; j < visible; ++j) {
    const float* row = v + j * v_stride;
    PrefetchRowAhead(row, v_stride, kVecs * kVecWidth);
    Vec values[kVecs];
    for (int u = 0; u < kVecs; ++u) values[u] = VecLoad(row + u * kVecWidth);
    for (int n = 0; n < N; ++n) {
      const Vec weight = VecBroadcast(p[n * p_stride + j]);
      for (int u = 0; u < kVecs; ++u) acc[n][u] = VecFma(weight, values[u], acc[n][u]);
    }
  }
  for (int n = 0; n < N; ++n) {
    for (int u = 0; u < kVecs; ++u) VecStore(out + n * out_stride + u * kVecWidth, acc[n][u]);
  }
}
template <int N>
void WeightedSums(const float* p, int64_t p_stride, int64_t visible, const float* v,
                  int64_t v_stride, int64_t cols, float* out, int64_t out_stride, bool accumulate) {
  int64_t c = 0;
  for (; c + 4 * kVecWidth <= cols; c += 4 * kVecWidth) {
    WeightedSumsPass<N, 4>(p, p_stride, visible, v + c, v_stride, out + c, out_stride, accumulate);
  }
  for (; c + 2 * kVecWidth <= cols; c += 2 * kVecWidth) {
    WeightedSumsPass<N, 2>(p, p_stride, visible, v + c, v_stride, out + c, out_stride, accumulate);
  }
  for (; c + kVecWidth <= cols; c += kVecWidth) {
    WeightedSumsPass<N, 1>(p, p_stride, visible, v + c, v_stride, out + c, out_stride, accumulate);
  }
  for (; c < cols; ++c) {  // the columns past the last whole vector, one chain each
    for (int n = 0; n < N; ++n) {
      float acc = accumulate ? out[n * out_stride + c] : 0.0f;
      for (int64_t j = 0; j < visible; ++j)
        acc = Fma(p[n * p_stride + j], v[j * v_stride + c], acc);
      out[n * out_stride + c] = acc;
    }
  }
}
#else
constexpr int kSumHeads = 4;
template <int N>
void WeightedSums(const float* p, int64_t p_stride, int64_t visible, const float* v,
                  int64_t v_stride, int64_t cols, float* out, int64_t out_stride, bool accumulate) {
  if (!accumulate) {
    for (int n = 0; n < N; ++n) std::fill(out + n * out_stride, out + n * out_stride + cols, 0.0f);
  }
  for (int64_t j = 0; j < visible; ++j) {
    const float* row = v + j * v_stride;
    for (int n = 0; n < N; ++n) {
      const float weight = p[n * p_stride + j];
      float* o = out + n * out_stride;
      for (int64_t c = 0; c < cols; ++c) o[c] = Fma(weight, row[c], o[c]);
    }
  }
}
#endif

// WeightedSums for the last `heads` < kSumHeads heads.
template <int N = 1>
void WeightedSumsTail(int heads, const float* p, int64_t p_stride, int64_t visible, const float* v,
                      int64_t v_stride, int64_t cols, float* out, int64_t out_stride,
                      bool accumulate) {
  if constexpr (N < kSumHeads) {
    if (heads == N) {
      return WeightedSums<N>(p, p_stride, visible, v, v_stride, cols, out, out_stride, accumulate);
    }
    WeightedSumsTail<N + 1>(heads, p, p_stride, visible, v, v_stride, cols, out, out_stride,
                            accumulate);
  }
}

}  // namespace

void AttentionScoresKernel(const float* q, int64_t n_rep, const float* keys, int64_t kv_dim,
                           int64_t visible, int64_t d, float scale, float* scores,
                           int64_t scores_stride) {
  int64_t j = 0;
#if defined(KVDIFF_HAS_VEC)
  if (d % 32 == 0) {  // whole blocks of kVecWidth keys, their trees folded together
    for (; j + kVecWidth <= visible; j += kVecWidth) {
      for (int64_t r = 0; r < n_rep; r += kScoreQueries) {
        ScoreBlockOf(static_cast<int>(std::min<int64_t>(kScoreQueries, n_rep - r)), q + r * d,
                     keys + j * kv_dim, kv_dim, d, scores + r * scores_stride + j, scores_stride);
      }
    }
  }
#endif
  for (; j < visible; ++j) {  // each key row is read once, for the n_rep queries
    const float* row = keys + j * kv_dim;
    PrefetchRowAhead(row, kv_dim, d);
    DotRowsKernel(row, q, n_rep, d, scores + j, scores_stride);
  }
  for (int64_t r = 0; r < n_rep; ++r) {
    float* row_scores = scores + r * scores_stride;
    for (int64_t k = 0; k < visible; ++k) row_scores[k] *= scale;
  }
}

void WeightedSumsKernel(const float* p, int64_t p_stride, int64_t heads, int64_t visible,
                        const float* v, int64_t v_stride, int64_t cols, float* out,
                        int64_t out_stride, bool accumulate) {
  int64_t n = 0;
  for (; n + kSumHeads <= heads; n += kSumHeads) {
    WeightedSums<kSumHeads>(p + n * p_stride, p_stride, visible, v, v_stride, cols,
                            out + n * out_stride, out_stride, accumulate);
  }
  if (n < heads) {
    WeightedSumsTail(static_cast<int>(heads - n), p + n * p_stride, p_stride, visible, v, v_stride,
                     cols, out + n * out_stride, out_stride, accumulate);
  }
}

}  // namespace KVDIFF_ISA
}  // namespace kvdiff::impl
