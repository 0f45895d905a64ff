// The GEMM micro-kernels of impl/gemm.h, compiled once per instruction set (impl/isa.h): the
// AVX-512 compilation transposes and multiplies with its own intrinsics, the AVX2 one multiplies
// through impl/simd.h, the scalar one is plain C++ with Fma (kernel_table.h). Each element is the
// same fma chain in input order in every one of them, so every variant gives the same bits. (The
// AVX-512 kernel written through impl/simd.h, as AVX2's with one block of the whole panel, gave
// the same instructions in its loop but 128-token prefill GEMMs ~9% slower, measured alternated.)
#include "impl/gemm.h"

#include <cmath>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "impl/isa.h"
#include "impl/kernel_table.h"
#include "impl/simd.h"
#include "impl/weight_load.h"

namespace kvdiff::impl {
inline namespace KVDIFF_ISA {
namespace {

// Not std::min: a standard template instantiated here would be a symbol shared with the
// baseline's copy, and the linker may keep either (impl/isa.h).
int64_t Min(int64_t a, int64_t b) { return a < b ? a : b; }
int64_t Max(int64_t a, int64_t b) { return a < b ? b : a; }

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

#if defined(KVDIFF_HAS_VEC) && !defined(__AVX512F__)
// v[i] = column i of the 8 x 8 block whose rows are v[0..7] (AVX2): interleave pairs of rows,
// then pairs of pairs (within 128-bit lanes), then swap the 128-bit lanes across.
void Transpose8(__m256 v[8]) {
  __m256 t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(v[i], v[i + 1]);      // per lane: r0[0] r1[0] r0[1] r1[1]
    t[i + 1] = _mm256_unpackhi_ps(v[i], v[i + 1]);  // r0[2] r1[2] r0[3] r1[3]
  }
  for (int g = 0; g < 8; g += 4) {  // u[g + c], lane a: column 4a + c of rows g .. g + 3
    u[g + 0] = _mm256_shuffle_ps(t[g], t[g + 2], 0x44);
    u[g + 1] = _mm256_shuffle_ps(t[g], t[g + 2], 0xEE);
    u[g + 2] = _mm256_shuffle_ps(t[g + 1], t[g + 3], 0x44);
    u[g + 3] = _mm256_shuffle_ps(t[g + 1], t[g + 3], 0xEE);
  }
  for (int c = 0; c < 4; ++c) {  // the low lanes give columns 0..3, the high ones 4..7
    v[c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x20);
    v[4 + c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x31);
  }
}
#endif

// One panel: `lanes` <= 32 rows of W from w (row stride k) as packed[p·32 + lane] = W[lane][p]
// (0 for lanes past `lanes`), widened to float32 by Load as they are read, so the micro-kernels
// read float32 whatever the storage. With AVX-512 the transpose goes through registers, 16 rows
// × 16 columns at a time, with AVX2 8 × 8 (it was a copy of one value at a time, as the scalar
// path still is: a third of the AVX2 GEMM's time for 16 rows of X); the columns past the last
// multiple of the width are copied one at a time, all 32 lanes of a column together, so the 32
// rows being read stay in L1.
template <class Load>
void PackPanel(const typename Load::T* rows, int64_t k, int64_t lanes, float* panel) {
  int64_t p0 = 0;
#if defined(__AVX512F__)
  for (; p0 + 16 <= k; p0 += 16) {
    for (int64_t half = 0; half < kGemmPanel; half += 16) {
      __m512 v[16];
      for (int64_t l = 0; l < 16; ++l) {
        v[l] = half + l < lanes ? Load::Get16(rows + (half + l) * k + p0) : _mm512_setzero_ps();
      }
      Transpose16(v);
      for (int64_t i = 0; i < 16; ++i) _mm512_storeu_ps(panel + (p0 + i) * kGemmPanel + half, v[i]);
    }
  }
#elif defined(KVDIFF_HAS_VEC)
  for (; p0 + 8 <= k; p0 += 8) {  // AVX2: 8 rows x 8 columns at a time
    for (int64_t group = 0; group < kGemmPanel; group += 8) {
      __m256 v[8];
      for (int64_t l = 0; l < 8; ++l) {
        v[l] = group + l < lanes ? VecWiden<Load>(rows + (group + l) * k + p0) : VecZero();
      }
      Transpose8(v);
      for (int64_t i = 0; i < 8; ++i) VecStore(panel + (p0 + i) * kGemmPanel + group, v[i]);
    }
  }
#endif
  for (int64_t p = p0; p < k; ++p) {
    for (int64_t l = 0; l < kGemmPanel; ++l) {
      panel[p * kGemmPanel + l] = l < lanes ? Load::Get(rows + l * k + p) : 0.0f;
    }
  }
}

void PackPanel(const WeightView& w, int64_t row, int64_t lanes, float* panel) {
  switch (w.dtype) {
    case WeightDtype::kF32:
      return PackPanel<LoadF32>(WeightRow(w, row), w.cols, lanes, panel);
    case WeightDtype::kBF16:
      return PackPanel<LoadBF16>(HalfWeightRow(w, row), w.cols, lanes, panel);
    case WeightDtype::kF16:
      return PackPanel<LoadF16>(HalfWeightRow(w, row), w.cols, lanes, panel);
  }
}

// Cache lines for the micro-kernels to prefetch into L2 while they compute.
struct Prefetch {
  const char* begin = nullptr;
  int64_t lines = 0;
  void Line(int64_t i) const { __builtin_prefetch(begin + i * kCacheLine, 0, 2); }
};
constexpr int64_t kPrefetchEvery = 4;

// A Prefetch's lines asked for over a kernel's k steps of p: `burst` lines at every
// kPrefetchEvery-th step, the burst as small as lets every line be asked for within the k steps.
// With many rows of X (prefill) a block is long and the burst is one line; with few (batched
// decode of 9-32 conversations) a block is short and its share of the next panel large: one line
// every fourth step, the rest asked for at the block's end, left packing waiting on DRAM
// (BM_LinearFewRows s=16, GEMM: PackPanel 39% of the time, the micro-kernels 18%; with bursts,
// ~530 -> ~340 us, alternated under load). Where a block's share fits one line per four steps
// (prefill) this is the schedule it always had, and it adds one register to the loop: an error
// term spreading the lines evenly did as well at s=16 but took four.
class PrefetchSchedule {
  static int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

 public:
  PrefetchSchedule(const Prefetch& prefetch, int64_t k)
      : prefetch_(prefetch), burst_(CeilDiv(prefetch.lines, CeilDiv(k, kPrefetchEvery))) {}
  void Step(int64_t p) {
    if (p % kPrefetchEvery != 0) return;
    const int64_t end = Min(next_ + burst_, prefetch_.lines);
    for (; next_ < end; ++next_) prefetch_.Line(next_);
  }

 private:
  const Prefetch& prefetch_;
  int64_t burst_;
  int64_t next_ = 0;
};

// The bytes of the kGemmPanel rows of w from `row` on (fewer at the end of w): the panel packed
// after the current one, in this tile or, past its end, the first of the next tile.
Prefetch PanelAfter(const WeightView& w, int64_t row) {
  const int64_t rows = Max(0, Min(kGemmPanel, w.rows - row));
  if (rows == 0) return {};
  const bool f32 = w.dtype == WeightDtype::kF32;
  const char* begin = f32 ? reinterpret_cast<const char*>(WeightRow(w, row))
                          : reinterpret_cast<const char*>(HalfWeightRow(w, row));
  const int64_t bytes = rows * w.cols * (f32 ? 4 : 2);
  return {begin, (bytes + kCacheLine - 1) / kCacheLine};
}

// Part `part` of `parts` near-equal parts of p's lines.
Prefetch Part(const Prefetch& p, int64_t part, int64_t parts) {
  const int64_t first = p.lines * part / parts, last = p.lines * (part + 1) / parts;
  return {p.begin + first * kCacheLine, last - first};
}

#if defined(__AVX512F__)
// M rows of X (stride x_stride) against one 32-column panel: C (M, cols) at c, cols <= 32.
template <int M>
void MicroKernel(const float* x, int64_t x_stride, const float* panel, int64_t k, float* c,
                 int64_t c_stride, int64_t cols, const Prefetch& prefetch) {
  __m512 acc0[M], acc1[M];
  for (int m = 0; m < M; ++m) acc0[m] = acc1[m] = _mm512_setzero_ps();
  PrefetchSchedule schedule(prefetch, k);
  for (int64_t p = 0; p < k; ++p) {
    schedule.Step(p);
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
#elif defined(KVDIFF_HAS_VEC)
// AVX2 has 16 vector registers, too few for a block of the whole 32-column panel: the panel goes
// through in two halves of 16 columns, each a 6 x 16 block of C in 12 registers, with 2 for the
// panel's row and 1 for the broadcast. (The plain C++ below, vectorized by the compiler, kept
// 4 x 32 sums and spilled them: prefill ran at 0.56x llama.cpp's speed, docs/kernels.md.)
template <int M>
void HalfPanelKernel(const float* x, int64_t x_stride, const float* panel, int64_t k, float* c,
                     int64_t c_stride, int64_t cols, const Prefetch& prefetch) {
  static_assert(2 * kVecWidth == kGemmPanel / 2);
  Vec acc0[M], acc1[M];
  for (int m = 0; m < M; ++m) acc0[m] = acc1[m] = VecZero();
  PrefetchSchedule schedule(prefetch, k);
  for (int64_t p = 0; p < k; ++p) {
    schedule.Step(p);
    const Vec b0 = VecLoad(panel + p * kGemmPanel);
    const Vec b1 = VecLoad(panel + p * kGemmPanel + kVecWidth);
    for (int m = 0; m < M; ++m) {
      const Vec a = VecBroadcast(x[m * x_stride + p]);
      acc0[m] = VecFma(a, b0, acc0[m]);
      acc1[m] = VecFma(a, b1, acc1[m]);
    }
  }
  for (int m = 0; m < M; ++m) {
    float* row = c + m * c_stride;
    if (cols >= 2 * kVecWidth) {
      VecStore(row, acc0[m]);
      VecStore(row + kVecWidth, acc1[m]);
    } else if (cols > kVecWidth) {
      VecStore(row, acc0[m]);
      VecStoreFirst(row + kVecWidth, acc1[m], cols - kVecWidth);
    } else {
      VecStoreFirst(row, acc0[m], cols);  // cols == kVecWidth stores all of them
    }
  }
}
// M rows of X against one 32-column panel, as two half panels (the prefetch shared between them).
template <int M>
void MicroKernel(const float* x, int64_t x_stride, const float* panel, int64_t k, float* c,
                 int64_t c_stride, int64_t cols, const Prefetch& prefetch) {
  constexpr int64_t kHalf = kGemmPanel / 2;
  HalfPanelKernel<M>(x, x_stride, panel, k, c, c_stride, Min(cols, kHalf), Part(prefetch, 0, 2));
  if (cols > kHalf) {
    HalfPanelKernel<M>(x, x_stride, panel + kHalf, k, c + kHalf, c_stride, cols - kHalf,
                       Part(prefetch, 1, 2));
  }
}
constexpr int kRowBlock = 6;
#else
// The same sums in plain C++ (Fma: fused, whatever the compiler does with the loop), which
// GCC vectorizes for AVX2/FMA; fewer rows per block, for 16 vector registers.
template <int M>
void MicroKernel(const float* x, int64_t x_stride, const float* panel, int64_t k, float* c,
                 int64_t c_stride, int64_t cols, const Prefetch& prefetch) {
  float acc[M][kGemmPanel] = {};
  PrefetchSchedule schedule(prefetch, k);
  for (int64_t p = 0; p < k; ++p) {
    schedule.Step(p);
    const float* b = panel + p * kGemmPanel;
    for (int m = 0; m < M; ++m) {
      const float a = x[m * x_stride + p];
      for (int l = 0; l < kGemmPanel; ++l) acc[m][l] = Fma(a, b[l], acc[m][l]);
    }
  }
  for (int m = 0; m < M; ++m) {
    for (int64_t l = 0; l < cols; ++l) c[m * c_stride + l] = acc[m][l];
  }
}
constexpr int kRowBlock = 4;
#endif

// A block of `rows` < kRowBlock rows: the kernel instantiated for that count.
template <int M = 1>
void TailKernel(int rows, const float* x, int64_t x_stride, const float* panel, int64_t k, float* c,
                int64_t c_stride, int64_t cols, const Prefetch& prefetch) {
  if constexpr (M < kRowBlock) {
    if (rows == M) return MicroKernel<M>(x, x_stride, panel, k, c, c_stride, cols, prefetch);
    TailKernel<M + 1>(rows, x, x_stride, panel, k, c, c_stride, cols, prefetch);
  }
}

}  // namespace

void GemmTileKernel(const float* x, int64_t s, const WeightView& w, int64_t r0, int64_t n, float* c,
                    int64_t c_stride, float* panel) {
  const int64_t k = w.cols;
  const int64_t blocks = (s + kRowBlock - 1) / kRowBlock;
  for (int64_t q = 0; q * kGemmPanel < n; ++q) {
    const int64_t row = r0 + q * kGemmPanel;
    const int64_t cols = Min(kGemmPanel, n - q * kGemmPanel);
    PackPanel(w, row, cols, panel);
    // While the row blocks go through this panel, the next panel's weights come into L2: packing
    // reads them from there rather than waiting on DRAM.
    const Prefetch next = PanelAfter(w, row + kGemmPanel);
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t i = b * kRowBlock;
      const int rows = static_cast<int>(Min(kRowBlock, s - i));
      float* out = c + i * c_stride + q * kGemmPanel;
      const Prefetch share = Part(next, b, blocks);
      if (rows == kRowBlock) {
        MicroKernel<kRowBlock>(x + i * k, k, panel, k, out, c_stride, cols, share);
      } else {
        TailKernel(rows, x + i * k, k, panel, k, out, c_stride, cols, share);
      }
    }
  }
}

}  // namespace KVDIFF_ISA
}  // namespace kvdiff::impl
