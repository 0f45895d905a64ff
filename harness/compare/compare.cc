#include "harness/compare/compare.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "format/error.h"

namespace kvdiff::harness {
namespace {

// The five largest values of a row, largest first, kept while the row is scanned once (a partial
// sort of an index vector of the vocabulary cost ~10x more at vocab 49152). Ties keep the lower
// index first: values come in index order, so a value equal to one held ranks after it. Keys are
// the values, but NaN ranks below everything (-inf), as in a strict weak ordering.
class TopFive {
 public:
  static constexpr int kSize = 5;

  // The key of value i; i must be larger than every index offered before.
  void Offer(float key, int64_t i) {
    if (count_ == kSize && !(key > keys_[kSize - 1])) return;  // the common case: not in the top
    int j = count_ < kSize ? count_++ : kSize - 1;
    for (; j > 0 && keys_[j - 1] < key; --j) {  // strictly less: equal keys keep the lower index
      keys_[j] = keys_[j - 1];
      index_[j] = index_[j - 1];
    }
    keys_[j] = key;
    index_[j] = i;
  }
  static float KeyOf(float value) {
    return std::isnan(value) ? -std::numeric_limits<float>::infinity() : value;
  }

  int count() const { return count_; }
  int64_t index(int k) const { return index_[k]; }
  // |this ∩ other|: how many indices both hold.
  int Overlap(const TopFive& other) const {
    int shared = 0;
    for (int x = 0; x < count_; ++x)
      shared += std::count(other.index_, other.index_ + other.count_, index_[x]) ? 1 : 0;
    return shared;
  }

 private:
  float keys_[kSize] = {};
  int64_t index_[kSize] = {};
  int count_ = 0;
};

// The first index where a or b is not finite; -1 when both rows are finite.
int64_t FirstNonFinite(const float* a, const float* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) return i;
  return -1;
}

// A row pair with a NaN or an inf: it fails, and only what a report prints of it is computed
// (argmax and top-5 overlap; no margin, KL or scale), as before the fused pass existed.
RowComparison CompareNonFinite(const float* a, const float* b, int64_t n, int64_t bad) {
  RowComparison c;
  c.nonfinite = true;
  c.nonfinite_index = bad;
  c.nonfinite_a = a[bad];
  c.nonfinite_b = b[bad];
  c.max_abs_diff = std::numeric_limits<double>::infinity();
  c.max_diff_index = bad;
  c.argmax_a = Argmax(a, n);
  c.argmax_b = Argmax(b, n);
  TopFive top_a, top_b;
  for (int64_t i = 0; i < n; ++i) {
    top_a.Offer(TopFive::KeyOf(a[i]), i);
    top_b.Offer(TopFive::KeyOf(b[i]), i);
  }
  c.top5_overlap = top_a.Overlap(top_b);
  return c;
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
  const std::string kl = kl_max > 0 ? fmt::format(", KL <= {:.1e}", kl_max) : "";
  if (rel <= 0) return fmt::format("abs {:.1e}{}", abs, kl);
  return fmt::format("abs {:.1e} or rel {:.1e} of max |logit|{}", abs, rel, kl);
}

double RowComparison::relative_diff() const {
  if (nonfinite) return std::numeric_limits<double>::infinity();
  return scale > 0 ? max_abs_diff / scale : (max_abs_diff > 0 ? HUGE_VAL : 0.0);
}

// Finite rows in three passes: one for everything but the KL (max |a-b|, argmax, top-5, the
// maxima and the scale), one for both softmax sums, one for the KL terms. Every double sum runs in
// index order as the two-pass-per-quantity version did, so every figure is bit-identical to it
// (tests/harness/compare_test.cc holds it against that straightforward version).
RowComparison CompareRows(const float* a, const float* b, int64_t n, const Tolerance& tolerance) {
  KVDIFF_CHECK(n >= 1, "CompareRows: rows must have at least one value, got n = {}", n);
  const int64_t bad = FirstNonFinite(a, b, n);
  if (bad >= 0) {
    RowComparison c = CompareNonFinite(a, b, n, bad);
    c.gate = tolerance.GateFor(c.scale);
    c.kl_gate = tolerance.kl_max;
    return c;
  }
  RowComparison c;
  TopFive top_a, top_b;
  double max_a = a[0], max_b = b[0];  // the log-sum-exps' shifts
  for (int64_t i = 0; i < n; ++i) {
    const double x = a[i], y = b[i];
    const double d = std::fabs(x - y);
    if (d > c.max_abs_diff || c.max_diff_index < 0) {
      c.max_abs_diff = d;
      c.max_diff_index = i;
    }
    max_a = std::max(max_a, x);
    max_b = std::max(max_b, y);
    c.scale = std::max(c.scale, std::fabs(y));
    top_a.Offer(a[i], i);  // finite: the key is the value
    top_b.Offer(b[i], i);
  }
  // Finite rows: the first of the largest values is top-5's first (Argmax's rule).
  c.argmax_a = top_a.index(0);
  c.argmax_b = top_b.index(0);
  c.top5_overlap = top_a.Overlap(top_b);
  if (n >= 2) {
    c.margin = static_cast<double>(b[top_b.index(0)]) - static_cast<double>(b[top_b.index(1)]);
  }
  // KL(softmax(b) || softmax(a)), every sum in double: with the log-sum-exps la, lb,
  // log p_x[i] = x[i] - lx, so KL = sum p_b[i] · ((b[i] - lb) - (a[i] - la)).
  double sum_a = 0, sum_b = 0;
  for (int64_t i = 0; i < n; ++i) {
    sum_a += std::exp(static_cast<double>(a[i]) - max_a);
    sum_b += std::exp(static_cast<double>(b[i]) - max_b);
  }
  const double la = max_a + std::log(sum_a), lb = max_b + std::log(sum_b);
  double kl = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double log_pb = static_cast<double>(b[i]) - lb;
    kl += std::exp(log_pb) * (log_pb - (static_cast<double>(a[i]) - la));
  }
  c.kl_divergence = std::max(kl, 0.0);  // rounding can leave -1e-17 for equal rows
  c.gate = tolerance.GateFor(c.scale);
  c.kl_gate = tolerance.kl_max;
  c.within_tolerance = c.max_abs_diff <= c.gate && !c.beyond_kl_gate();
  return c;
}

std::string FormatDiff(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  return fmt::format("{:.1e}", value);
}

}  // namespace kvdiff::harness
