// The comparison of two logits rows: the arithmetic every report is built on.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>

namespace kvdiff::harness {

// The gate: max |a - b| over a logits row, absolute. float32 Llamas of the sizes kvdiff runs
// agree with a float64 one to ~2e-5 (docs/concepts.md, "Tolerances"); a wrong position or a stale
// cache moves logits by far more.
inline constexpr double kDefaultTolerance = 1e-4;

// The tolerance of a run, resolved once: the --tolerance flag, else the file's (scenario or
// golden), else kDefaultTolerance. InputError when the flag is negative or not finite.
double ResolveTolerance(const std::optional<double>& flag, std::optional<double> from_file);

// The gate of a row: max |a - b| <= abs, or <= rel * max_i |b_i| when rel > 0. The relative part
// is for models whose logits are in the thousands (make-model --scale demanding), where float32
// rounding alone is ~1e-7 of the logits' size and an absolute 1e-4 means nothing
// (docs/campaign-cases.md, "The demanding part"); rel = 0 is the plain absolute gate.
//
// kl_max > 0 gates the next-token distribution too: KL(softmax(oracle) || softmax(row)) <= kl_max.
// A tolerance profile of a quantized cache sets it (tolerance_profile.h): there max |a-b| grows
// with the logits' spread, while the KL says how far the distribution a user samples from moved.
struct Tolerance {
  double abs = kDefaultTolerance;
  double rel = 0;
  double kl_max = 0;                                                   // 0: no gate on the KL
  Tolerance(double abs_gate = kDefaultTolerance, double rel_gate = 0,  // NOLINT: a double is abs
            double kl_gate = 0)
      : abs(abs_gate), rel(rel_gate), kl_max(kl_gate) {}
  // The gate of a row whose oracle's largest |logit| is `scale`: max(abs, rel * scale).
  double GateFor(double scale) const { return std::max(abs, rel * scale); }
  // "abs 1.0e-04" or "abs 1.0e-04 or rel 2.0e-06 of max |logit|"
  std::string ToString() const;
};

struct RowComparison {
  // NaN/inf is checked before anything else: the first index where either row is not finite.
  bool nonfinite = false;
  int64_t nonfinite_index = -1;
  float nonfinite_a = 0, nonfinite_b = 0;
  double max_abs_diff = 0;      // max |a - b|; +inf when a value is not finite
  int64_t max_diff_index = -1;  // where max |a - b| is reached
  int64_t argmax_a = -1, argmax_b = -1;
  int top5_overlap = 0;  // |top5(a) ∩ top5(b)|, 0..5 (min(5, n) for short rows)
  double margin = 0;     // b's top logit minus its second: a small margin means a near-tie
  // KL(softmax(b) || softmax(a)) in nats, in double: how far a's next-token distribution is from
  // the oracle's, as llama.cpp's perplexity tool reports it (0 for NaN/inf rows).
  double kl_divergence = 0;
  double scale = 0;    // max |b_i| (b finite): what a relative tolerance is relative to
  double gate = 0;     // the row's gate: tolerance.GateFor(scale)
  double kl_gate = 0;  // the row's gate on kl_divergence (Tolerance::kl_max; 0: none)
  bool within_tolerance = false;

  // Whether the row fails on its KL gate (it may also fail on max |a-b|).
  bool beyond_kl_gate() const { return kl_gate > 0 && !(kl_divergence <= kl_gate); }

  // max |a - b| / max |b_i|: the difference relative to the row's scale (inf when not finite).
  double relative_diff() const;

  bool argmax_agrees() const { return argmax_a == argmax_b; }
};

// The metrics of many compared rows that llama.cpp's perplexity tool reports for a quantized or
// lower-precision engine: how often the argmax agrees, the top-5 overlap, the KL divergence of
// the next-token distributions. Reports print them for the paths of a backend held to a tolerance
// profile (a max-abs bound alone says nothing of how the distribution moved).
struct DistributionStats {
  int64_t rows = 0;
  int64_t argmax_agree = 0;
  int64_t top5_overlap_sum = 0;
  double kl_sum = 0, kl_max = 0;

  void Add(const RowComparison& c);
  void Merge(const DistributionStats& other);
  // "argmax agrees on 3071 of 3072 rows (99.97%), top-5 overlap 4.98/5, KL mean 2.1e-07
  // max 3.4e-06"
  std::string Text() const;
};

// a: the row under test; b: its oracle (the margin is read from b). Rows of n >= 1 values.
// within_tolerance: every value finite, max |a - b| <= the row's gate and, when the tolerance has a
// KL gate, the KL within it (Tolerance).
RowComparison CompareRows(const float* a, const float* b, int64_t n, const Tolerance& tolerance);

// Index of the largest value (the first one on ties, like torch.argmax); NaN never wins.
int64_t Argmax(const float* row, int64_t n);

// max |a_i - b_i| over n values, accumulated in double; NaN when any difference is NaN.
double MaxAbsDiff(const float* a, const float* b, int64_t n);

// The NaN/inf policy's one check: empty when every value is finite, else what is wrong, e.g.
// "17 of 256 values NaN" or "3 of 256 values not finite (1 NaN, 2 inf; the first at 40: inf)".
// A non-finite logit is a failure of its own kind, never a difference of inf.
std::string DescribeNonFinite(const float* row, int64_t n);

// DescribeNonFinite over a row-major (rows, cols) block of one backend's output: empty when every
// value is finite, else the message of the first bad row, e.g. "non-finite logits: backend impl,
// row 2, 17 of 256 values NaN". `where` (", step 3") goes after the backend when not empty.
std::string DescribeNonFiniteLogits(const std::string& backend, const std::string& where,
                                    const float* data, int64_t rows, int64_t cols);

// A difference as every report spells it: "3.2e-07", "inf", "nan".
std::string FormatDiff(double value);

}  // namespace kvdiff::harness
