// kvdiff's own pseudo-random numbers: the same bits on every platform, compiler and standard
// library (std::normal_distribution and std::hash are implementation-defined, so they are not
// used).
//   SplitMix64 (Steele, Lea, Flood 2014) seeds xoshiro256** (Blackman, Vigna 2018);
//   Fnv1a64 names a stream; Normal() is Irwin-Hall: the sum of 12 uniforms minus 6.
#pragma once

#include <cstdint>
#include <string_view>

namespace kvdiff::format {

inline uint64_t SplitMix64(uint64_t& state) {
  state += 0x9E3779B97F4A7C15ull;
  uint64_t z = state;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// 64-bit FNV-1a of the bytes of `text`; pass the previous result as `h` to hash in pieces.
inline constexpr uint64_t kFnv1a64Offset = 0xCBF29CE484222325ull;
inline uint64_t Fnv1a64(std::string_view text, uint64_t h = kFnv1a64Offset) {
  for (unsigned char c : text) {
    h ^= c;
    h *= 0x100000001B3ull;
  }
  return h;
}

class Xoshiro256 {
 public:
  // The four state words are successive SplitMix64 outputs from `seed` (never all zero).
  explicit Xoshiro256(uint64_t seed) {
    uint64_t sm = seed;
    for (uint64_t& word : s_) word = SplitMix64(sm);
  }
  // An independent stream per (seed, name): a tensor's values do not depend on which other tensors
  // exist or in which order they are generated.
  static Xoshiro256 ForStream(uint64_t seed, std::string_view name) {
    return Xoshiro256(seed ^ Fnv1a64(name));
  }

  uint64_t Next() {
    const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = Rotl(s_[3], 45);
    return result;
  }

  // Uniform in [0, 1) with 53 random bits (exact: an integer times a power of two).
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

  // Approximately N(0, 1), without libm: Irwin-Hall with 12 uniforms of 24 bits (two per Next(),
  // taken from bits 40..63 and 16..39), centred exactly. Every step is integer arithmetic or a
  // multiplication by a power of two, so the double is exact and identical everywhere. Range
  // (-6, 6); variance 1 - 2^-48.
  double Normal() {
    int64_t sum = 0;
    for (int i = 0; i < 6; ++i) {
      const uint64_t x = Next();
      sum += static_cast<int64_t>(x >> 40) + static_cast<int64_t>((x >> 16) & 0xFFFFFF);
    }
    // (sum - 6 (2^24 - 1)) / 2^24, written with integers to keep it exact.
    return static_cast<double>(2 * sum - 12 * ((int64_t{1} << 24) - 1)) * 0x1.0p-25;
  }

 private:
  static uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

}  // namespace kvdiff::format
