#include "impl/gemm.h"

#include <algorithm>
#include <cmath>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace kvdiff::impl {
namespace {

// W rows [r0, r0 + n) as panels: panel q holds rows r0 + q·32 .. r0 + q·32 + 31 as
// packed[(q·k + p)·32 + lane] = W[r0 + q·32 + lane][p] (0 past row n). Widened to float32 here, so
// the micro-kernels read float32 whatever the storage. The transpose goes kPackChunk columns at a
// time, so the 32 × kPackChunk block being written (8 KiB) stays in L1 while 32 rows are read.
constexpr int64_t kPackChunk = 64;
void PackPanels(const WeightView& w, int64_t r0, int64_t n, std::vector<float>& packed,
                std::vector<float>& rows) {
  const int64_t k = w.cols;
  const int64_t panels = (n + kGemmPanel - 1) / kGemmPanel;
  packed.resize(panels * k * kGemmPanel);
  if (w.dtype != WeightDtype::kF32) rows.resize(kGemmPanel * k);
  for (int64_t q = 0; q < panels; ++q) {
    const int64_t lanes = std::min(kGemmPanel, n - q * kGemmPanel);
    const float* src[kGemmPanel];
    for (int64_t l = 0; l < lanes; ++l) {
      const int64_t r = r0 + q * kGemmPanel + l;
      if (w.dtype == WeightDtype::kF32) {
        src[l] = w.Row(r);
      } else {
        WidenRow(w, r, rows.data() + l * k);
        src[l] = rows.data() + l * k;
      }
    }
    float* panel = packed.data() + q * k * kGemmPanel;
    for (int64_t p0 = 0; p0 < k; p0 += kPackChunk) {
      const int64_t p1 = std::min(k, p0 + kPackChunk);
      for (int64_t l = 0; l < kGemmPanel; ++l) {
        if (l < lanes) {
          for (int64_t p = p0; p < p1; ++p) panel[p * kGemmPanel + l] = src[l][p];
        } else {
          for (int64_t p = p0; p < p1; ++p) panel[p * kGemmPanel + l] = 0.0f;
        }
      }
    }
  }
}

#if defined(__AVX512F__)
// M rows of X (stride x_stride) against one 32-column panel: C (M, cols) at c, cols <= 32.
template <int M>
void MicroKernel(const float* x, int64_t x_stride, const float* panel, int64_t k, float* c,
                 int64_t c_stride, int64_t cols) {
  __m512 acc0[M], acc1[M];
  for (int m = 0; m < M; ++m) acc0[m] = acc1[m] = _mm512_setzero_ps();
  for (int64_t p = 0; p < k; ++p) {
    const __m512 b0 = _mm512_loadu_ps(panel + p * kGemmPanel);
    const __m512 b1 = _mm512_loadu_ps(panel + p * kGemmPanel + 16);
    for (int m = 0; m < M; ++m) {
      const __m512 a = _mm512_set1_ps(x[m * x_stride + p]);
      acc0[m] = _mm512_fmadd_ps(a, b0, acc0[m]);
      acc1[m] = _mm512_fmadd_ps(a, b1, acc1[m]);
    }
  }
  const __mmask16 mask0 = static_cast<__mmask16>(cols >= 16 ? 0xffff : (1u << cols) - 1);
  const __mmask16 mask1 =
      static_cast<__mmask16>(cols >= 32 ? 0xffff : cols <= 16 ? 0 : (1u << (cols - 16)) - 1);
  for (int m = 0; m < M; ++m) {
    _mm512_mask_storeu_ps(c + m * c_stride, mask0, acc0[m]);
    _mm512_mask_storeu_ps(c + m * c_stride + 16, mask1, acc1[m]);
  }
}
constexpr int kRowBlock = kGemmRowBlock;
#else
// The same sums in plain C++ (std::fma: fused, whatever the compiler does with the loop), which
// GCC vectorizes for AVX2/FMA; fewer rows per block, for 16 vector registers.
template <int M>
void MicroKernel(const float* x, int64_t x_stride, const float* panel, int64_t k, float* c,
                 int64_t c_stride, int64_t cols) {
  float acc[M][kGemmPanel] = {};
  for (int64_t p = 0; p < k; ++p) {
    const float* b = panel + p * kGemmPanel;
    for (int m = 0; m < M; ++m) {
      const float a = x[m * x_stride + p];
      for (int l = 0; l < kGemmPanel; ++l) acc[m][l] = std::fma(a, b[l], acc[m][l]);
    }
  }
  for (int m = 0; m < M; ++m) std::copy(acc[m], acc[m] + cols, c + m * c_stride);
}
constexpr int kRowBlock = 4;
#endif

// A block of `rows` < kRowBlock rows: the kernel instantiated for that count.
template <int M = 1>
void TailKernel(int rows, const float* x, int64_t x_stride, const float* panel, int64_t k,
                float* c, int64_t c_stride, int64_t cols) {
  if constexpr (M < kRowBlock) {
    if (rows == M) return MicroKernel<M>(x, x_stride, panel, k, c, c_stride, cols);
    TailKernel<M + 1>(rows, x, x_stride, panel, k, c, c_stride, cols);
  }
}

}  // namespace

void GemmTile(const float* x, int64_t s, const WeightView& w, int64_t r0, int64_t n, float* c,
              int64_t c_stride) {
  thread_local std::vector<float> packed, row;
  PackPanels(w, r0, n, packed, row);
  const int64_t k = w.cols;
  const int64_t panels = (n + kGemmPanel - 1) / kGemmPanel;
  for (int64_t i = 0; i < s; i += kRowBlock) {
    const int rows = static_cast<int>(std::min<int64_t>(kRowBlock, s - i));
    for (int64_t q = 0; q < panels; ++q) {
      const float* panel = packed.data() + q * k * kGemmPanel;
      const int64_t cols = std::min(kGemmPanel, n - q * kGemmPanel);
      float* out = c + i * c_stride + q * kGemmPanel;
      if (rows == kRowBlock) {
        MicroKernel<kRowBlock>(x + i * k, k, panel, k, out, c_stride, cols);
      } else {
        TailKernel(rows, x + i * k, k, panel, k, out, c_stride, cols);
      }
    }
  }
}

const char* GemmKernelName() {
#if defined(__AVX512F__)
  return "avx512";
#elif defined(__AVX2__) && defined(__FMA__)
  return "avx2 (compiler-vectorized)";
#else
  return "generic";
#endif
}

}  // namespace kvdiff::impl
