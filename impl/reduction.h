// The one order in which impl ends a sum of interleaved partial sums, shared by every kernel that
// reduces (sums, maxima, dot products), so that a sum taken in two places gives the same bits.
#pragma once

#include "impl/isa.h"

namespace kvdiff::impl {
inline namespace KVDIFF_ISA {

// The fixed tree every reduction ends with: acc[j] += acc[j + width] for width = kLanes / 2,
// ..., 1; returns acc[0]. The same tree wherever a sum is taken gives the same bits.
template <int kLanes>
float FoldLanes(float* acc) {
  for (int width = kLanes / 2; width >= 1; width /= 2) {
    for (int j = 0; j < width; ++j) acc[j] += acc[j + width];
  }
  return acc[0];
}

}  // namespace KVDIFF_ISA
}  // namespace kvdiff::impl
