// Loads of weight values as float32: the identity for float32 storage, the exact widening for
// 16-bit storage. Every kernel over weights (the decode and rows products in linear_kernels.cc,
// the GEMM's panel packing in gemm.cc) is a template on one of these, so the float32 and the 16-bit
// instantiations are the same code with the same operations in the same order.
#pragma once

#include <cstdint>
#include <cstring>

#include "impl/isa.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace kvdiff::impl {

constexpr int kCacheLine = 64;  // bytes: the unit the weight kernels prefetch in

float WidenF16(uint16_t bits);  // kernels.h: the software widening, where there is no _Float16

inline namespace KVDIFF_ISA {

struct LoadF32 {
  using T = float;
  static float Get(const float* p) { return *p; }
#if defined(__AVX512F__)
  static __m512 Get16(const float* p) { return _mm512_loadu_ps(p); }
#endif
};

struct LoadBF16 {  // bf16 is the top half of a float32: shift it back into place
  using T = uint16_t;
  static float Get(const uint16_t* p) {
    const uint32_t bits = static_cast<uint32_t>(*p) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof(f));
    return f;
  }
#if defined(__AVX512F__)
  static __m512 Get16(const uint16_t* p) {
    const __m256i half = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
  }
#endif
};

struct LoadF16 {
  using T = uint16_t;
  static float Get(const uint16_t* p) {
#ifdef __FLT16_MAX__
    _Float16 h;  // vcvtph2ps where the CPU has F16C
    std::memcpy(&h, p, sizeof(h));
    return static_cast<float>(h);
#else
    return WidenF16(*p);
#endif
  }
#if defined(__AVX512F__)
  static __m512 Get16(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
#endif
};

// Asks for every cache line of the `bytes` bytes that begin `ahead` bytes past p, for the kernels
// that read from DRAM faster than the hardware prefetcher alone fetches (the decode products,
// decode attention). A hint only: it never faults, and its address is computed as an integer, so
// no pointer past the data is formed.
inline void PrefetchLinesAhead(const void* p, uintptr_t ahead, uintptr_t bytes) {
  const uintptr_t first = reinterpret_cast<uintptr_t>(p) + ahead;
  for (uintptr_t b = 0; b < bytes; b += kCacheLine) {
    __builtin_prefetch(reinterpret_cast<const void*>(first + b));
  }
}

}  // namespace KVDIFF_ISA
}  // namespace kvdiff::impl
