// golden verify: replay each set on each backend and compare every row with the golden.
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
#include "harness/compare/gate.h"
#include "harness/golden/golden.h"
#include "harness/golden/golden_detail.h"
#include "harness/golden/sha256.h"
#include "harness/replay/drivers.h"
#include "harness/replay/replay.h"
#include "harness/report/junit.h"
#include "harness/report/run_report.h"

namespace kvdiff::harness {

using namespace golden_detail;
namespace fs = std::filesystem;
using nlohmann::json;

std::string CompareWithGolden(const GoldenRow& g, const std::vector<float>* full,
                              const RecordedRow& r, double tol, double* diff_out) {
  const int64_t vocab = static_cast<int64_t>(r.logits.size());
  const float* a = r.logits.data();
  double worst = 0;
  auto done = [&](std::string detail) {
    if (diff_out) *diff_out = worst;
    return detail;
  };
  if (r.token != g.token) {
    worst = INFINITY;
    return done(
        fmt::format("input token {}, the golden fed {} (an earlier greedy choice differed: the "
                    "histories split)",
                    r.token, g.token));
  }
  for (int64_t i = 0; i < vocab; ++i) {
    if (!std::isfinite(a[i])) {
      worst = INFINITY;
      return done(fmt::format("logit {} is {} (not finite)", i, a[i]));
    }
  }
  // The golden's top-k logits, id by id.
  for (size_t k = 0; k < g.top_k.size(); ++k) {
    const auto [id, expected] = g.top_k[k];
    const double d = std::fabs(double(a[id]) - double(expected));
    worst = std::max(worst, d);
    if (d > tol) {
      return done(
          fmt::format("logit of token {} (golden rank {}) is {}, golden {}: |diff| {} > "
                      "tolerance {}",
                      id, k + 1, a[id], expected, FormatDiff(d), FormatDiff(tol)));
    }
  }
  // A token outside the golden's top-k had a golden logit <= its k-th; rising above that by more
  // than the tolerance is a difference beyond the tolerance.
  const GoldenRow mine = SummarizeRow(r.logits, static_cast<int>(g.top_k.size()));
  std::set<Token> golden_ids;
  for (const auto& [id, logit] : g.top_k) golden_ids.insert(id);
  const double kth = g.top_k.back().second;
  for (const auto& [id, logit] : mine.top_k) {
    if (golden_ids.count(id) || static_cast<int64_t>(g.top_k.size()) >= vocab) continue;
    if (double(logit) - kth > tol) {
      return done(
          fmt::format("token {} has logit {}, above the golden's rank-{} logit {} by {} "
                      "> tolerance {}, yet is not in the golden's top {}",
                      id, logit, g.top_k.size(), kth, FormatDiff(double(logit) - kth),
                      FormatDiff(tol), g.top_k.size()));
    }
  }
  const DigestTolerance t = DigestTolerances(tol, vocab, g.sum_sq);
  if (std::fabs(mine.sum - g.sum) > t.sum) {
    return done(fmt::format(
        "sum of the {} logits is {}, golden {}: |diff| {} > {} (vocab x "
        "tolerance)",
        vocab, mine.sum, g.sum, FormatDiff(std::fabs(mine.sum - g.sum)), FormatDiff(t.sum)));
  }
  if (std::fabs(mine.sum_sq - g.sum_sq) > t.sum_sq) {
    return done(fmt::format(
        "sum of squares of the {} logits is {}, golden {}: |diff| {} > {} (tolerance x (2 "
        "sqrt(vocab x sum_sq) + vocab x tolerance))",
        vocab, mine.sum_sq, g.sum_sq, FormatDiff(std::fabs(mine.sum_sq - g.sum_sq)),
        FormatDiff(t.sum_sq)));
  }
  if (std::fabs(mine.max - g.max) > t.max) {
    return done(fmt::format("max logit {}, golden {}: |diff| {} > tolerance {}", mine.max, g.max,
                            FormatDiff(std::fabs(mine.max - g.max)), FormatDiff(t.max)));
  }
  if (std::fabs(mine.min - g.min) > t.max) {
    return done(fmt::format("min logit {}, golden {}: |diff| {} > tolerance {}", mine.min, g.min,
                            FormatDiff(std::fabs(mine.min - g.min)), FormatDiff(t.max)));
  }
  if (mine.greedy != g.greedy) {
    // Reached only on a near-tie (every checked logit within tolerance), which is not a failure
    // of this row; the next decode row will show whether the histories split.
  }
  if (full) {
    const RowComparison c = CompareRows(a, full->data(), vocab, tol);
    worst = std::max(worst, c.max_abs_diff);
    if (!c.within_tolerance) {
      return done(fmt::format("full row: logit {} is {}, golden {}: |diff| {} > tolerance {}",
                              c.max_diff_index, a[c.max_diff_index], (*full)[c.max_diff_index],
                              FormatDiff(c.max_abs_diff), FormatDiff(tol)));
    }
  }
  return done("");
}

namespace {

// flag: --tolerance (g.tolerance is already resolved with it); without it a backend's tolerance
// profile may raise the golden's tolerance for that backend.
GoldenCheck CheckBackend(const GoldenInput& in, const Golden& g, const std::string& name,
                         const BackendOptions& options, const std::optional<double>& flag) {
  GoldenCheck c;
  c.backend = name;
  Recording rec;
  double rope_f32_per_position = 0;
  try {
    const BackendRegistry& registry = BackendRegistry::Global();
    const std::string why = DriverNotApplicable(in.scenario.driver, registry.Info(name));
    if (!why.empty()) {
      c.status = PathStatus::kSkipped;
      c.message = why;
      return c;
    }
    const auto backend = registry.Make(name, in.weights, options);
    // Goldens are made by the arbiter (exact angles): a float32-angle backend gets the rope-f32
    // allowance against them.
    std::vector<std::string> notes;
    const Gate gate = ResolveGate(flag, Gate{g.tolerance}, {backend.get()}, &notes);
    c.tolerance = gate.abs;
    c.tolerance_note = fmt::format("{}", fmt::join(notes, "; "));
    rope_f32_per_position = gate.rope_f32_per_position;
    rec = Replay(in.scenario, *backend);
  } catch (const std::exception& e) {
    c.status = PathStatus::kError;
    c.message = e.what();
    return c;
  }
  // Rows are matched by (step, row): after an error the other conversations go on, so a failed
  // step's rows are missing and the rest still line up with the golden's.
  std::map<std::pair<int64_t, int64_t>, const RecordedRow*> replayed;
  for (const RecordedRow& r : rec.rows) replayed[{r.step, r.row}] = &r;
  int64_t missing = 0;
  for (const GoldenRow& gr : g.rows) {
    auto it = replayed.find({gr.step, gr.row});
    // Not replayed, or matched already (a second golden row for it: ParseGolden refuses those).
    if (it == replayed.end() || it->second == nullptr) {
      ++missing;
      continue;
    }
    const RecordedRow& r = *it->second;
    it->second = nullptr;  // matched; the rows left unmatched are checked by no golden row
    double diff = 0;
    std::string detail;
    if (r.position != gr.position || r.conversation != gr.conversation) {
      detail = fmt::format(
          "the replay's step {} row {} is conversation {}, position {}; the golden's is "
          "conversation {}, position {}",
          r.step, r.row, r.conversation, r.position, gr.conversation, gr.position);
      diff = INFINITY;
    } else {
      const std::vector<float>* full = gr.full.empty() ? nullptr : &g.full_rows.at(gr.full);
      detail = CompareWithGolden(
          gr, full, r, c.tolerance + rope_f32_per_position * static_cast<double>(gr.position),
          &diff);
    }
    ++c.rows_compared;
    if (!(diff <= c.worst_diff)) c.worst_diff = diff;
    if (!detail.empty() && !c.first) {
      c.status = PathStatus::kFail;
      c.first = GoldenMismatch{gr.step,     in.scenario.steps[gr.step].ParamString(),
                               gr.row,      gr.conversation,
                               gr.position, gr.token,
                               detail,      diff};
    }
  }
  if (const auto failed = rec.FirstError()) {
    if (c.status == PathStatus::kPass) c.status = PathStatus::kError;
    c.message = fmt::format("backend {} failed at step {} {}: {}", name, *failed,
                            in.scenario.steps[*failed].ParamString(), rec.steps[*failed].message);
  } else if (missing > 0 || rec.rows.size() != g.rows.size()) {
    c.status = PathStatus::kFail;
    c.message = fmt::format("the replay produced {} rows; the golden has {}", rec.rows.size(),
                            g.rows.size());
  } else if (const auto left = std::find_if(replayed.begin(), replayed.end(),
                                            [](const auto& kv) { return kv.second != nullptr; });
             left != replayed.end()) {
    // ParseGolden refuses a golden listing a row twice; this holds the verdict to the same rule.
    c.status = PathStatus::kFail;
    c.message = fmt::format("the replay's step {} row {} has no golden row: it was not checked",
                            left->first.first, left->first.second);
  }
  return c;
}

GoldenSetReport VerifySet(const GoldenPaths& p, const std::vector<std::string>& backends,
                          const BackendOptions& options, const std::optional<double>& tolerance) {
  GoldenSetReport rep;
  rep.paths = p;
  try {
    KVDIFF_CHECK(fs::exists(p.scenario), "{}: no such scenario file", p.scenario.string());
    KVDIFF_CHECK(fs::exists(p.golden),
                 "{}: no golden file; create it with `kvdiff golden regen {}`", p.golden.string(),
                 p.scenario.string());
    Golden g = ParseGolden(ReadBytes(p.golden), p.golden.string());
    rep.made_with = g.backend;
    rep.tolerance = ResolveTolerance(tolerance, g.tolerance);
    rep.model = g.model.dump();
    GoldenInput in = LoadGoldenInput(p.scenario);
    if (!in.missing.empty()) {
      rep.skipped = in.missing;
      return rep;
    }
    const std::string regen = fmt::format("run `kvdiff golden regen {}`", p.scenario.string());
    if (in.scenario_sha256 != g.scenario_sha256) {
      rep.stale = fmt::format(
          "{} was edited after its golden was made (sha256 {}, the golden "
          "recorded {}); {}",
          p.scenario.string(), in.scenario_sha256, g.scenario_sha256, regen);
    } else if (in.model_files != g.model_files) {
      rep.stale = fmt::format(
          "the model files differ from those the golden was made with ({} "
          "now, {} recorded); {}",
          json(in.model_files).dump(), json(g.model_files).dump(), regen);
    } else if (in.weights->config.vocab_size != g.vocab_size) {
      rep.stale = fmt::format("the model's vocab_size is {}, the golden's {}; {}",
                              in.weights->config.vocab_size, g.vocab_size, regen);
    } else if (!fs::exists(p.rows) || Sha256File(p.rows) != g.rows_sha256) {
      rep.stale = fmt::format(
          "{} is missing or does not match the rows_sha256 of {} (an "
          "interrupted regen?); {}",
          p.rows.string(), p.golden.string(), regen);
    }
    if (!rep.stale.empty()) return rep;
    // The golden's backend (ref64) may be one this build cannot make (no LibTorch): its dtype is
    // then unknown here and taken as recorded; every other field is still checked.
    Golden expected = GoldenHeader(p, in, g.backend);
    if (expected.dtype.empty()) expected.dtype = g.dtype;
    CheckGoldenHeader(g, expected, p.golden.string());
    g.tolerance = rep.tolerance;  // --tolerance wins over the recorded one from here on
    LoadFullRows(g, p.rows);
    for (const std::string& name : backends)
      rep.checks.push_back(CheckBackend(in, g, name, options, tolerance));
  } catch (const InputError& e) {
    rep.input_error = e.what();
  }
  return rep;
}

std::string MismatchText(const GoldenSetReport& s, const GoldenCheck& c) {
  if (c.first) {
    const GoldenMismatch& m = *c.first;
    return fmt::format(
        "{}: {} differs from the golden (made with {}) at step {} {}, row {} "
        "(conversation {}, position {}, input token {}): {}",
        s.paths.golden.string(), c.backend, s.made_with, m.step, m.params, m.row, m.conversation,
        m.position, m.token, m.detail);
  }
  return fmt::format("{}: {}: {}", s.paths.golden.string(), c.backend, c.message);
}

// One line per problem of a set (empty when it passed or was skipped).
std::vector<std::string> Problems(const GoldenSetReport& s) {
  std::vector<std::string> out;
  if (!s.input_error.empty()) out.push_back(fmt::format("error: {}", s.input_error));
  if (!s.stale.empty())
    out.push_back(fmt::format("{}: stale golden: {}", s.paths.golden.string(), s.stale));
  for (const GoldenCheck& c : s.checks) {
    if (c.status == PathStatus::kFail || c.status == PathStatus::kError) {
      out.push_back(MismatchText(s, c));
      if (c.first && !c.message.empty()) out.push_back(fmt::format("  also: {}", c.message));
    }
  }
  return out;
}

json CheckToJson(const GoldenCheck& c) {
  json j = {{"backend", c.backend},
            {"status", PathStatusName(c.status)},
            {"rows_compared", c.rows_compared},
            {"worst_diff", Number(c.worst_diff)}};
  if (!c.message.empty()) j["message"] = c.message;
  if (c.tolerance > 0) j["tolerance"] = {{"abs", c.tolerance}};
  if (!c.tolerance_note.empty()) j["tolerance_profile"] = c.tolerance_note;
  if (c.first) {
    j["first_mismatch"] = {{"step", c.first->step},         {"params", c.first->params},
                           {"row", c.first->row},           {"conversation", c.first->conversation},
                           {"position", c.first->position}, {"token", c.first->token},
                           {"detail", c.first->detail},     {"diff", Number(c.first->diff)}};
  } else {
    j["first_mismatch"] = nullptr;
  }
  return j;
}

}  // namespace

bool GoldenSetReport::Passed() const {
  if (!input_error.empty() || !stale.empty()) return false;
  for (const GoldenCheck& c : checks)
    if (c.status == PathStatus::kFail || c.status == PathStatus::kError) return false;
  return true;
}

int VerifyReport::ExitCode() const {
  int code = 0;
  for (const GoldenSetReport& s : sets) {
    if (!s.input_error.empty()) return 2;
    if (!s.Passed()) code = 1;
  }
  return code;
}

VerifyReport VerifyGoldens(const std::vector<GoldenPaths>& sets,
                           const std::vector<std::string>& requested, const BackendOptions& options,
                           const std::optional<double>& tolerance) {
  const auto start = std::chrono::steady_clock::now();
  VerifyReport report;
  report.backends = requested.empty() ? DefaultBackends() : requested;
  for (const std::string& b : report.backends) {
    KVDIFF_CHECK(BackendRegistry::Global().Has(b),
                 "--backends: {} is not available in this build (available: {})", b,
                 BackendRegistry::Global().NamesText());
  }
  for (const GoldenPaths& p : sets) {
    report.sets.push_back(VerifySet(p, report.backends, options, tolerance));
  }
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

std::string VerifyReport::ToTerminal(bool color) const {
  std::string out =
      Paint(fmt::format("kvdiff golden verify: {} golden set{}, backends {}", sets.size(),
                        sets.size() == 1 ? "" : "s", fmt::join(backends, ", ")),
            kBold, color) +
      "\n\n";
  size_t width = 6;
  for (const auto& s : sets) width = std::max(width, s.paths.golden.string().size());
  out += fmt::format("{:<{}}  {:<7}", "golden", width, "made by");
  for (const auto& b : backends) out += fmt::format("  {:<14}", b);
  out += "\n";
  int64_t failed = 0, skipped = 0, rows = 0;
  double worst = 0;
  std::string worst_where;  // ", in SET on BACKEND, within its gate G"
  for (const auto& s : sets) {
    out += fmt::format("{:<{}}  {:<7}", s.paths.golden.string(), width,
                       s.made_with.empty() ? "?" : s.made_with);
    if (!s.input_error.empty()) {
      out += "  " + Paint("ERROR", kRed, color);
    } else if (!s.stale.empty()) {
      out += "  " + Paint("STALE", kRed, color);
    } else if (!s.skipped.empty()) {
      out += "  " + Paint("skip: model data absent", kYellow, color);
      ++skipped;
    }
    for (const auto& c : s.checks) {
      std::string cell = PathStatusName(c.status);
      if (c.status == PathStatus::kPass || c.status == PathStatus::kFail) {
        cell += " " + FormatDiff(c.worst_diff);
      }
      const char* colour = c.status == PathStatus::kPass      ? kGreen
                           : c.status == PathStatus::kSkipped ? kYellow
                                                              : kRed;
      out += "  " + Paint(fmt::format("{:<14}", cell), colour, color);
      rows += c.rows_compared;
      if (c.rows_compared > 0 && (worst_where.empty() || !(c.worst_diff <= worst))) {
        worst = c.worst_diff;
        // With a profile (rope-f32: + an allowance per position) a row's gate is the tolerance
        // or above it; the check's status says whether every row held its own.
        worst_where = fmt::format(
            " in {} on {}, {} the set's tolerance {}{}", s.paths.golden.string(), c.backend,
            c.status == PathStatus::kFail ? "beyond" : "within", FormatDiff(c.tolerance),
            c.tolerance_note.empty() ? "" : " and the tolerance profile printed above");
      }
    }
    out += "\n";
    if (!s.Passed()) ++failed;
  }
  out += "\n";
  for (const auto& s : sets) {
    if (!s.skipped.empty())
      out +=
          Paint(fmt::format("skip: {}: {}", s.paths.golden.string(), s.skipped), kYellow, color) +
          "\n";
    for (const auto& c : s.checks) {
      if (c.status == PathStatus::kSkipped) {
        out +=
            Paint(fmt::format("skip: {} on {}: {}", s.paths.golden.string(), c.backend, c.message),
                  kYellow, color) +
            "\n";
      }
    }
  }
  std::set<std::string> notes;  // one line per profile and backend, not one per set
  for (const auto& s : sets)
    for (const auto& c : s.checks)
      if (!c.tolerance_note.empty()) notes.insert(c.tolerance_note);
  for (const auto& note : notes) out += note + "\n";
  for (const auto& s : sets) {
    for (const auto& line : Problems(s)) out += Paint(line, kRed, color) + "\n";
  }
  const std::string verdict =
      failed == 0 ? Paint("PASS", kGreen, color) : Paint("FAIL", kRed, color);
  out += fmt::format(
      "{}: {} of {} golden sets failed, {} skipped; {} rows compared, worst "
      "difference {}{} ({:.2f} s)\n",
      verdict, failed, sets.size(), skipped, rows, FormatDiff(worst), worst_where, seconds);
  return out;
}

json VerifyReport::ToJson() const {
  json jsets = json::array();
  int64_t rows = 0;
  double worst = 0;
  for (const auto& s : sets) {
    json checks = json::array();
    for (const auto& c : s.checks) {
      checks.push_back(CheckToJson(c));
      rows += c.rows_compared;
      if (!(c.worst_diff <= worst)) worst = c.worst_diff;
    }
    json j = {{"golden", s.paths.golden.string()},
              {"scenario", s.paths.scenario.string()},
              {"rows_file", s.paths.rows.string()},
              {"made_with", s.made_with},
              {"tolerance", {{"abs", s.tolerance}}},
              {"passed", s.Passed()},
              {"checks", checks}};
    if (!s.model.empty()) j["model"] = json::parse(s.model);
    if (!s.skipped.empty()) j["skipped"] = s.skipped;
    if (!s.input_error.empty()) j["error"] = s.input_error;
    if (!s.stale.empty()) j["stale"] = s.stale;
    jsets.push_back(j);
  }
  std::vector<std::string> problems;
  for (const auto& s : sets)
    for (const auto& p : Problems(s)) problems.push_back(p);
  return {{"kvdiff_version", KVDIFF_VERSION},
          {"command", "golden verify"},
          {"backends", backends},
          {"passed", ExitCode() == 0},
          {"exit_code", ExitCode()},
          {"rows_compared", rows},
          {"worst_diff", Number(worst)},
          {"seconds", seconds},
          {"problems", problems},
          {"sets", jsets}};
}

std::string VerifyReport::ToJUnit() const {
  // One suite per golden set, one case per backend; a set that cannot be read or is stale is one
  // failing case named after the file.
  std::vector<JUnitSuite> suites;
  for (const auto& s : sets) {
    JUnitSuite suite;
    suite.name = s.paths.golden.string();
    // classname: the set's path as dotted package names ("kvdiff.golden.golden.tiny.fork").
    std::string dotted = (s.paths.golden.parent_path() / s.paths.scenario.stem()).string();
    std::replace(dotted.begin(), dotted.end(), '/', '.');
    suite.classname = "kvdiff.golden." + dotted;
    suite.properties = {{"made_with", s.made_with},
                        {"tolerance_abs", fmt::format("{}", s.tolerance)}};
    auto add = [&suite](std::string name, JUnitOutcome outcome, std::string type,
                        std::string text) {
      suite.cases.push_back({std::move(name), outcome, std::move(type), "", std::move(text)});
    };
    if (!s.input_error.empty()) {
      add("read", JUnitOutcome::kError, "input_error", s.input_error);
    } else if (!s.stale.empty()) {
      add("current", JUnitOutcome::kFailure, "stale_golden", s.stale);
    } else if (!s.skipped.empty()) {
      add("model", JUnitOutcome::kSkipped, "", s.skipped);
    }
    for (const auto& c : s.checks) {
      if (c.status == PathStatus::kFail || c.status == PathStatus::kError) {
        add(c.backend, JUnitOutcome::kFailure,
            c.status == PathStatus::kFail ? "mismatch" : "backend_error", MismatchText(s, c));
      } else if (c.status == PathStatus::kSkipped) {
        add(c.backend, JUnitOutcome::kSkipped, "", c.message);
      } else {
        add(c.backend, JUnitOutcome::kPassed, "", "");
      }
    }
    suites.push_back(std::move(suite));
  }
  return ToJUnitXml("kvdiff golden verify", seconds, suites);
}

}  // namespace kvdiff::harness
