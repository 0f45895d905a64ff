#include "harness/report/run_report.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>

#include "format/error.h"
#include "harness/report/junit.h"

namespace kvdiff::harness {
namespace {

using nlohmann::json;

const char* const kReset = "\033[0m";

std::string Cell(const PathOutcome& o) {
  switch (o.status) {
    case PathStatus::kPass:
    case PathStatus::kFail:
      return fmt::format("{} {}", PathStatusName(o.status), FormatDiff(o.max_abs_diff));
    default:
      return PathStatusName(o.status);
  }
}

const char* CellColour(PathStatus s) {
  switch (s) {
    case PathStatus::kPass:
      return kGreen;
    case PathStatus::kFail:
    case PathStatus::kError:
      return kRed;
    case PathStatus::kSkipped:
      return kYellow;
    default:
      return "";
  }
}

std::string TokenText(Token t) { return std::to_string(t); }

std::string DivergenceText(const Divergence& d) {
  const RowComparison& c = d.row.cmp;
  // In a decode step, row r's input was chosen by the row before it, and its own argmax chooses
  // generated token r + 2 of the step (counting the token the previous row chose as 1).
  const std::string which =
      d.op == Op::kDecode
          ? fmt::format("row {} of the step: the row that chooses generated token {}", d.row.row,
                        d.row.row + 2)
          : fmt::format("row {} of the step", d.row.row);
  std::string out = fmt::format(
      "first divergence: step {} {}: {} vs {}\n"
      "  conversation {}, position {}, input token {} ({})\n",
      d.step, d.params, d.a, d.b, d.row.conversation, d.row.position, TokenText(d.row.token),
      which);
  if (c.nonfinite) {
    out += fmt::format("  not finite: logit {} is {} in {} and {} in {}\n", c.nonfinite_index,
                       c.nonfinite_a, d.a, c.nonfinite_b, d.b);
  }
  out += fmt::format("  argmax: {} {}, {} {} ({}); top-5 overlap {}/5\n", d.a, c.argmax_a, d.b,
                     c.argmax_b, c.argmax_agrees() ? "agree" : "differ", c.top5_overlap);
  out += fmt::format("  max |a-b| = {} at logit {}; margin of {}'s top two logits {}\n",
                     FormatDiff(c.max_abs_diff), c.max_diff_index, d.b, FormatDiff(c.margin));
  if (c.kl_gate > 0) {
    out += fmt::format("  KL({} || {}) = {} nats, {} the profile's KL gate {}\n", d.b, d.a,
                       FormatDiff(c.kl_divergence), c.beyond_kl_gate() ? "beyond" : "within",
                       FormatDiff(c.kl_gate));
  }
  return out;
}

// The layer x position map: [layer][column] per block, and the cell where the divergence starts.
json LocalizationMapToJson(const Localization& loc) {
  json columns = json::array();
  for (const LocalizedRow& c : loc.columns) {
    columns.push_back({{"row", c.row}, {"conversation", c.conversation}, {"position", c.position}});
  }
  const auto matrix = [](const std::vector<std::vector<double>>& m) {
    json out = json::array();
    for (const std::vector<double>& layer : m) {
      json row = json::array();
      for (double d : layer) row.push_back(Number(d));
      out.push_back(row);
    }
    return out;
  };
  json first = nullptr;
  if (loc.first_cell) {
    const LocalizedCell& f = *loc.first_cell;
    first = {{"layer", f.layer},
             {"block", f.block},
             {"column", f.column},
             {"position", loc.columns[f.column].position}};
  }
  return {{"columns", columns},
          {"divergent_column", loc.divergent_column},
          {"attention_max_abs_diff", matrix(loc.attention_map)},
          {"mlp_max_abs_diff", matrix(loc.mlp_map)},
          {"first_cell", first}};
}

json LocalizationToJson(const Localization& loc) {
  json j = {{"found", loc.found}};
  if (loc.found) {
    j["layer"] = loc.layer;
    j["block"] = loc.block;
  }
  if (!loc.note.empty()) j["note"] = loc.note;
  json attn = json::array(), mlp = json::array();
  for (double d : loc.attention_diffs) attn.push_back(Number(d));
  for (double d : loc.mlp_diffs) mlp.push_back(Number(d));
  j["attention_max_abs_diff"] = attn;
  j["mlp_max_abs_diff"] = mlp;
  if (!loc.columns.empty()) j["map"] = LocalizationMapToJson(loc);
  return j;
}

json ConfigToJsonObject(const format::LlamaConfig& c) {
  return {{"hidden_size", c.hidden_size},
          {"intermediate_size", c.intermediate_size},
          {"num_hidden_layers", c.num_hidden_layers},
          {"num_attention_heads", c.num_attention_heads},
          {"num_key_value_heads", c.num_key_value_heads},
          {"head_dim", c.head_dim},
          {"vocab_size", c.vocab_size},
          {"max_position_embeddings", c.max_position_embeddings},
          {"rope_theta", c.rope_theta},
          {"rms_norm_eps", c.rms_norm_eps},
          {"tie_word_embeddings", c.tie_word_embeddings}};
}

std::string FailureText(const StepReport& s) {
  std::string out;
  for (const PathOutcome& o : s.outcomes) {
    if (o.status == PathStatus::kError) {
      out += fmt::format("{}: backend error: {}\n", o.path, o.message);
    } else if (o.status == PathStatus::kFail) {
      const ComparedRow* first = nullptr;
      for (const auto& r : o.rows)
        if (!r.cmp.within_tolerance) {
          first = &r;
          break;
        }
      out += fmt::format("{} vs {}: max |a-b| {}", o.a, o.b, FormatDiff(o.max_abs_diff));
      if (first) {
        out += fmt::format(" (first at conversation {}, position {}, token {}: argmax {} vs {})",
                           first->conversation, first->position, first->token, first->cmp.argmax_a,
                           first->cmp.argmax_b);
        if (first->cmp.beyond_kl_gate()) {
          out += fmt::format(", KL {} beyond the profile's gate {}",
                             FormatDiff(first->cmp.kl_divergence), FormatDiff(first->cmp.kl_gate));
        }
      }
      out += "\n";
    }
  }
  return out;
}

}  // namespace

const char* const kGreen = "\033[32m";
const char* const kRed = "\033[31m";
const char* const kYellow = "\033[33m";
const char* const kBold = "\033[1m";

std::string Paint(const std::string& text, const char* colour, bool color) {
  return color ? std::string(colour) + text + kReset : text;
}

std::string WorstRowText(const WorstRow& w) {
  if (!w.Found()) return "0 (no row compared)";
  const std::string gate = w.gate_basis == "tolerance"
                               ? fmt::format("the tolerance {}", FormatDiff(w.gate))
                               : fmt::format("its gate {} ({})", FormatDiff(w.gate), w.gate_basis);
  return fmt::format("{} at {}, step {}, conversation {}, position {}, {} {}", FormatDiff(w.diff),
                     w.path, w.step, w.conversation, w.position, w.within ? "within" : "beyond",
                     gate);
}

json WorstRowToJson(const WorstRow& w) {
  if (!w.Found()) return nullptr;
  return {{"diff", Number(w.diff)}, {"gate", Number(w.gate)}, {"gate_basis", w.gate_basis},
          {"path", w.path},         {"step", w.step},         {"conversation", w.conversation},
          {"position", w.position}, {"within", w.within}};
}

json Number(double value) { return std::isfinite(value) ? json(value) : json(nullptr); }

json ComparisonToJson(const RowComparison& c) {
  json j = {{"within_tolerance", c.within_tolerance},
            {"max_abs_diff", Number(c.max_abs_diff)},
            {"max_diff_index", c.max_diff_index},
            {"argmax_a", c.argmax_a},
            {"argmax_b", c.argmax_b},
            {"argmax_agrees", c.argmax_agrees()},
            {"top5_overlap", c.top5_overlap},
            {"kl_divergence", c.kl_divergence},
            {"margin", Number(c.margin)},
            {"scale", Number(c.scale)},
            {"relative_diff", Number(c.relative_diff())},
            {"nonfinite", c.nonfinite}};
  if (c.nonfinite) {
    j["nonfinite_index"] = c.nonfinite_index;
    j["nonfinite_a"] = fmt::format("{}", c.nonfinite_a);
    j["nonfinite_b"] = fmt::format("{}", c.nonfinite_b);
  }
  return j;
}

std::string XmlEscape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char ch : text) {
    const unsigned char c = static_cast<unsigned char>(ch);
    switch (ch) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      case '\n':
        out += "&#10;";
        break;
      case '\t':
        out += "&#9;";
        break;
      case '\r':
        out += "&#13;";
        break;
      default:
        out += (c < 0x20 || c == 0x7f) ? '?' : ch;
    }
  }
  return out;
}

