// The random numbers of a campaign's case k: a stream of format/prng.h's SplitMix64 named by
// (seed, k), so case k is the same on every platform and whichever shard or job runs it
// (std distributions are not portable). The case generator draws a case's steps from it and the
// shape generator (harness/campaign/shape_generator.h) the case's model, each from a stream of its
// own.
#pragma once

#include <cstdint>

#include "format/prng.h"

namespace kvdiff::harness {

class CaseRng {
 public:
  explicit CaseRng(uint64_t seed) : state_(seed) {}
  uint64_t Next() { return format::SplitMix64(state_); }
  // Uniform in [0, n), n >= 1 (the modulo bias is irrelevant at these sizes).
  int64_t Below(int64_t n) { return static_cast<int64_t>(Next() % static_cast<uint64_t>(n)); }
  int64_t Between(int64_t lo, int64_t hi) { return lo + Below(hi - lo + 1); }  // inclusive
  bool Chance(int percent) { return Below(100) < percent; }
  template <typename T, size_t N>
  T Pick(const T (&options)[N]) {
    return options[Below(static_cast<int64_t>(N))];
  }

 private:
  uint64_t state_;
};

// The stream of case k: seed and k mixed so neighbouring cases (and seeds) start far apart.
inline uint64_t CaseStream(uint64_t seed, int64_t k) {
  CaseRng mix(seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull);
  return mix.Next() ^ (static_cast<uint64_t>(k) * 0xD1B54A32D192ED03ull);
}

}  // namespace kvdiff::harness
