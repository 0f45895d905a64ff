// The table of impl's dispatched kernels, one per instruction set compiled in (impl/isa.h); the
// variant that runs is chosen once at run time (impl/kernel_path.h). Every variant computes each
// output element in the one order its definition states (Dot's lanes and tree, GemmTile's single
// fma chain), so which one runs changes the speed, never a bit.
#pragma once

#include <cstdint>

#include "impl/isa.h"
#include "impl/kernels.h"

namespace kvdiff::impl {

struct KernelTable {
  const char* name;  // "avx512", "avx2", "scalar": the KVDIFF_KERNELS value that picks it
  // GemmTile (impl/gemm.h); panel is the caller's scratch of w.cols * kGemmPanel floats.
  void (*gemm_tile)(const float* x, int64_t s, const WeightView& w, int64_t r0, int64_t n, float* c,
                    int64_t c_stride, float* panel);
  // y[r .. r + n) = w[r .. r + n) · x for one input row x (w.cols): the decode product.
  void (*decode_rows)(const float* x, const WeightView& w, int64_t r, int64_t n, float* y);
  // Column r of y (s, w.rows) = x (s, w.cols) · wᵀ: the rows path (s <= kLinearRowsMax).
  void (*rows_of_one)(const float* x, int64_t s, const WeightView& w, int64_t r, float* y);
  // Decode attention's scores for one KV head (impl/kernels.cc's AttendOneRow): scores[r *
  // scores_stride + j] = Dot(q + r * d, keys + j * kv_dim, d) * scale for r < n_rep, j < visible.
  void (*attention_scores)(const float* q, int64_t n_rep, const float* keys, int64_t kv_dim,
                           int64_t visible, int64_t d, float scale, float* scores,
                           int64_t scores_stride);
  // out[n * out_stride + c] = the fused multiply-add chain of p[n * p_stride + j] * v[j * v_stride
  // + c] over j = 0 .. visible-1 in order, for n < heads and c < cols, from 0, or with `accumulate`
  // from out's value (so one chain can be run a block of rows at a time, to the same bits).
  void (*weighted_sums)(const float* p, int64_t p_stride, int64_t heads, int64_t visible,
                        const float* v, int64_t v_stride, int64_t cols, float* out,
                        int64_t out_stride, bool accumulate);
};

// The kernels of the compilation including this header (gemm.cc, linear_kernels.cc,
// attention_kernels.cc).
inline namespace KVDIFF_ISA {
// What the kernel files would otherwise take from inline functions outside their namespace
// (std::fma, WeightView::Row): an unoptimized build emits those as one symbol shared by every
// compilation (impl/isa.h). Fma rounds once: vfmadd where the compilation has FMA, fmaf elsewhere.
inline float Fma(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
inline const float* WeightRow(const WeightView& w, int64_t r) { return w.data + r * w.cols; }
inline const uint16_t* HalfWeightRow(const WeightView& w, int64_t r) { return w.half + r * w.cols; }
void GemmTileKernel(const float* x, int64_t s, const WeightView& w, int64_t r0, int64_t n, float* c,
                    int64_t c_stride, float* panel);
void DecodeRowsKernel(const float* x, const WeightView& w, int64_t r, int64_t n, float* y);
void RowsOfOneKernel(const float* x, int64_t s, const WeightView& w, int64_t r, float* y);
// out[i * out_stride] = Dot(w, x + i * cols, cols) for i < s: one float32 row against s input rows
// (linear_kernels.cc).
void DotRowsKernel(const float* w, const float* x, int64_t s, int64_t cols, float* out,
                   int64_t out_stride);
// attention_kernels.cc
void AttentionScoresKernel(const float* q, int64_t n_rep, const float* keys, int64_t kv_dim,
                           int64_t visible, int64_t d, float scale, float* scores,
                           int64_t scores_stride);
void WeightedSumsKernel(const float* p, int64_t p_stride, int64_t heads, int64_t visible,
                        const float* v, int64_t v_stride, int64_t cols, float* out,
                        int64_t out_stride, bool accumulate);
}  // namespace KVDIFF_ISA

// Each compilation's table (linear_kernels.cc); which exist is decided by impl/CMakeLists.txt.
namespace scalar {
extern const KernelTable kKernels;
}
namespace avx2 {
extern const KernelTable kKernels;
}
namespace avx512 {
extern const KernelTable kKernels;
}

// The table in use (impl/kernel_path.cc): chosen on first use, see KernelPath().
const KernelTable& Kernels();

}  // namespace kvdiff::impl