std::string FormatTerminal(const RunReport& r, bool color) {
  std::string out;
  out += fmt::format("{}\n", Paint(fmt::format("kvdiff run {}", r.scenario), kBold, color));
  out += fmt::format("model: {} ({})\n", r.model_source, r.model_description);
  out +=
      fmt::format("driver {}, backends {}, tolerance abs {}{}\n", DriverName(r.driver),
                  fmt::join(r.backends, ", "), FormatDiff(r.gate.abs),
                  r.gate.rel > 0 ? fmt::format(" or rel {} of max |logit|", FormatDiff(r.gate.rel))
                                 : std::string());
  for (const auto& note : r.notes) out += fmt::format("note: {}\n", note);
  out += "\n";

  size_t param_width = 4;
  for (const auto& s : r.steps) param_width = std::max(param_width, s.step.ParamString().size());
  std::vector<std::string> paths;
  if (!r.steps.empty())
    for (const auto& o : r.steps[0].outcomes) paths.push_back(o.path);
  // Each column as wide as its own heading (a plugin's path can be long), at least 14.
  std::vector<size_t> cell_widths;
  for (const auto& p : paths) cell_widths.push_back(std::max<size_t>(14, p.size() + 2));

  out += fmt::format("{:>4}  {:<{}}", "step", "op", param_width);
  for (size_t i = 0; i < paths.size(); ++i)
    out += fmt::format("  {:<{}}", paths[i], cell_widths[i]);
  out += "\n";
  for (const auto& s : r.steps) {
    out += fmt::format("{:>4}  {:<{}}", s.index, s.step.ParamString(), param_width);
    for (size_t i = 0; i < s.outcomes.size(); ++i) {
      const PathOutcome& o = s.outcomes[i];
      const std::string cell =
          fmt::format("{:<{}}", Cell(o), i < cell_widths.size() ? cell_widths[i] : size_t{14});
      out += "  " + Paint(cell, CellColour(o.status), color && o.status != PathStatus::kNoRows);
    }
    out += "\n";
  }
  out += "\n";
  // Errors and skips, each once, in step order.
  for (const auto& s : r.steps) {
    for (const auto& o : s.outcomes) {
      if (o.status == PathStatus::kError) {
        out += Paint(fmt::format("error: step {} {} on {}: {}", s.index, s.step.ParamString(),
                                 o.path, o.message),
                     kRed, color) +
               "\n";
      }
    }
  }
  if (r.first_divergence) out += Paint(DivergenceText(*r.first_divergence), kRed, color);
  if (r.localization) {
    const Localization& loc = *r.localization;
    if (loc.found) {
      const double d =
          loc.block == "attention" ? loc.attention_diffs[loc.layer] : loc.mlp_diffs[loc.layer];
      out += fmt::format("  localized: first beyond tolerance at layer {} {} (max |a-b| {})\n",
                         loc.layer, loc.block, FormatDiff(d));
    } else {
      out += fmt::format("  localized: {}\n", loc.note);
    }
  }
  if (r.first_divergence || r.first_error) out += "\n";
  out += DistributionLines(r.distributions);
  int64_t failed = 0;
  for (const auto& s : r.steps) failed += s.Passed() ? 0 : 1;
  const std::string verdict =
      r.Passed() ? Paint("PASS", kGreen, color) : Paint("FAIL", kRed, color);
  out += fmt::format(
      "{}: {} of {} steps failed; {} rows compared, worst difference {} ({:.2f} s)\n", verdict,
      failed, r.steps.size(), r.rows_compared, WorstRowText(r.worst), r.seconds);
  return out;
}

