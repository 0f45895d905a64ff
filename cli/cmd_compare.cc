// kvdiff compare A.safetensors B.safetensors: two logits dumps, row by row, against a tolerance.
// Lets a user check logits from their own port (saved with safetensors) against kvdiff's.
#include <fmt/format.h>

#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cli/commands.h"
#include "format/error.h"
#include "format/safetensors.h"
#include "harness/compare/compare.h"

namespace kvdiff::cli {
namespace {

struct CompareOptions {
  std::string a, b;
  std::string tensor = "logits";
  std::optional<double> tolerance;
};

// Row i's status: a NaN/inf logit is a failure of its own kind, reported before any difference.
struct RowResult {
  std::string nonfinite;  // "a: 17 of 256 values NaN"; empty when both rows are finite
  harness::RowComparison cmp;
};

int RunCompare(const CompareOptions& o) {
  const double tolerance = harness::ResolveTolerance(o.tolerance, std::nullopt);
  const format::SafetensorsFile fa = format::SafetensorsFile::Open(o.a);
  const format::SafetensorsFile fb = format::SafetensorsFile::Open(o.b);
  const format::TensorView& va = fa.Get(o.tensor);
  const format::TensorView& vb = fb.Get(o.tensor);
  KVDIFF_CHECK(va.shape == vb.shape, "tensor \"{}\" shapes differ: {} has [{}], {} has [{}]",
               o.tensor, o.a, fmt::join(va.shape, ", "), o.b, fmt::join(vb.shape, ", "));
  // Rows are every index but the last (logits [n, vocab]: one row per position).
  const int64_t cols = va.shape.empty() ? 1 : va.shape.back();
  const int64_t rows = cols == 0 ? 0 : va.NumElements() / cols;
  KVDIFF_CHECK(rows > 0 && cols > 0,
               "tensor \"{}\" [{}] holds no values: nothing to compare (expected logits [n, vocab] "
               "with n, vocab >= 1)",
               o.tensor, fmt::join(va.shape, ", "));
  const std::vector<float> a = fa.ReadFloat(o.tensor);
  const std::vector<float> b = fb.ReadFloat(o.tensor);

  // The table shows the first 10 rows, the first 5 beyond tolerance, and the last row: only
  // those are kept (a row's result is ~140 bytes, more than a small vocabulary's logits).
  constexpr int64_t kFirstRows = 10, kFirstBad = 5;
  std::map<int64_t, RowResult> shown;
  int64_t first_bad = -1, num_bad = 0, argmax_agree = 0;
  double worst = 0;
  int64_t worst_row = 0;
  for (int64_t i = 0; i < rows; ++i) {
    RowResult r;
    const float* ra = a.data() + i * cols;
    const float* rb = b.data() + i * cols;
    for (const auto& [name, row] : {std::pair{"a", ra}, std::pair{"b", rb}}) {
      const std::string bad = harness::DescribeNonFinite(row, cols);
      if (!bad.empty() && r.nonfinite.empty()) r.nonfinite = fmt::format("{}: {}", name, bad);
    }
    r.cmp = harness::CompareRows(ra, rb, cols, tolerance);
    const bool bad = !r.cmp.within_tolerance;
    if (bad) {
      ++num_bad;
      if (first_bad < 0) first_bad = i;
    }
    if (r.nonfinite.empty()) {
      if (r.cmp.argmax_agrees()) ++argmax_agree;
      if (r.cmp.max_abs_diff > worst) {
        worst = r.cmp.max_abs_diff;
        worst_row = i;
      }
    }
    if (i < kFirstRows || (bad && num_bad <= kFirstBad) || i == rows - 1) {
      shown.emplace(i, std::move(r));
    }
  }

  fmt::print("compare \"{}\" [{}] {}: {} vs {}, tolerance {}\n", o.tensor,
             fmt::join(va.shape, ", "), format::DTypeName(va.dtype), o.a, o.b, tolerance);
  fmt::print("{:>6}  {:>11}  {:>7}  {:>8}  {:>8}  {:>5}  {:>9}  {}\n", "row", "max|a-b|", "at col",
             "argmax a", "argmax b", "top-5", "margin b", "status");
  int64_t last_shown = -1;
  for (const auto& [i, r] : shown) {
    if (i != last_shown + 1) fmt::print("{:>6}\n", "...");
    last_shown = i;
    if (!r.nonfinite.empty()) {
      fmt::print("{:>6}  {:>11}  {:>7}  {:>8}  {:>8}  {:>5}  {:>9}  non-finite logits ({})\n", i,
                 "-", r.cmp.nonfinite_index, "-", "-", "-", "-", r.nonfinite);
      continue;
    }
    const harness::RowComparison& c = r.cmp;
    fmt::print("{:>6}  {:>11.3e}  {:>7}  {:>8}  {:>8}  {:>5}  {:>9.3g}  {}{}\n", i, c.max_abs_diff,
               c.max_diff_index, c.argmax_a, c.argmax_b, fmt::format("{}/5", c.top5_overlap),
               c.margin, c.within_tolerance ? "ok" : "BEYOND TOLERANCE",
               c.argmax_agrees() ? "" : ", argmax differs");
  }
  if (last_shown != rows - 1) fmt::print("{:>6}\n", "...");

  fmt::print("{} rows: {} within tolerance, argmax agrees on {}; max |a-b| = {:.3e} (row {})\n",
             rows, rows - num_bad, argmax_agree, worst, worst_row);
  if (first_bad < 0) return 0;
  const RowResult& r = shown.at(first_bad);  // the first of the rows beyond tolerance shown
  if (!r.nonfinite.empty()) {
    const int64_t col = r.cmp.nonfinite_index;
    fmt::print(
        "first row beyond tolerance: row {}, col {}: non-finite logits ({}; a = {}, b = {})\n",
        first_bad, col, r.nonfinite, a[first_bad * cols + col], b[first_bad * cols + col]);
    return 1;
  }
  const int64_t col = r.cmp.max_diff_index;
  fmt::print(
      "first row beyond tolerance: row {}, col {}: a = {}, b = {}, |a-b| = {:.3e} > {}; "
      "argmax a {}, b {}\n",
      first_bad, col, a[first_bad * cols + col], b[first_bad * cols + col], r.cmp.max_abs_diff,
      tolerance, r.cmp.argmax_a, r.cmp.argmax_b);
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
  cmd->add_option(
      "--tolerance", options->tolerance,
      fmt::format("Largest allowed |a-b| (absolute; default {})", harness::kDefaultTolerance));
  cmd->callback([options, &exit_code] { exit_code = RunCompare(*options); });
}

}  // namespace kvdiff::cli
