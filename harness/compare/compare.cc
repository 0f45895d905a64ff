#include "harness/compare/compare.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "format/error.h"

namespace kvdiff::harness {
namespace {

// Indices of the k largest values, largest first; ties keep the lower index first.
std::vector<int64_t> TopK(const float* row, int64_t n, int64_t k) {
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

// KL(softmax(b) || softmax(a)) over finite rows, every sum in double: with the log-sum-exps
// la, lb, log p_x[i] = x[i] - lx, so KL = sum p_b[i] · ((b[i] - lb) - (a[i] - la)).
double KlDivergence(const float* a, const float* b, int64_t n) {
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
  return std::max(kl, 0.0);  // rounding can leave -1e-17 for equal rows
}

}  // namespace

double ResolveTolerance(const std::optional<double>& flag, std::optional<double> from_file) {
  if (flag) {
    KVDIFF_CHECK(std::isfinite(*flag) && *flag >= 0,
                 "--tolerance: expected a finite number >= 0, got {}", *flag);
    return *flag;
  }
  return from_file.value_or(kDefaultTolerance);
}

double MaxAbsDiff(const float* a, const float* b, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i]));
    if (!(d <= m)) m = d;  // NaN wins
  }
  return m;
}

std::string DescribeNonFinite(const float* row, int64_t n) {
  int64_t nan = 0, inf = 0, first = -1;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isfinite(row[i])) continue;
    if (first < 0) first = i;
    (std::isnan(row[i]) ? nan : inf) += 1;
  }
  if (first < 0) return "";
  if (inf == 0) return fmt::format("{} of {} values NaN", nan, n);
  if (nan == 0) return fmt::format("{} of {} values inf", inf, n);
  return fmt::format("{} of {} values not finite ({} NaN, {} inf; the first at {}: {})", nan + inf,
                     n, nan, inf, first, row[first]);
}

std::string DescribeNonFiniteLogits(const std::string& backend, const std::string& where,
                                    const float* data, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    const std::string bad = DescribeNonFinite(data + r * cols, cols);
    if (!bad.empty()) {
      return fmt::format("non-finite logits: backend {}{}, row {}, {}", backend, where, r, bad);
    }
  }
  return "";
}

int64_t Argmax(const float* row, int64_t n) {
  int64_t best = -1;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(row[i])) continue;
    if (best < 0 || row[i] > row[best]) best = i;
  }
  return best;
}

void DistributionStats::Add(const RowComparison& c) {
  ++rows;
  argmax_agree += c.argmax_agrees() ? 1 : 0;
  top5_overlap_sum += c.top5_overlap;
  kl_sum += c.kl_divergence;
  kl_max = std::max(kl_max, c.kl_divergence);
}

void DistributionStats::Merge(const DistributionStats& o) {
  rows += o.rows;
  argmax_agree += o.argmax_agree;
  top5_overlap_sum += o.top5_overlap_sum;
  kl_sum += o.kl_sum;
  kl_max = std::max(kl_max, o.kl_max);
}

std::string DistributionStats::Text() const {
  if (rows == 0) return "no rows compared";
  const double n = static_cast<double>(rows);
  return fmt::format(
      "argmax agrees on {} of {} rows ({:.2f}%), top-5 overlap {:.2f}/5, KL mean {:.1e} max "
      "{:.1e}",
      argmax_agree, rows, 100.0 * static_cast<double>(argmax_agree) / n,
      static_cast<double>(top5_overlap_sum) / n, kl_sum / n, kl_max);
}

std::string Tolerance::ToString() const {
  if (rel <= 0) return fmt::format("abs {:.1e}", abs);
  return fmt::format("abs {:.1e} or rel {:.1e} of max |logit|", abs, rel);
}

double RowComparison::relative_diff() const {
  if (nonfinite) return std::numeric_limits<double>::infinity();
  return scale > 0 ? max_abs_diff / scale : (max_abs_diff > 0 ? HUGE_VAL : 0.0);
}

RowComparison CompareRows(const float* a, const float* b, int64_t n, const Tolerance& tolerance) {
  KVDIFF_CHECK(n >= 1, "CompareRows: rows must have at least one value, got n = {}", n);
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

std::string FormatDiff(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  return fmt::format("{:.1e}", value);
}

}  // namespace kvdiff::harness
