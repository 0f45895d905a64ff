// The comparison of two logits rows: the arithmetic every report is built on.
#pragma once

#include <cstdint>

namespace kvdiff::harness {

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
  bool within_tolerance = false;

  bool argmax_agrees() const { return argmax_a == argmax_b; }
};

// a: the row under test; b: its oracle (the margin is read from b). Rows of n >= 1 values.
// within_tolerance: every value finite and max |a - b| <= tolerance.
RowComparison CompareRows(const float* a, const float* b, int64_t n, double tolerance);

// Index of the largest value (the first one on ties, like torch.argmax); NaN never wins.
int64_t Argmax(const float* row, int64_t n);

}  // namespace kvdiff::harness
