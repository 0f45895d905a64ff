#include "impl/gemm.h"

#include <algorithm>
#include <cmath>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "impl/weight_load.h"

namespace kvdiff::impl {
namespace {

#if defined(__AVX512F__)
// GCC 12's headers implement unpack/shuffle through _mm512_undefined_ps() and then warn that it is
// uninitialized (GCC bug 105593); nothing here reads an undefined value.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
// v[i] = column i of the 16 × 16 block whose rows are v[0..15]: interleave pairs of rows, then
// quadruples (within 128-bit lanes), then the 128-bit lanes themselves.
void Transpose16(__m512 v[16]) {
  __m512 t[16], u[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(v[i], v[i + 1]);      // per lane: r0[0] r1[0] r0[1] r1[1]
    t[i + 1] = _mm512_unpackhi_ps(v[i], v[i + 1]);  // r0[2] r1[2] r0[3] r1[3]
  }
  for (int g = 0; g < 16; g += 4) {  // u[g + c], lane a: column 4a + c of rows g .. g + 3
    u[g + 0] = _mm512_shuffle_ps(t[g], t[g + 2], 0x44);
    u[g + 1] = _mm512_shuffle_ps(t[g], t[g + 2], 0xEE);
    u[g + 2] = _mm512_shuffle_ps(t[g + 1], t[g + 3], 0x44);
    u[g + 3] = _mm512_shuffle_ps(t[g + 1], t[g + 3], 0xEE);
  }
  for (int c = 0; c < 4; ++c) {  // gather lane a of u[c], u[4 + c], u[8 + c], u[12 + c]
    const __m512 even_lo = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x88);  // lanes 0, 2 of each
    const __m512 odd_lo = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xDD);   // lanes 1, 3
    const __m512 even_hi = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x88);
    const __m512 odd_hi = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xDD);
    v[0 + c] = _mm512_shuffle_f32x4(even_lo, even_hi, 0x88);
    v[4 + c] = _mm512_shuffle_f32x4(odd_lo, odd_hi, 0x88);
    v[8 + c] = _mm512_shuffle_f32x4(even_lo, even_hi, 0xDD);
    v[12 + c] = _mm512_shuffle_f32x4(odd_lo, odd_hi, 0xDD);
  }
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif

// n rows of W from w (row stride k) as panels: panel q holds rows q·32 .. q·32 + 31 as
// packed[(q·k + p)·32 + lane] = W[q·32 + lane][p] (0 past row n), widened to float32 by Load as
// they are read, so the micro-kernels read float32 whatever the storage. With AVX-512 the
// transpose goes through registers, 16 rows × 16 columns at a time; the columns past the last
// multiple of 16 (every column, without AVX-512) are copied one at a time, all 32 lanes of a
// column together, so the 32 rows being read stay in L1.
template <class Load>
void PackPanels(const typename Load::T* w, int64_t k, int64_t n, std::vector<float>& packed) {
  const int64_t panels = (n + kGemmPanel - 1) / kGemmPanel;
  packed.resize(panels * k * kGemmPanel);
  for (int64_t q = 0; q < panels; ++q) {
    const int64_t lanes = std::min(kGemmPanel, n - q * kGemmPanel);
    const typename Load::T* rows = w + q * kGemmPanel * k;
    float* panel = packed.data() + q * k * kGemmPanel;
    int64_t p0 = 0;
#if defined(__AVX512F__)
    for (; p0 + 16 <= k; p0 += 16) {
      for (int64_t half = 0; half < kGemmPanel; half += 16) {
        __m512 v[16];
        for (int64_t l = 0; l < 16; ++l) {
          v[l] = half + l < lanes ? Load::Get16(rows + (half + l) * k + p0) : _mm512_setzero_ps();
        }
        Transpose16(v);
        for (int64_t i = 0; i < 16; ++i)
          _mm512_storeu_ps(panel + (p0 + i) * kGemmPanel + half, v[i]);
      }
    }
#endif
    for (int64_t p = p0; p < k; ++p) {
      for (int64_t l = 0; l < kGemmPanel; ++l) {
        panel[p * kGemmPanel + l] = l < lanes ? Load::Get(rows + l * k + p) : 0.0f;
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
  const __mmask16 mask1 = static_cast<__mmask16>(cols >= 32   ? 0xffff
                                                 : cols <= 16 ? 0
                                                              : (1u << (cols - 16)) - 1);
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
void TailKernel(int rows, const float* x, int64_t x_stride, const float* panel, int64_t k, float* c,
                int64_t c_stride, int64_t cols) {
  if constexpr (M < kRowBlock) {
    if (rows == M) return MicroKernel<M>(x, x_stride, panel, k, c, c_stride, cols);
    TailKernel<M + 1>(rows, x, x_stride, panel, k, c, c_stride, cols);
  }
}

}  // namespace

void GemmTile(const float* x, int64_t s, const WeightView& w, int64_t r0, int64_t n, float* c,
              int64_t c_stride) {
  thread_local std::vector<float> packed;
  const int64_t k = w.cols;
  switch (w.dtype) {
    case WeightDtype::kF32:
      PackPanels<LoadF32>(w.Row(r0), k, n, packed);
      break;
    case WeightDtype::kBF16:
      PackPanels<LoadBF16>(w.HalfRow(r0), k, n, packed);
      break;
    case WeightDtype::kF16:
      PackPanels<LoadF16>(w.HalfRow(r0), k, n, packed);
      break;
  }
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
