// CompareRows as it was written before the fused single pass (one loop per quantity, top-5 by a
// partial sort of an index vector): the straightforward version the fast one is held to, field by
// field and bit by bit (compare_equivalence_test.cc), and timed beside it (tests/bench).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

#include "harness/compare/compare.h"

namespace kvdiff::harness::reference {

// Indices of the k largest values, largest first; ties keep the lower index first.
inline std::vector<int64_t> TopK(const float* row, int64_t n, int64_t k) {
  std::vector<int64_t> idx(n);
  std::iota(idx.begin(), idx.end(), 0);
  k = std::min(k, n);
  // NaN ranks below everything so the order stays a strict weak ordering.
  auto key = [row](int64_t i) {
    return std::isnan(row[i]) ? -std::numeric_limits<float>::infinity() : row[i];
  };
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&key](int64_t x, int64_t y) {
    return key(x) > key(y) || (key(x) == key(y) && x < y);
  });
  idx.resize(k);
  return idx;
}

inline double KlDivergence(const float* a, const float* b, int64_t n) {
  auto log_sum_exp = [n](const float* x) {
    double m = x[0];
    for (int64_t i = 1; i < n; ++i) m = std::max(m, static_cast<double>(x[i]));
    double s = 0;
    for (int64_t i = 0; i < n; ++i) s += std::exp(static_cast<double>(x[i]) - m);
    return m + std::log(s);
  };
  const double la = log_sum_exp(a), lb = log_sum_exp(b);
  double kl = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double log_pb = static_cast<double>(b[i]) - lb;
    kl += std::exp(log_pb) * (log_pb - (static_cast<double>(a[i]) - la));
  }
  return std::max(kl, 0.0);
}

inline RowComparison CompareRows(const float* a, const float* b, int64_t n,
                                 const Tolerance& tolerance) {
  RowComparison c;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) {
      c.nonfinite = true;
      c.nonfinite_index = i;
      c.nonfinite_a = a[i];
      c.nonfinite_b = b[i];
      break;
    }
  }
  if (c.nonfinite) {
    c.max_abs_diff = std::numeric_limits<double>::infinity();
    c.max_diff_index = c.nonfinite_index;
  } else {
    for (int64_t i = 0; i < n; ++i) {
      const double d = std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i]));
      if (d > c.max_abs_diff || c.max_diff_index < 0) {
        c.max_abs_diff = d;
        c.max_diff_index = i;
      }
    }
  }
  c.argmax_a = Argmax(a, n);
  c.argmax_b = Argmax(b, n);
  const auto top_a = TopK(a, n, 5);
  const auto top_b = TopK(b, n, 5);
  for (int64_t x : top_a) c.top5_overlap += std::count(top_b.begin(), top_b.end(), x) ? 1 : 0;
  if (!c.nonfinite && n >= 2) {
    c.margin = static_cast<double>(b[top_b[0]]) - static_cast<double>(b[top_b[1]]);
  }
  if (!c.nonfinite) c.kl_divergence = KlDivergence(a, b, n);
  if (!c.nonfinite) {
    for (int64_t i = 0; i < n; ++i)
      c.scale = std::max(c.scale, std::fabs(static_cast<double>(b[i])));
  }
  c.gate = std::max(tolerance.abs, tolerance.rel * c.scale);
  c.within_tolerance = !c.nonfinite && c.max_abs_diff <= c.gate;
  return c;
}

}  // namespace kvdiff::harness::reference