json DistributionToJson(const DistributionStats& s) {
  const double n = s.rows > 0 ? static_cast<double>(s.rows) : 1.0;
  return {{"rows", s.rows},
          {"argmax_agree", s.argmax_agree},
          {"top5_overlap_mean", static_cast<double>(s.top5_overlap_sum) / n},
          {"kl_mean", s.kl_sum / n},
          {"kl_max", s.kl_max}};
}

std::string DistributionLines(const std::map<std::string, DistributionStats>& distributions) {
  std::string out;
  for (const auto& [path, stats] : distributions) {
    out += fmt::format("distribution {}: {}\n", path, stats.Text());
  }
  return out;
}

namespace {

// The report's "tolerance": rel only when the gate has one.
json GateToJson(const Gate& gate) {
  json t = {{"abs", gate.abs}, {"rope_f32_per_position", gate.rope_f32_per_position}};
  if (gate.rel > 0) t["rel"] = gate.rel;
  if (gate.kl_max > 0) t["kl_max"] = gate.kl_max;
  return t;
}

}  // namespace

json ReportToJson(const RunReport& r) {
  json steps = json::array();
  for (const auto& s : r.steps) {
    json outcomes = json::array();
    for (const auto& o : s.outcomes) {
      json rows = json::array();
      for (const auto& row : o.rows) {
        rows.push_back({{"row", row.row},
                        {"conversation", row.conversation},
                        {"position", row.position},
                        {"token", row.token},
                        {"comparison", ComparisonToJson(row.cmp)}});
      }
      json oj = {{"path", o.path},
                 {"kind", PathKindName(o.kind)},
                 {"a", o.a},
                 {"b", o.b},
                 {"status", PathStatusName(o.status)},
                 {"max_abs_diff", Number(o.max_abs_diff)},
                 {"rows", rows}};
      if (!o.message.empty()) oj["message"] = o.message;
      if (o.kind == PathKind::kCross) oj["rows_not_compared"] = o.rows_not_compared;
      outcomes.push_back(oj);
    }
    steps.push_back({{"index", s.index},
                     {"op", OpName(s.step.op)},
                     {"params", s.step.ParamString()},
                     {"conversation", s.step.conversation},
                     {"passed", s.Passed()},
                     {"max_abs_diff", Number(s.MaxAbsDiff())},
                     {"outcomes", outcomes}});
  }
  json j = {{"kvdiff_version", KVDIFF_VERSION},
            {"scenario", r.scenario},
            {"model",
             {{"source", r.model_source},
              {"description", r.model_description},
              {"config", ConfigToJsonObject(r.config)}}},
            {"tolerance", GateToJson(r.gate)},
            {"driver", DriverName(r.driver)},
            {"backends", r.backends},
            {"notes", r.notes},
            {"passed", r.Passed()},
            {"exit_code", r.ExitCode()},
            {"rows_compared", r.rows_compared},
            {"worst_diff", Number(r.worst_diff)},
            {"worst", WorstRowToJson(r.worst)},
            {"worst_relative_diff", Number(r.worst_relative_diff)},
            {"seconds", r.seconds},
            {"steps", steps}};
  if (!r.distributions.empty()) {
    json d = json::object();
    for (const auto& [path, stats] : r.distributions) d[path] = DistributionToJson(stats);
    j["distributions"] = d;
  }
  if (r.first_divergence) {
    const Divergence& d = *r.first_divergence;
    j["first_divergence"] = {{"step", d.step},
                             {"params", d.params},
                             {"path", d.path},
                             {"kind", PathKindName(d.kind)},
                             {"a", d.a},
                             {"b", d.b},
                             {"row", d.row.row},
                             {"conversation", d.row.conversation},
                             {"position", d.row.position},
                             {"token", d.row.token},
                             {"comparison", ComparisonToJson(d.row.cmp)}};
  } else {
    j["first_divergence"] = nullptr;
  }
  if (r.first_error) {
    const BackendFailure& e = *r.first_error;
    j["first_error"] = {{"step", e.step},
                        {"params", e.params},
                        {"backend", e.backend},
                        {"conversation", e.conversation},
                        {"message", e.message}};
  } else {
    j["first_error"] = nullptr;
  }
  if (r.localization) j["localization"] = LocalizationToJson(*r.localization);
  return j;
}

