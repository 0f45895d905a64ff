// The vector registers of the compilation including this header (impl/isa.h), as one small type
// for the kernels written with intrinsics once for both AVX-512 and AVX2 (the rows path in
// linear_kernels.cc, the AVX2 GEMM micro-kernel in gemm.cc): a Vec of kVecWidth float32 lanes,
// weight loads of every storage widened exactly into it (weight_load.h's Load types), one fused
// multiply-add, stores. The kernels keep their definitions' lane layout (Dot's 32 lanes, the GEMM
// panel's 32 columns) in 32 / kVecWidth Vecs, so the width changes the instructions, never which
// products are summed into which lane, nor their order. KVDIFF_HAS_VEC says whether it exists.
#pragma once

#include <cstdint>
#include <type_traits>

#include "impl/isa.h"
#include "impl/weight_load.h"

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#define KVDIFF_HAS_VEC 1

namespace kvdiff::impl {
inline namespace KVDIFF_ISA {

// FoldLanes<8> of 8 lanes: lane j += lane j + 4 (the two 128-bit halves), then + 2, then + 1.
inline float Fold8(__m256 v) {
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

// Vec is the compiler's own vector type, not a struct around it: GCC 12 kept an array of such
// structs in memory, storing every accumulator to the stack on every step of the GEMM loop.
#if defined(__AVX512F__)
using Vec = __m512;
constexpr int kVecWidth = 16;
inline Vec VecZero() { return _mm512_setzero_ps(); }
inline Vec VecBroadcast(float a) { return _mm512_set1_ps(a); }
inline Vec VecLoad(const float* p) { return _mm512_loadu_ps(p); }
// kVecWidth weights of storage Load::T from p, as float32 (exact).
template <class Load>
Vec VecWiden(const typename Load::T* p) {
  return Load::Get16(p);
}
inline void VecStore(float* p, Vec v) { _mm512_storeu_ps(p, v); }
// The first n <= kVecWidth lanes only.
inline void VecStoreFirst(float* p, Vec v, int64_t n) {
  _mm512_mask_storeu_ps(p, static_cast<__mmask16>((1u << n) - 1), v);
}
// a * b + c rounded once, lane by lane.
inline Vec VecFma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
// FoldLanes<32> of the 32 lanes in acc[0], acc[1] (lanes 0..15, 16..31): the same tree, in
// registers. Its first step (lane j += lane j + 16) is acc[0] + acc[1].
inline float VecFold32(const Vec* acc) {
  const __m512 s16 = _mm512_add_ps(acc[0], acc[1]);
  const __m256 high = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(s16), 1));
  return Fold8(_mm256_add_ps(_mm512_castps512_ps256(s16), high));
}
#else
using Vec = __m256;
constexpr int kVecWidth = 8;
inline Vec VecZero() { return _mm256_setzero_ps(); }
inline Vec VecBroadcast(float a) { return _mm256_set1_ps(a); }
inline Vec VecLoad(const float* p) { return _mm256_loadu_ps(p); }
template <class Load>
Vec VecWiden(const typename Load::T* p) {
  if constexpr (std::is_same_v<Load, LoadF32>) {
    return _mm256_loadu_ps(p);
  } else {
    const __m128i half = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    if constexpr (std::is_same_v<Load, LoadBF16>) {  // bf16: the top half of a float32
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(half), 16));
    } else {
      static_assert(std::is_same_v<Load, LoadF16>);
      return _mm256_cvtph_ps(half);  // F16C: exact, subnormals included
    }
  }
}
inline void VecStore(float* p, Vec v) { _mm256_storeu_ps(p, v); }
inline void VecStoreFirst(float* p, Vec v, int64_t n) {
  alignas(32) float lanes[kVecWidth];
  _mm256_store_ps(lanes, v);
  for (int64_t l = 0; l < n; ++l) p[l] = lanes[l];
}
inline Vec VecFma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
// FoldLanes<32> of the 32 lanes in acc[0..3] (lanes 0..7, ..., 24..31), in registers: lane
// j += lane j + 16 is acc[0] + acc[2] and acc[1] + acc[3], then lane j += lane j + 8.
inline float VecFold32(const Vec* acc) {
  return Fold8(_mm256_add_ps(_mm256_add_ps(acc[0], acc[2]), _mm256_add_ps(acc[1], acc[3])));
}
#endif

}  // namespace KVDIFF_ISA
}  // namespace kvdiff::impl
#endif
