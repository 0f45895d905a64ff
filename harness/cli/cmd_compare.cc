// kvdiff compare A.safetensors B.safetensors: two logits dumps, row by row, against a tolerance.
// Lets a user check logits from their own port (saved with safetensors) against kvdiff's.
#include <fmt/format.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "harness/cli/commands.h"
#include "format/error.h"
#include "format/safetensors.h"

namespace kvdiff::cli {
namespace {

struct CompareOptions {
  std::string a, b;
  std::string tensor = "logits";
  double tolerance = 1e-4;
};

struct RowResult {
  bool finite = true;
  int64_t bad_col = -1;  // first non-finite column (when !finite)
  double max_diff = 0;
  int64_t max_col = 0;
  int64_t argmax_a = 0, argmax_b = 0;
};

int64_t Argmax(const float* row, int64_t cols) {
  int64_t best = 0;
  for (int64_t j = 1; j < cols; ++j) {
    if (row[j] > row[best]) best = j;
  }
  return best;
}

RowResult CompareRow(const float* a, const float* b, int64_t cols) {
  RowResult r;
  // NaN/inf first: an aggregate over a row with a NaN would hide where it came from.
  for (int64_t j = 0; j < cols; ++j) {
    if (!std::isfinite(a[j]) || !std::isfinite(b[j])) {
      r.finite = false;
      r.bad_col = j;
      return r;
    }
  }
  for (int64_t j = 0; j < cols; ++j) {
    const double d = std::fabs(static_cast<double>(a[j]) - static_cast<double>(b[j]));
    if (d > r.max_diff) {
      r.max_diff = d;
      r.max_col = j;
    }
  }
  r.argmax_a = Argmax(a, cols);
  r.argmax_b = Argmax(b, cols);
  return r;
}

int RunCompare(const CompareOptions& o) {
  KVDIFF_CHECK(std::isfinite(o.tolerance) && o.tolerance >= 0,
               "--tolerance: expected a non-negative number, found {}", o.tolerance);
  const format::SafetensorsFile fa = format::SafetensorsFile::Open(o.a);
  const format::SafetensorsFile fb = format::SafetensorsFile::Open(o.b);
  const format::TensorView& va = fa.Get(o.tensor);
  const format::TensorView& vb = fb.Get(o.tensor);
  KVDIFF_CHECK(va.shape == vb.shape, "tensor \"{}\" shapes differ: {} has [{}], {} has [{}]",
               o.tensor, o.a, fmt::join(va.shape, ", "), o.b, fmt::join(vb.shape, ", "));
  // Rows are every index but the last (logits [n, vocab]: one row per position).
  const int64_t cols = va.shape.empty() ? 1 : va.shape.back();
  const int64_t rows = cols == 0 ? 0 : va.NumElements() / cols;
  const std::vector<float> a = fa.ReadFloat(o.tensor);
  const std::vector<float> b = fb.ReadFloat(o.tensor);

  std::vector<RowResult> results(static_cast<size_t>(rows));
  int64_t first_bad = -1, num_bad = 0, argmax_agree = 0;
  double worst = 0;
  int64_t worst_row = 0;
  for (int64_t i = 0; i < rows; ++i) {
    RowResult& r = results[i];
    r = CompareRow(a.data() + i * cols, b.data() + i * cols, cols);
    const bool bad = !r.finite || r.max_diff > o.tolerance;
    if (bad) {
      ++num_bad;
      if (first_bad < 0) first_bad = i;
    }
    if (r.finite && r.argmax_a == r.argmax_b) ++argmax_agree;
    if (r.finite && r.max_diff > worst) {
      worst = r.max_diff;
      worst_row = i;
    }
  }

  fmt::print("compare \"{}\" [{}] {}: {} vs {}, tolerance {}\n", o.tensor,
             fmt::join(va.shape, ", "), format::DTypeName(va.dtype), o.a, o.b, o.tolerance);
  // The table: the first 10 rows, the first 5 rows beyond tolerance, and the last row.
  std::vector<bool> show(static_cast<size_t>(rows), false);
  for (int64_t i = 0; i < rows && i < 10; ++i) show[i] = true;
  for (int64_t i = 0, shown_bad = 0; i < rows && shown_bad < 5; ++i) {
    const RowResult& r = results[i];
    if (!r.finite || r.max_diff > o.tolerance) {
      show[i] = true;
      ++shown_bad;
    }
  }
  if (rows > 0) show[rows - 1] = true;
  fmt::print("{:>6}  {:>11}  {:>7}  {:>8}  {:>8}  {}\n", "row", "max|a-b|", "at col", "argmax a",
             "argmax b", "status");
  int64_t last_shown = -1;
  for (int64_t i = 0; i < rows; ++i) {
    if (!show[i]) continue;
    if (i != last_shown + 1) fmt::print("{:>6}\n", "...");
    last_shown = i;
    const RowResult& r = results[i];
    if (!r.finite) {
      fmt::print("{:>6}  {:>11}  {:>7}  {:>8}  {:>8}  non-finite (a = {}, b = {})\n", i, "-",
                 r.bad_col, "-", "-", a[i * cols + r.bad_col], b[i * cols + r.bad_col]);
      continue;
    }
    fmt::print("{:>6}  {:>11.3e}  {:>7}  {:>8}  {:>8}  {}{}\n", i, r.max_diff, r.max_col,
               r.argmax_a, r.argmax_b, r.max_diff > o.tolerance ? "BEYOND TOLERANCE" : "ok",
               r.argmax_a != r.argmax_b ? ", argmax differs" : "");
  }
  if (last_shown != rows - 1 && rows > 0) fmt::print("{:>6}\n", "...");

  fmt::print("{} rows: {} within tolerance, argmax agrees on {}; max |a-b| = {:.3e} (row {})\n",
             rows, rows - num_bad, argmax_agree, worst, worst_row);
  if (first_bad < 0) return 0;
  const RowResult& r = results[first_bad];
  const int64_t col = r.finite ? r.max_col : r.bad_col;
  fmt::print("first row beyond tolerance: row {}, col {}: a = {}, b = {}{}\n", first_bad, col,
             a[first_bad * cols + col], b[first_bad * cols + col],
             r.finite ? fmt::format(", |a-b| = {:.3e} > {}; argmax a {}, b {}", r.max_diff,
                                    o.tolerance, r.argmax_a, r.argmax_b)
                      : std::string(" (not finite)"));
  return 1;
}

}  // namespace

void AddCompareCommand(CLI::App& app, int& exit_code) {
  auto options = std::make_shared<CompareOptions>();
  CLI::App* cmd = app.add_subcommand(
      "compare",
      "Compare two logits files (safetensors) row by row; exit 0 if every row is within "
      "tolerance, 1 if not, 2 on bad input");
  cmd->add_option("a", options->a, "First safetensors file")->required();
  cmd->add_option("b", options->b, "Second safetensors file")->required();
  cmd->add_option("--tensor", options->tensor, "Tensor to compare")->capture_default_str();
  cmd->add_option("--tolerance", options->tolerance, "Largest allowed |a-b| (absolute)")
      ->capture_default_str();
  cmd->callback([options, &exit_code] { exit_code = RunCompare(*options); });
}

}  // namespace kvdiff::cli
