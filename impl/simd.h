// The vector registers of the compilation including this header (impl/isa.h), as one small type
// for the kernels written with intrinsics once for both AVX-512 and AVX2 (the rows path in
// linear_kernels.cc, decode attention in attention_kernels.cc, the AVX2 GEMM micro-kernel in
// gemm.cc): a Vec of kVecWidth float32 lanes, weight loads of every storage widened exactly into
// it (weight_load.h's Load types), one fused multiply-add, stores, and Dot's tree (FoldLanes<32>)
// in registers, for one sum or kVecWidth sums at once. The kernels keep their definitions' lane
// layout (Dot's 32 lanes, the GEMM panel's 32 columns) in 32 / kVecWidth Vecs, so the width changes
// the instructions, never which products are summed into which lane, nor their order.
// KVDIFF_HAS_VEC says whether it exists.
#pragma once

#include <array>
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
// The steps of FoldLanes<32> that add whole registers, for the 32 lanes in acc[0], acc[1] (lanes
// 0..15, 16..31): lane j += lane j + 16 is acc[0] + acc[1]. The rest of the tree runs within the
// kVecWidth lanes left: VecFold32 for one sum, VecFoldEach for kVecWidth sums at once.
inline Vec VecFoldToWidth(const Vec* acc) { return _mm512_add_ps(acc[0], acc[1]); }
// FoldLanes<32> of the 32 lanes in acc[0], acc[1]: the same tree, in registers.
inline float VecFold32(const Vec* acc) {
  const __m512 s16 = VecFoldToWidth(acc);
  const __m256 high = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(s16), 1));
  return Fold8(_mm256_add_ps(_mm512_castps512_ps256(s16), high));
}
// The permutation that gathers, from a and b (16 / kWidth sums of kWidth lanes each, a's first),
// lanes [0, kWidth / 2) of every sum (kUpper 0) or lanes [kWidth / 2, kWidth) (kUpper 1), the
// sums kept in order: permutex2var's index, where 16 + i is lane i of b.
template <int kWidth, int kUpper>
constexpr std::array<int32_t, 16> FoldStepIndex() {
  constexpr int half = kWidth / 2, sums = 16 / kWidth;
  std::array<int32_t, 16> index{};
  for (int out = 0; out < 16; ++out) {
    const int sum = out / half, lane = out % half + kUpper * half;
    index[out] = (sum < sums ? 0 : 16) + (sum % sums) * kWidth + lane;
  }
  return index;
}
// One step of FoldLanes for many sums at once: lane j += lane j + kWidth / 2 of every sum of a and
// b; returns the 32 / kWidth sums of kWidth / 2 lanes, a's first, in order.
template <int kWidth>
inline __m512 FoldStep(__m512 a, __m512 b) {
  static constexpr std::array<int32_t, 16> kLower = FoldStepIndex<kWidth, 0>();
  static constexpr std::array<int32_t, 16> kUpperHalf = FoldStepIndex<kWidth, 1>();
  const __m512 lower = _mm512_permutex2var_ps(a, _mm512_loadu_si512(kLower.data()), b);
  const __m512 upper = _mm512_permutex2var_ps(a, _mm512_loadu_si512(kUpperHalf.data()), b);
  return _mm512_add_ps(lower, upper);
}
// Lane k = FoldLanes<16> of partials[k], k < 16: the rest of the tree for 16 sums at once, adding
// the same pairs in the same order as one sum's fold, so each lane has the bits VecFold32 gives.
inline Vec VecFoldEach(const Vec* partials) {
  __m512 width8[8], width4[4], width2[2];
  for (int i = 0; i < 8; ++i) width8[i] = FoldStep<16>(partials[2 * i], partials[2 * i + 1]);
  for (int i = 0; i < 4; ++i) width4[i] = FoldStep<8>(width8[2 * i], width8[2 * i + 1]);
  for (int i = 0; i < 2; ++i) width2[i] = FoldStep<4>(width4[2 * i], width4[2 * i + 1]);
  return FoldStep<2>(width2[0], width2[1]);
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
// The steps of FoldLanes<32> that add whole registers, for the 32 lanes in acc[0..3] (lanes 0..7,
// ..., 24..31): lane j += lane j + 16 is acc[0] + acc[2] and acc[1] + acc[3], then lane j += lane
// j + 8 adds the two. The rest of the tree runs within the 8 lanes left.
inline Vec VecFoldToWidth(const Vec* acc) {
  return _mm256_add_ps(_mm256_add_ps(acc[0], acc[2]), _mm256_add_ps(acc[1], acc[3]));
}
// FoldLanes<32> of the 32 lanes in acc[0..3]: the same tree, in registers.
inline float VecFold32(const Vec* acc) { return Fold8(VecFoldToWidth(acc)); }
// Lane k = FoldLanes<8> of partials[k], k < 8: the rest of the tree for 8 sums at once, adding the
// same pairs in the same order as Fold8, so each lane has the bits VecFold32 gives.
inline Vec VecFoldEach(const Vec* partials) {
  // lane j += lane j + 4: [a's low half | b's low half] + [a's high | b's high], sums a, b
  __m256 width4[4];
  for (int i = 0; i < 4; ++i) {
    const __m256 a = partials[2 * i], b = partials[2 * i + 1];
    width4[i] =
        _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
  }
  // lane j += lane j + 2 in each 128-bit half: sums 0..3 (two per input) in the order 0 2 1 3
  __m256 width2[2];
  for (int i = 0; i < 2; ++i) {
    const __m256d a = _mm256_castps_pd(width4[2 * i]), b = _mm256_castps_pd(width4[2 * i + 1]);
    width2[i] = _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(a, b)),
                              _mm256_castpd_ps(_mm256_unpackhi_pd(a, b)));
  }
  // lane j += lane j + 1: the sums in the order 0 2 4 6 1 3 5 7, then put in order
  const __m256 width1 =
      _mm256_add_ps(_mm256_shuffle_ps(width2[0], width2[1], _MM_SHUFFLE(2, 0, 2, 0)),
                    _mm256_shuffle_ps(width2[0], width2[1], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm256_permutevar8x32_ps(width1, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}
#endif

}  // namespace KVDIFF_ISA
}  // namespace kvdiff::impl
#endif
