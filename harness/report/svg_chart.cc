#include "harness/report/svg_chart.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "harness/compare/compare.h"
#include "harness/report/run_report.h"

namespace kvdiff::harness {
namespace {

// Colour-blind-safe (Okabe-Ito), in series order; a ninth series reuses the first colour.
const char* const kPalette[] = {"#0072b2", "#d55e00", "#009e73", "#cc79a7",
                                "#e69f00", "#56b4e9", "#000000", "#f0e442"};
const char* Colour(size_t i) { return kPalette[i % (sizeof(kPalette) / sizeof(kPalette[0]))]; }

// The plot area inside each chart's viewBox.
constexpr double kWidth = 760, kHeight = 320;
constexpr double kLeft = 70, kRight = 20, kTop = 36, kBottom = 56;

std::string Num(double v) { return fmt::format("{:.1f}", v); }
// Full precision, for data-value attributes a test (or a script) compares with the JSON report.
std::string Exact(double v) { return std::isfinite(v) ? fmt::format("{}", v) : "inf"; }

std::string Open(const std::string& id, const std::string& title, double height) {
  return fmt::format(
      "<svg class=\"chart\" id=\"{}\" xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {} {}\" "
      "role=\"img\" aria-label=\"{}\"><text class=\"chart-title\" x=\"{}\" y=\"20\">{}</text>\n",
      HtmlEscape(id), kWidth, height, HtmlEscape(title), kLeft, HtmlEscape(title));
}

// The decades [lo, hi] a log axis spans: those of the finite positive values and the gate.
std::pair<int, int> Decades(const LogScatterChart& c) {
  double lo = std::numeric_limits<double>::infinity(), hi = 0;
  auto take = [&](double y) {
    if (std::isfinite(y) && y > 0) {
      lo = std::min(lo, y);
      hi = std::max(hi, y);
    }
  };
  for (const ChartSeries& s : c.series)
    for (const ChartPoint& p : s.points) take(p.y);
  if (c.gate) take(*c.gate);
  if (hi == 0) return {-8, 0};
  const int a = static_cast<int>(std::floor(std::log10(lo)));
  int b = static_cast<int>(std::ceil(std::log10(hi)));
  if (b <= a) b = a + 1;
  return {a, b};
}

// t in [-1, 1] for a heatmap cell: -1 four decades within the gate (or 0), 0 at it, 1 four
// decades beyond (or not finite).
double HeatT(double v, double gate) {
  if (!std::isfinite(v)) return 1;
  if (v <= 0 || gate <= 0) return -1;
  return std::clamp(std::log10(v / gate) / 4, -1.0, 1.0);
}

// Blue (t = -1) through white (0) to red (1), linear in each channel.
std::string HeatColour(double t) {
  const int fade = static_cast<int>(255 * (1 - std::abs(t)));
  return t > 0 ? fmt::format("rgb(255,{0},{0})", fade) : fmt::format("rgb({0},{0},255)", fade);
}

}  // namespace

std::string HtmlEscape(const std::string& text) { return XmlEscape(text); }

std::string SvgLogScatter(const LogScatterChart& c) {
  const auto [lo, hi] = Decades(c);
  double x_max = 1;
  for (const ChartSeries& s : c.series)
    for (const ChartPoint& p : s.points) x_max = std::max(x_max, p.x);
  const double pw = kWidth - kLeft - kRight, ph = kHeight - kTop - kBottom;
  const auto sx = [&](double x) { return kLeft + pw * x / x_max; };
  // 0 sits on the bottom edge, inf on the top edge.
  const auto sy = [&, lo = lo, hi = hi](double y) {
    if (!std::isfinite(y)) return kTop;
    if (y <= 0) return kTop + ph;
    const double t = (std::log10(y) - lo) / (hi - lo);
    return kTop + ph * (1 - std::clamp(t, 0.0, 1.0));
  };
  std::string out = Open(c.id, c.title, kHeight);
  out += fmt::format("<rect class=\"plot\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\"/>\n", kLeft,
                     kTop, pw, ph);
  for (int d = lo; d <= hi; ++d) {
    const double y = sy(std::pow(10.0, d));
    out += fmt::format(
        "<line class=\"grid\" x1=\"{}\" x2=\"{}\" y1=\"{}\" y2=\"{}\"/><text class=\"tick\" "
        "x=\"{}\" y=\"{}\" text-anchor=\"end\">1e{}</text>\n",
        kLeft, kLeft + pw, Num(y), Num(y), kLeft - 6, Num(y + 4), d);
  }
  for (int i = 0; i <= 4; ++i) {
    const double x = x_max * i / 4;
    out += fmt::format("<text class=\"tick\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n",
                       Num(sx(x)), kTop + ph + 16, Num(x));
  }
  out += fmt::format(
      "<text class=\"axis\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>"
      "<text class=\"axis\" x=\"14\" y=\"{}\" transform=\"rotate(-90 14 {})\" "
      "text-anchor=\"middle\">{}</text>\n",
      kLeft + pw / 2, kHeight - 22, HtmlEscape(c.x_label), kTop + ph / 2, kTop + ph / 2,
      HtmlEscape(c.y_label));
  if (c.gate) {
    const double y = sy(*c.gate);
    out += fmt::format(
        "<line class=\"gate\" id=\"{}-gate\" data-value=\"{}\" x1=\"{}\" x2=\"{}\" y1=\"{}\" "
        "y2=\"{}\"/><text class=\"gate-label\" x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n",
        HtmlEscape(c.id), Exact(*c.gate), kLeft, kLeft + pw, Num(y), Num(y), kLeft + pw - 4,
        Num(y - 4), HtmlEscape(c.gate_label));
  }
  for (size_t i = 0; i < c.series.size(); ++i) {
    const ChartSeries& s = c.series[i];
    out += fmt::format("<g class=\"series\" data-name=\"{}\" fill=\"{}\">", HtmlEscape(s.name),
                       Colour(i));
    for (const ChartPoint& p : s.points) {
      out += fmt::format(
          "<circle cx=\"{}\" cy=\"{}\" r=\"3\"><title>{}: position {}, {}</title>"
          "</circle>",
          Num(sx(p.x)), Num(sy(p.y)), HtmlEscape(s.name), p.x, FormatDiff(p.y));
    }
    out += "</g>\n";
    // The legend, under the x axis label.
    const double lx = kLeft + 180.0 * static_cast<double>(i);
    const double ly = kHeight - 6;
    out += fmt::format(
        "<circle cx=\"{}\" cy=\"{}\" r=\"4\" fill=\"{}\"/><text class=\"legend\" x=\"{}\" "
        "y=\"{}\">{}</text>\n",
        lx, ly - 4, Colour(i), lx + 8, ly, HtmlEscape(s.name));
  }
  if (c.marker) {
    const ChartMarker& m = *c.marker;
    out += fmt::format(
        "<g class=\"marker\" id=\"{}\" data-x=\"{}\" data-y=\"{}\"><circle cx=\"{}\" cy=\"{}\" "
        "r=\"8\"/><line x1=\"{}\" x2=\"{}\" y1=\"{}\" y2=\"{}\"/><text x=\"{}\" y=\"{}\">{}</text>"
        "</g>\n",
        HtmlEscape(m.id), m.x, Exact(m.y), Num(sx(m.x)), Num(sy(m.y)), Num(sx(m.x)), Num(sx(m.x)),
        kTop, kTop + ph, Num(sx(m.x) + 10), Num(std::max(sy(m.y) - 10, kTop + 12)),
        HtmlEscape(m.label));
  }
  return out + "</svg>\n";
}

std::string SvgBarChart(const BarChart& c) {
  double top = 0;
  for (const auto& row : c.values)
    for (double v : row) top = std::max(top, v);
  if (top <= 0) top = 1;
  const double pw = kWidth - kLeft - kRight, ph = kHeight - kTop - kBottom;
  const size_t groups = std::max<size_t>(1, c.categories.size());
  const size_t per = std::max<size_t>(1, c.series.size());
  const double group_w = pw / static_cast<double>(groups);
  const double bar_w = group_w * 0.8 / static_cast<double>(per);
  std::string out = Open(c.id, c.title, kHeight);
  out += fmt::format(
      "<line class=\"axis-line\" x1=\"{}\" x2=\"{}\" y1=\"{}\" y2=\"{}\"/>"
      "<text class=\"tick\" x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>"
      "<text class=\"tick\" x=\"{}\" y=\"{}\" text-anchor=\"end\">0</text>\n",
      kLeft, kLeft + pw, kTop + ph, kTop + ph, kLeft - 6, kTop + 4, top, kLeft - 6, kTop + ph);
  for (size_t g = 0; g < c.categories.size(); ++g) {
    const double gx = kLeft + group_w * static_cast<double>(g) + group_w * 0.1;
    for (size_t s = 0; s < c.values[g].size(); ++s) {
      const double v = c.values[g][s];
      const double h = ph * v / top;
      const std::string series = s < c.series.size() ? c.series[s] : "";
      out += fmt::format(
          "<rect class=\"bar\" data-category=\"{}\" data-series=\"{}\" data-value=\"{}\" "
          "x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\"><title>{} {}: {}</title>"
          "</rect>",
          HtmlEscape(c.categories[g]), HtmlEscape(series), v, Num(gx + bar_w * s),
          Num(kTop + ph - h), Num(std::max(bar_w - 1, 1.0)), Num(h), Colour(s),
          HtmlEscape(c.categories[g]), HtmlEscape(series), v);
    }
    // Labels turn when the groups are too narrow for them.
    const double cx = gx + group_w * 0.4;
    out += group_w < 60 ? fmt::format(
                              "<text class=\"tick\" x=\"{0}\" y=\"{1}\" text-anchor=\"end\" "
                              "transform=\"rotate(-35 {0} {1})\">{2}</text>\n",
                              Num(cx), kTop + ph + 14, HtmlEscape(c.categories[g]))
                        : fmt::format(
                              "<text class=\"tick\" x=\"{}\" y=\"{}\" "
                              "text-anchor=\"middle\">{}</text>\n",
                              Num(cx), kTop + ph + 16, HtmlEscape(c.categories[g]));
  }
  if (c.series.size() > 1) {
    for (size_t s = 0; s < c.series.size(); ++s) {
      const double lx = kLeft + 150.0 * static_cast<double>(s);
      out += fmt::format(
          "<rect x=\"{}\" y=\"{}\" width=\"10\" height=\"10\" fill=\"{}\"/><text class=\"legend\" "
          "x=\"{}\" y=\"{}\">{}</text>\n",
          lx, kHeight - 16, Colour(s), lx + 14, kHeight - 7, HtmlEscape(c.series[s]));
    }
  }
  return out + "</svg>\n";
}

std::string SvgHeatmap(const HeatmapChart& c) {
  const size_t rows = c.row_labels.size(), cols = std::max<size_t>(1, c.column_labels.size());
  // The grid starts right of the row labels ("layer 29 attention").
  constexpr double kGridLeft = 170, kMarkH = 14;
  const double grid_w = kWidth - kGridLeft - kRight;
  const double cell_w = std::min(120.0, grid_w / static_cast<double>(cols));
  const double cell_h = rows > 24 ? 14 : 22;
  const double grid_top = kTop + kMarkH;
  const double grid_bottom = grid_top + cell_h * static_cast<double>(rows);
  const double height = grid_bottom + 96;
  const auto cx = [&](size_t k) { return kGridLeft + cell_w * static_cast<double>(k); };
  std::string out = Open(c.id, c.title, height);
  out += fmt::format(
      "<text class=\"axis\" x=\"14\" y=\"{0}\" transform=\"rotate(-90 14 {0})\" "
      "text-anchor=\"middle\">{1}</text>\n",
      Num((grid_top + grid_bottom) / 2), HtmlEscape(c.row_axis));
  for (size_t r = 0; r < rows; ++r) {
    const double y = grid_top + cell_h * static_cast<double>(r);
    out += fmt::format("<text class=\"tick\" x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>",
                       kGridLeft - 6, Num(y + cell_h / 2 + 4), HtmlEscape(c.row_labels[r]));
    for (size_t k = 0; k < c.values[r].size(); ++k) {
      const double v = c.values[r][k];
      const bool hot = c.highlight && c.highlight->first == r && c.highlight->second == k;
      out += fmt::format(
          "<rect class=\"cell{}\"{} data-row=\"{}\" data-column=\"{}\" data-value=\"{}\" "
          "x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\"><title>{}, {}: {}{}</title>"
          "</rect>",
          hot ? " highlight" : "", hot ? fmt::format(" id=\"{}-highlight\"", HtmlEscape(c.id)) : "",
          HtmlEscape(c.row_labels[r]), HtmlEscape(c.column_labels[k]), Exact(v), Num(cx(k)), Num(y),
          Num(std::max(cell_w - 1, 0.5)), cell_h - 1, HeatColour(HeatT(v, c.gate)),
          HtmlEscape(c.row_labels[r]), HtmlEscape(c.column_labels[k]), FormatDiff(v),
          hot && !c.highlight_label.empty() ? " (" + HtmlEscape(c.highlight_label) + ")" : "");
    }
    out += "\n";
  }
  // Column labels, every `every`-th so that they stay ~40 units apart.
  const size_t every = std::max<size_t>(1, static_cast<size_t>(std::ceil(40 / cell_w)));
  for (size_t k = 0; k < c.column_labels.size(); k += every) {
    out +=
        fmt::format("<text class=\"tick\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
                    Num(cx(k) + cell_w / 2), Num(grid_bottom + 14), HtmlEscape(c.column_labels[k]));
  }
  out += fmt::format("\n<text class=\"axis\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n",
                     Num(kGridLeft + grid_w / 2), Num(grid_bottom + 32), HtmlEscape(c.column_axis));
  if (c.marked_column && *c.marked_column < cols) {
    const double x = cx(*c.marked_column) + cell_w / 2;
    out += fmt::format(
        "<g class=\"marker\" id=\"{}-marked-column\" data-column=\"{}\"><line x1=\"{}\" "
        "x2=\"{}\" y1=\"{}\" y2=\"{}\"/><text x=\"{}\" y=\"{}\" text-anchor=\"{}\">{}</text></g>\n",
        HtmlEscape(c.id), HtmlEscape(c.column_labels[*c.marked_column]), Num(x), Num(x),
        Num(grid_top - kMarkH + 2), Num(grid_top), Num(x), Num(grid_top - 3),
        x < kWidth / 2 ? "start" : "end", HtmlEscape(c.marked_column_label));
  }
  // The colour scale: log10(value / gate) from -4 (or 0) to +4 (or inf), in 40 steps.
  const double sy = grid_bottom + 46, sw = 320;
  constexpr int kSteps = 40;
  out += "<g class=\"colour-scale\">";
  for (int i = 0; i < kSteps; ++i) {
    const double t = -1 + 2 * (i + 0.5) / kSteps;
    out += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"12\" fill=\"{}\"/>",
                       Num(kGridLeft + sw * i / kSteps), Num(sy), Num(sw / kSteps + 0.5),
                       HeatColour(t));
  }
  for (int d = -4; d <= 4; d += 2) {
    const double x = kGridLeft + sw * (d + 4) / 8;
    const std::string label = d == -4  ? "\u2264" + FormatDiff(c.gate * 1e-4) + " or 0"
                              : d == 4 ? "\u2265" + FormatDiff(c.gate * 1e4) + " or inf"
                              : d == 0 ? "gate " + FormatDiff(c.gate)
                                       : FormatDiff(c.gate * std::pow(10.0, d));
    out += fmt::format(
        "<line class=\"axis-line\" x1=\"{0}\" x2=\"{0}\" y1=\"{1}\" y2=\"{2}\"/>"
        "<text class=\"tick\" x=\"{0}\" y=\"{3}\" text-anchor=\"middle\">{4}</text>",
        Num(x), Num(sy + 12), Num(sy + 16), Num(sy + 27), HtmlEscape(label));
  }
  out += fmt::format(
      "<text class=\"legend\" x=\"{}\" y=\"{}\">max |a-b| (log): blue within the gate, red "
      "beyond; outlined: where the divergence starts</text></g>\n",
      kGridLeft, Num(sy + 42));
  return out + "</svg>\n";
}

}  // namespace kvdiff::harness
