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
};

// The kernels of the compilation including this header (gemm.cc, linear_kernels.cc).
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
