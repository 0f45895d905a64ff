// golden regen: recompute a golden set and rewrite it atomically when something moved.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <optional>
#include <set>

#include "format/error.h"
#include "format/model_files.h"
#include "harness/backend/registry.h"
#include "harness/golden/golden.h"
#include "harness/golden/golden_detail.h"
#include "harness/golden/sha256.h"
#include "harness/replay/drivers.h"
#include "harness/replay/oracle_check.h"
#include "harness/replay/replay.h"
#include "harness/report/run_report.h"

namespace kvdiff::harness {

using namespace golden_detail;
namespace fs = std::filesystem;
using nlohmann::json;

std::string GoldenChange::Summary() const {
  if (is_new) return fmt::format("new golden ({} rows)", rows_total);
  std::vector<std::string> parts;
  if (rows_changed > 0) {
    parts.push_back(fmt::format("{} of {} rows changed, largest change {}{}", rows_changed,
                                rows_total, FormatDiff(largest_change),
                                largest_where.empty() ? "" : " at " + largest_where));
    parts.push_back(
        fmt::format("{} token{} changed", tokens_changed, tokens_changed == 1 ? "" : "s"));
  }
  if (!header_fields.empty())
    parts.push_back(fmt::format("header: {}", fmt::join(header_fields, ", ")));
  if (parts.empty()) {
    return fmt::format("{} rows, nothing moved (largest change {})", rows_total,
                       FormatDiff(largest_change));
  }
  return fmt::format("{}", fmt::join(parts, "; "));
}

GoldenChange DiffGolden(const Golden& a, const Golden& b) {
  GoldenChange c;
  c.rows_total = static_cast<int64_t>(b.rows.size());
  auto header = [&c](const char* name, bool same) {
    if (!same) c.header_fields.push_back(name);
  };
  header("scenario", a.scenario == b.scenario);
  header("scenario_sha256", a.scenario_sha256 == b.scenario_sha256);
  header("model", a.model == b.model);
  header("model_files", a.model_files == b.model_files);
  header("model_description", a.model_description == b.model_description);
  header("vocab_size", a.vocab_size == b.vocab_size);
  header("backend", a.backend == b.backend);
  header("dtype", a.dtype == b.dtype);
  header("driver", a.driver == b.driver);
  header("tolerance", a.tolerance == b.tolerance);
  header("top_k", a.top_k == b.top_k);
  header("kvdiff_version", a.kvdiff_version == b.kvdiff_version);
  header("regenerate", a.regenerate == b.regenerate);
  header("rows_file", a.rows_file == b.rows_file);
  if (a.rows.size() != b.rows.size() || a.vocab_size != b.vocab_size) {
    header("rows", false);
    c.rows_changed = c.rows_total;
    return c;
  }
  const double noise = kGoldenNoiseFraction * b.tolerance;
  for (size_t i = 0; i < b.rows.size(); ++i) {
    const GoldenRow& x = a.rows[i];
    const GoldenRow& y = b.rows[i];
    bool changed = x.step != y.step || x.row != y.row || x.conversation != y.conversation ||
                   x.position != y.position || x.full != y.full || x.top_k.size() != y.top_k.size();
    if (x.token != y.token || x.greedy != y.greedy) {
      ++c.tokens_changed;
      changed = true;
    }
    double largest = std::max(std::fabs(x.max - y.max), std::fabs(x.min - y.min));
    std::map<Token, float> xs(x.top_k.begin(), x.top_k.end());
    for (const auto& [id, logit] : y.top_k) {
      auto it = xs.find(id);
      if (it == xs.end()) {
        changed = true;  // a different top-k set
      } else {
        largest = std::max(largest, std::fabs(double(it->second) - logit));
      }
    }
    if (!y.full.empty()) {
      auto fa = a.full_rows.find(x.full);
      auto fb = b.full_rows.find(y.full);
      const double d = (fa == a.full_rows.end() || fb == b.full_rows.end()) ? INFINITY
                       : fa->second.size() != fb->second.size()
                           ? INFINITY
                           : MaxAbsDiff(fa->second.data(), fb->second.data(),
                                        static_cast<int64_t>(fa->second.size()));
      if (std::isinf(d))
        changed = true;
      else
        largest = std::max(largest, d);
    }
    const DigestTolerance t = DigestTolerances(b.tolerance, b.vocab_size, y.sum_sq);
    if (largest > noise || std::fabs(x.sum - y.sum) > kGoldenNoiseFraction * t.sum ||
        std::fabs(x.sum_sq - y.sum_sq) > kGoldenNoiseFraction * t.sum_sq) {
      changed = true;
    }
    if (largest > c.largest_change) {
      c.largest_change = largest;
      c.largest_where = Where(y);
    }
    if (changed) ++c.rows_changed;
  }
  return c;
}

std::string RegenStatusName(RegenStatus s) {
  switch (s) {
    case RegenStatus::kUnchanged:
      return "unchanged";
    case RegenStatus::kWritten:
      return "written";
    case RegenStatus::kWouldChange:
      return "would change";
    case RegenStatus::kRefused:
      return "REFUSED";
    case RegenStatus::kSkipped:
      return "skip";
    case RegenStatus::kError:
      return "ERROR";
  }
  return "?";
}

RegenResult RegenGoldenSet(const GoldenPaths& paths, const RegenOptions& options) {
  RegenResult result;
  result.paths = paths;
  try {
    GoldenInput in = LoadGoldenInput(paths.scenario);
    if (!in.missing.empty()) {
      result.status = RegenStatus::kSkipped;
      result.message = in.missing;
      return result;
    }
    // The golden on disk, if any and readable, with its rows when the rows file matches it.
    std::optional<Golden> before;
    std::string before_problem;
    bool rows_file_matches = false;
    if (fs::exists(paths.golden)) {
      try {
        before = ParseGolden(ReadBytes(paths.golden), paths.golden.string());
        if (fs::exists(paths.rows) && Sha256File(paths.rows) == before->rows_sha256) {
          LoadFullRows(*before, paths.rows);
          rows_file_matches = true;
        }
      } catch (const InputError& e) {
        before.reset();
        before_problem = e.what();
      }
    }
    const BackendRegistry& registry = BackendRegistry::Global();
    const std::string backend_name = !options.backend.empty() ? options.backend
                                     : before                 ? before->backend
                                                              : registry.Arbiter();
    KVDIFF_CHECK(registry.Has(backend_name),
                 "{}: the golden is made with backend {}, which this kvdiff lacks (available: {}); "
                 "regenerate with a kvdiff built with LibTorch ({} still works against impl)",
                 paths.golden.string(), backend_name, registry.NamesText(), "kvdiff golden verify");
    const std::string why = DriverNotApplicable(in.scenario.driver, registry.Info(backend_name));
    KVDIFF_CHECK(why.empty(), "{}: {}", paths.scenario.string(), why);
    const auto backend = registry.Make(backend_name, in.weights, BackendOptions{options.threads});
    const Recording rec = Replay(in.scenario, *backend);
    const OracleCheck oracle = CheckAgainstOracle(rec, *backend, in.scenario.gate.abs);
    if (const auto failed = oracle.FirstError(rec)) {
      result.status = RegenStatus::kRefused;
      result.message =
          fmt::format("backend {} failed at step {} {}: {}", backend_name, *failed,
                      in.scenario.steps[*failed].ParamString(), *oracle.StepError(rec, *failed));
      return result;
    }
    KVDIFF_CHECK(!rec.rows.empty(), "{}: the scenario produces no logits rows; nothing to pin",
                 paths.scenario.string());
    // A golden must never pin a bug: the backend's cached rows must equal its own uncached ones.
    for (size_t k = 0; k < rec.rows.size(); ++k) {
      const std::optional<RowComparison>& vs_oracle = oracle.rows[k];
      if (vs_oracle && vs_oracle->within_tolerance) continue;
      const RecordedRow& r = rec.rows[k];
      const Step& step = in.scenario.steps[r.step];
      result.status = RegenStatus::kRefused;
      result.message = fmt::format(
          "backend {} disagrees with itself: at step {} {} row {} (conversation {}, position {}, "
          "input token {}) its cached logits differ from its uncached ForwardFull by {} at logit "
          "{} (tolerance {}); a golden must never pin a bug, so nothing was written",
          backend_name, r.step, step.ParamString(), r.row, r.conversation, r.position, r.token,
          FormatDiff(vs_oracle->max_abs_diff), vs_oracle->max_diff_index,
          FormatDiff(in.scenario.gate.abs));
      return result;
    }
    Golden now = MakeGolden(paths, in, rec, backend_name);
    for (size_t k = 0; k < rec.rows.size(); ++k) {
      const int64_t chooser = rec.rows[k].chosen_by;
      if (chooser < 0) continue;
      const GoldenRow& g = now.rows[chooser];
      if (g.top_k.size() < 2) continue;
      const double margin = double(g.top_k[0].second) - g.top_k[1].second;
      if (margin <= 2 * now.tolerance) {
        result.warnings.push_back(fmt::format(
            "{}: the greedy choice of {} (token {} over {}) has a margin of {}, within twice the "
            "tolerance: another backend may choose differently there",
            paths.golden.string(), Where(g), g.top_k[0].first, g.top_k[1].first,
            FormatDiff(margin)));
      }
    }
    const std::string rows_bytes = RowsFileBytes(now);
    now.rows_sha256 = Sha256Hex(rows_bytes);
    const std::string text = GoldenToText(now);

    if (before) {
      result.change = DiffGolden(*before, now);
      // The same values written by this kvdiff differently (a format change): rewrite.
      if (GoldenToText(*before) != ReadBytes(paths.golden)) {
        result.change.header_fields.push_back("text format");
      }
      if (!rows_file_matches) result.change.header_fields.push_back("rows file (missing or stale)");
    } else {
      result.change.is_new = true;
      result.change.rows_total = static_cast<int64_t>(now.rows.size());
      if (!before_problem.empty()) {
        result.change.is_new = false;
        result.change.rows_changed = result.change.rows_total;
        result.change.header_fields.push_back("unreadable before (" + before_problem + ")");
      }
    }
    if (!result.change.Any()) {
      result.status = RegenStatus::kUnchanged;  // nothing written: same bytes, same mtime
      return result;
    }
    if (options.check_only) {
      result.status = RegenStatus::kWouldChange;
      return result;
    }
    // Rows first, then the JSON that names their hash: a kill between the two leaves a JSON whose
    // rows_sha256 does not match, which verify reports and the next regen repairs.
    if (!fs::exists(paths.rows) || ReadBytes(paths.rows) != rows_bytes) {
      format::WriteFileAtomically(paths.rows, rows_bytes);
    }
    if (!fs::exists(paths.golden) || ReadBytes(paths.golden) != text) {
      format::WriteFileAtomically(paths.golden, text);
    }
    result.status = RegenStatus::kWritten;
  } catch (const InputError& e) {
    result.status = RegenStatus::kError;
    result.message = e.what();
  }
  return result;
}

}  // namespace kvdiff::harness
