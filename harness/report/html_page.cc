#include "harness/report/html_page.h"

#include <fmt/format.h>

#include <cmath>

#include "harness/report/svg_chart.h"

namespace kvdiff::harness {
namespace {

const char* const kStyle = R"css(
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #111; max-width: 1150px; }
h1 { font-size: 20px; } h2 { font-size: 16px; margin-top: 28px; }
dl.summary { display: grid; grid-template-columns: max-content auto; gap: 4px 16px; }
dl.summary dt { font-weight: 600; } dl.summary dd { margin: 0; }
.pass { color: #137333; font-weight: 700; } .fail { color: #b3261e; font-weight: 700; }
.skip { color: #8a6d00; }
table { border-collapse: collapse; font: 12px/1.3 ui-monospace, monospace; }
th, td { border: 1px solid #ccc; padding: 2px 6px; text-align: left; vertical-align: top; }
tr.failed td { background: #fdecea; }
pre { background: #f6f6f6; padding: 8px; white-space: pre-wrap; }
svg.chart { width: 760px; max-width: 100%; height: auto; display: block; margin: 8px 0 16px; }
svg .chart-title { font: 600 13px sans-serif; } svg .tick, svg .legend { font: 11px sans-serif; }
svg .axis { font: 12px sans-serif; } svg .plot { fill: #fafafa; stroke: #999; }
svg .grid { stroke: #e3e3e3; } svg .axis-line { stroke: #999; }
svg .gate { stroke: #b3261e; stroke-dasharray: 6 4; stroke-width: 1.5; }
svg .gate-label { font: 11px sans-serif; fill: #b3261e; }
svg .marker circle { fill: none; stroke: #b3261e; stroke-width: 2.5; }
svg .marker line { stroke: #b3261e; stroke-dasharray: 2 3; }
svg .marker text { font: 600 12px sans-serif; fill: #b3261e; }
svg .cell.highlight { stroke: #000; stroke-width: 2.5; }
)css";

// Figures in table cells have no id (an id is unique in a page).
std::string IdAttribute(const std::string& id) {
  return id.empty() ? "" : fmt::format(" id=\"{}\"", HtmlEscape(id));
}

}  // namespace

std::string HtmlPage(const std::string& title, const std::string& body) {
  return fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
      "<title>{}</title>\n<style>{}</style>\n</head>\n<body>\n{}</body>\n</html>\n",
      HtmlEscape(title), kStyle, body);
}

std::string HtmlSummary(const std::vector<SummaryItem>& items) {
  std::string out = "<dl class=\"summary\">\n";
  for (const SummaryItem& i : items) {
    out += fmt::format("<dt>{}</dt><dd>{}</dd>\n", HtmlEscape(i.term), i.value_html);
  }
  return out + "</dl>\n";
}

std::string HtmlFigure(const std::string& id, double value, const std::string& shown) {
  // Non-finite values are null in the JSON report; "inf" here says which way.
  const std::string exact = std::isfinite(value) ? fmt::format("{}", value) : "inf";
  return fmt::format("<span class=\"figure\"{} data-value=\"{}\">{}</span>", IdAttribute(id), exact,
                     HtmlEscape(shown));
}

std::string HtmlFigure(const std::string& id, int64_t value) {
  return fmt::format("<span class=\"figure\"{} data-value=\"{}\">{}</span>", IdAttribute(id), value,
                     value);
}

std::string HtmlVerdict(bool passed) {
  return passed ? "<span class=\"pass\" id=\"verdict\">PASS</span>"
                : "<span class=\"fail\" id=\"verdict\">FAIL</span>";
}

}  // namespace kvdiff::harness
