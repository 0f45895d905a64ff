#include "harness/report/html_run_report.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>

#include "harness/compare/compare.h"
#include "harness/report/html_page.h"
#include "harness/report/run_report.h"
#include "harness/report/svg_chart.h"

namespace kvdiff::harness {
namespace {

std::string Summary(const RunReport& r) {
  int64_t failed = 0;
  for (const StepReport& s : r.steps) failed += s.Passed() ? 0 : 1;
  std::string tolerance = FormatDiff(r.gate.abs);
  if (r.gate.rel > 0) tolerance += " or rel " + FormatDiff(r.gate.rel) + " of max |logit|";
  std::vector<SummaryItem> items = {
      {"verdict", HtmlVerdict(r.Passed()) +
                      HtmlEscape(fmt::format(": {} of {} steps failed", failed, r.steps.size()))},
      {"model", HtmlEscape(fmt::format("{} ({})", r.model_source, r.model_description))},
      {"driver", HtmlEscape(DriverName(r.driver))},
      {"backends", HtmlEscape(fmt::format("{}", fmt::join(r.backends, ", ")))},
      {"tolerance", HtmlFigure("tolerance", r.gate.abs, tolerance)},
      {"rows compared", HtmlFigure("rows-compared", r.rows_compared)},
      {"worst difference", HtmlFigure("worst-diff", r.worst_diff, WorstRowText(r.worst))},
  };
  for (const std::string& note : r.notes) items.push_back({"note", HtmlEscape(note)});
  return HtmlSummary(items);
}

std::string Cell(const PathOutcome& o) {
  const std::string status = PathStatusName(o.status);
  const char* cls = o.status == PathStatus::kPass      ? "pass"
                    : o.status == PathStatus::kSkipped ? "skip"
                    : o.status == PathStatus::kNoRows  ? ""
                                                       : "fail";
  std::string text = HtmlEscape(status);
  if (o.status == PathStatus::kPass || o.status == PathStatus::kFail) {
    text += " " + HtmlFigure("", o.max_abs_diff, FormatDiff(o.max_abs_diff));
  }
  if (!o.message.empty()) text += "<br>" + HtmlEscape(o.message);
  return fmt::format("<td class=\"{}\">{}</td>", cls, text);
}

std::string StepTable(const RunReport& r) {
  std::string out = "<h2>Steps</h2>\n<table id=\"steps\">\n<tr><th>step</th><th>op</th>";
  if (!r.steps.empty())
    for (const PathOutcome& o : r.steps[0].outcomes) out += "<th>" + HtmlEscape(o.path) + "</th>";
  out += "</tr>\n";
  for (const StepReport& s : r.steps) {
    out += fmt::format("<tr class=\"{}\" data-step=\"{}\"><td>{}</td><td>{}</td>",
                       s.Passed() ? "passed" : "failed", s.index, s.index,
                       HtmlEscape(s.step.ParamString()));
    for (const PathOutcome& o : s.outcomes) out += Cell(o);
    out += "</tr>\n";
  }
  return out + "</table>\n";
}

// |a-b| of every compared row against its position, one series per comparison (path).
std::string DiffChart(const RunReport& r) {
  std::map<std::string, size_t> index;
  LogScatterChart chart;
  chart.id = "diff-chart";
  chart.title = "max |a-b| per compared row";
  chart.x_label = "position in the conversation";
  chart.y_label = "max |a-b| (log)";
  for (const StepReport& s : r.steps) {
    for (const PathOutcome& o : s.outcomes) {
      if (o.rows.empty()) continue;
      auto [it, added] = index.emplace(o.path, chart.series.size());
      if (added) chart.series.push_back({o.path, {}});
      for (const ComparedRow& row : o.rows) {
        chart.series[it->second].points.push_back(
            {static_cast<double>(row.position), row.cmp.max_abs_diff});
      }
    }
  }
  if (chart.series.empty()) return "";
  chart.gate = r.gate.abs;
  chart.gate_label =
      "gate " + FormatDiff(r.gate.abs) +
      (r.gate.rope_f32_per_position > 0 ? " (+ rope-f32 allowance per position)" : "");
  if (r.first_divergence) {
    const Divergence& d = *r.first_divergence;
    chart.marker = ChartMarker{
        static_cast<double>(d.row.position), d.row.cmp.max_abs_diff,
        fmt::format("first divergence: step {}, {}, position {}", d.step, d.path, d.row.position),
        "first-divergence"};
  }
  return "<h2>Differences</h2>\n" + SvgLogScatter(chart);
}

std::string DivergenceSection(const RunReport& r) {
  std::string out;
  if (r.first_divergence) {
    const Divergence& d = *r.first_divergence;
    const RowComparison& c = d.row.cmp;
    out += "<h2>First divergence</h2>\n";
    out += HtmlSummary({
        {"step", HtmlFigure("first-divergence-step", d.step) + " " + HtmlEscape(d.params)},
        {"compared", HtmlEscape(fmt::format("{} vs {}", d.a, d.b))},
        {"conversation", HtmlEscape(d.row.conversation)},
        {"position", HtmlFigure("first-divergence-position", d.row.position)},
        {"row of the step", HtmlFigure("first-divergence-row", d.row.row)},
        {"input token", HtmlEscape(std::to_string(d.row.token))},
        {"max |a-b|",
         HtmlFigure("first-divergence-diff", c.max_abs_diff, FormatDiff(c.max_abs_diff)) +
             HtmlEscape(fmt::format(" at logit {}", c.max_diff_index))},
        {"argmax", HtmlEscape(fmt::format("{} {}, {} {} ({})", d.a, c.argmax_a, d.b, c.argmax_b,
                                          c.argmax_agrees() ? "agree" : "differ"))},
        {"top-5 overlap", HtmlEscape(fmt::format("{}/5", c.top5_overlap))},
    });
  }
  if (r.first_error) {
    const BackendFailure& e = *r.first_error;
    out += "<h2>First backend error</h2>\n";
    out += fmt::format("<pre id=\"first-error\">step {} {} on {}: {}</pre>\n", e.step,
                       HtmlEscape(e.params), HtmlEscape(e.backend), HtmlEscape(e.message));
  }
  return out;
}

// A map column's label: its position, with its conversation when the step spans several.
std::vector<std::string> ColumnLabels(const std::vector<LocalizedRow>& columns) {
  bool one_conversation = true;
  for (const LocalizedRow& c : columns)
    one_conversation = one_conversation && c.conversation == columns.front().conversation;
  std::vector<std::string> labels;
  for (const LocalizedRow& c : columns) {
    labels.push_back(one_conversation ? std::to_string(c.position)
                                      : fmt::format("{}:{}", c.conversation, c.position));
  }
  return labels;
}

// --localize: the layer x position map of the divergent step, two rows (attention, MLP) a layer.
std::string LocalizationMap(const RunReport& r) {
  if (!r.localization) return "";
  const Localization& loc = *r.localization;
  std::string out = "<h2>Localization</h2>\n";
  out += loc.found
             ? fmt::format(
                   "<p id=\"localized\">at the first divergence's row: first beyond tolerance "
                   "at layer {} {}</p>\n",
                   loc.layer, HtmlEscape(loc.block))
             : fmt::format("<p id=\"localized\">{}</p>\n", HtmlEscape(loc.note));
  if (loc.columns.empty()) return out;
  const std::vector<std::string> labels = ColumnLabels(loc.columns);
  HeatmapChart map;
  map.id = "localization-map";
  map.title = fmt::format("hidden state max |a-b| per layer and position, step {}",
                          r.first_divergence ? r.first_divergence->step : 0);
  map.row_axis = "layer and block (depth)";
  map.column_axis = loc.columns.size() == 1 ? "position" : "position (time)";
  map.column_labels = labels;
  map.gate = r.gate.abs;
  for (size_t l = 0; l < loc.attention_map.size(); ++l) {
    map.row_labels.push_back(fmt::format("layer {} attention", l));
    map.values.push_back(loc.attention_map[l]);
    map.row_labels.push_back(fmt::format("layer {} mlp", l));
    map.values.push_back(loc.mlp_map[l]);
  }
  map.marked_column = loc.divergent_column;
  map.marked_column_label =
      fmt::format("first divergence, position {}", loc.columns[loc.divergent_column].position);
  if (loc.first_cell) {
    const LocalizedCell& f = *loc.first_cell;
    map.highlight =
        std::make_pair(static_cast<size_t>(2 * f.layer + (f.block == "mlp" ? 1 : 0)), f.column);
    map.highlight_label = "where the divergence starts";
    out += fmt::format(
        "<p id=\"localized-start\" data-layer=\"{}\" data-block=\"{}\" data-position=\"{}\">"
        "the divergence starts at layer {} {}, position {} (outlined)</p>\n",
        f.layer, HtmlEscape(f.block), loc.columns[f.column].position, f.layer, HtmlEscape(f.block),
        HtmlEscape(labels[f.column]));
  }
  return out + SvgHeatmap(map);
}

}  // namespace

std::string RunReportToHtml(const RunReport& r) {
  const std::string title = "kvdiff run " + r.scenario;
  std::string body = "<h1>" + HtmlEscape(title) + "</h1>\n";
  body += Summary(r);
  body += DivergenceSection(r);
  body += DiffChart(r);
  body += LocalizationMap(r);
  body += StepTable(r);
  return HtmlPage(title, body);
}

}  // namespace kvdiff::harness