std::string ReportToJUnit(const RunReport& r) {
  JUnitSuite suite;
  suite.name = suite.classname =
      "kvdiff." + (r.scenario.empty() ? std::string("scenario") : r.scenario);
  suite.seconds = r.seconds;
  suite.properties = {{"kvdiff_version", KVDIFF_VERSION},
                      {"model", r.model_source},
                      {"model_description", r.model_description},
                      {"driver", DriverName(r.driver)},
                      {"backends", fmt::format("{}", fmt::join(r.backends, ","))},
                      {"tolerance_abs", fmt::format("{}", r.gate.abs)},
                      {"worst_difference", WorstRowText(r.worst)}};
  for (const auto& s : r.steps) {
    JUnitCase c;
    c.name = fmt::format("step {:02} {}", s.index, s.step.ParamString());
    bool all_skipped = !s.outcomes.empty();
    for (const auto& o : s.outcomes) all_skipped = all_skipped && o.status == PathStatus::kSkipped;
    if (!s.Passed()) {
      c.outcome = JUnitOutcome::kFailure;
      c.text = FailureText(s);
      c.type = c.text.find("backend error") != std::string::npos ? "backend_error" : "divergence";
    } else if (all_skipped) {
      c.outcome = JUnitOutcome::kSkipped;
      c.text = s.outcomes[0].message;
    }
    suite.cases.push_back(std::move(c));
  }
  return ToJUnitXml("kvdiff", r.seconds, {suite});
}

void WriteTextFile(const std::filesystem::path& path, const std::string& text) {
  std::error_code ec;
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path(), ec);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  KVDIFF_CHECK(out.good(), "cannot write {}", path.string());
  out << text;
  out.close();
  KVDIFF_CHECK(out.good(), "cannot write {}", path.string());
}

}  // namespace kvdiff::harness
