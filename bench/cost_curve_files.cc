// `kvdiff bench --curve`'s files: the cost curve as CSV (written and read back) and as an SVG plot.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench.h"
#include "format/affixes.h"
#include "format/error.h"
#include "format/input_file.h"
#include "harness/report/run_report.h"

namespace kvdiff::bench {
namespace {

using harness::XmlEscape;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

}  // namespace

void WriteCostCsv(const std::filesystem::path& path, const CostCurve& curve) {
  std::ofstream out(path);
  KVDIFF_CHECK(out.good(), "--curve: cannot write {}", path.string());
  out << "context";
  for (const CostSeries& s : curve.series) {
    out << ',' << s.backend << "_cached_ms," << s.backend << "_uncached_ms";
  }
  out << '\n';
  auto cell = [](double v) { return std::isnan(v) ? std::string() : fmt::format("{:.4f}", v); };
  for (size_t i = 0; i < curve.contexts.size(); ++i) {
    out << curve.contexts[i];
    for (const CostSeries& s : curve.series) {
      out << ',' << cell(s.cached_ms.at(i)) << ',' << cell(s.uncached_ms.at(i));
    }
    out << '\n';
  }
  out.flush();
  KVDIFF_CHECK(out.good(), "--curve: writing {} failed", path.string());
}

CostCurve ReadCostCsv(const std::filesystem::path& path) {
  // Like every reader: a regular file of bounded size (/dev/zero grew without bound, a FIFO hung).
  std::istringstream in(format::ReadInputFile(path, "--curve CSV"));
  auto split = [](const std::string& line) {
    std::vector<std::string> cells;
    std::string cell;
    std::istringstream s(line);
    while (std::getline(s, cell, ',')) cells.push_back(cell);
    if (!line.empty() && line.back() == ',') cells.emplace_back();
    return cells;
  };
  std::string line;
  KVDIFF_CHECK(static_cast<bool>(std::getline(in, line)), "{}: the file is empty", path.string());
  const std::vector<std::string> header = split(line);
  KVDIFF_CHECK(header.size() >= 3 && header.size() % 2 == 1 && header[0] == "context",
               "{}: expected a header \"context,<backend>_cached_ms,<backend>_uncached_ms,...\", "
               "got \"{}\"",
               path.string(), line);
  CostCurve curve;
  const std::string kCached = "_cached_ms", kUncached = "_uncached_ms";
  for (size_t k = 1; k < header.size(); k += 2) {
    const std::string& a = header[k];
    const bool ok = a.size() > kCached.size() && format::EndsWith(a, kCached) &&
                    header[k + 1] == a.substr(0, a.size() - kCached.size()) + kUncached;
    KVDIFF_CHECK(ok,
                 "{}: columns {} and {} should be <backend>_cached_ms,<backend>_uncached_ms, "
                 "got \"{}\",\"{}\"",
                 path.string(), k + 1, k + 2, a, header[k + 1]);
    curve.series.push_back({a.substr(0, a.size() - kCached.size()), {}, {}});
  }
  int line_number = 1;
  auto number = [&](const std::string& cell) {
    if (cell.empty()) return kNaN;
    size_t used = 0;
    double v = kNaN;
    try {
      v = std::stod(cell, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    KVDIFF_CHECK(used == cell.size() && std::isfinite(v),
                 "{}: line {}: expected a number, got \"{}\"", path.string(), line_number, cell);
    return v;
  };
  while (std::getline(in, line)) {
    ++line_number;
    if (line.empty()) continue;
    const std::vector<std::string> cells = split(line);
    KVDIFF_CHECK(cells.size() == header.size(), "{}: line {} has {} cells, the header has {}",
                 path.string(), line_number, cells.size(), header.size());
    const double context = number(cells[0]);
    // A whole number of positions (1e300 does not fit an int64_t: its cast was undefined).
    KVDIFF_CHECK(context >= 1 && context <= 1e9 && context == std::floor(context),
                 "{}: line {}: context must be a whole number from 1 to 1e9, got \"{}\"",
                 path.string(), line_number, cells[0]);
    curve.contexts.push_back(static_cast<int64_t>(context));
    for (size_t k = 0; k < curve.series.size(); ++k) {
      curve.series[k].cached_ms.push_back(number(cells[1 + 2 * k]));
      curve.series[k].uncached_ms.push_back(number(cells[2 + 2 * k]));
    }
  }
  KVDIFF_CHECK(!curve.contexts.empty(), "{}: no data rows", path.string());
  return curve;
}

// ---------------------------------------------------------------------------------------------
// The plot.

namespace {

std::string MsLabel(double ms) {
  if (ms >= 1000) return fmt::format("{:.3g} s", ms / 1000);
  if (ms >= 1) return fmt::format("{:.3g} ms", ms);
  return fmt::format("{:.3g} µs", ms * 1000);
}

}  // namespace

std::string CostCurveSvg(const CostCurve& curve, const PlotNotes& notes) {
  KVDIFF_CHECK(!curve.contexts.empty() && !curve.series.empty(), "plot: the curve has no data");
  // Notes wrap at spaces to fit the canvas (13 px text: ~125 characters per line).
  std::vector<std::string> lines;
  for (const std::string& line : notes.lines) {
    // A continuation starts with 4 spaces of indent; a cut is a space after it (a word longer than
    // a line, e.g. a long path, is cut at 125 characters), so every turn takes text off `rest`.
    constexpr size_t kWidth = 125, kIndent = 4;
    std::string rest = line;
    size_t indent = 0;
    while (rest.size() > kWidth) {
      size_t cut = rest.rfind(' ', kWidth);
      if (cut == std::string::npos || cut <= indent) cut = kWidth;
      lines.push_back(rest.substr(0, cut));
      rest = std::string(kIndent, ' ') + rest.substr(cut + (rest[cut] == ' ' ? 1 : 0));
      indent = kIndent;
    }
    lines.push_back(rest);
  }
  // Canvas and plot area (pixels).
  const double width = 960, height = 640;
  const double left = 90, right = 30;
  const double top = 70 + 18.0 * static_cast<double>(lines.size()), bottom = 70;
  const double pw = width - left - right, ph = height - top - bottom;

  // x: log2 of the context; y: log10 of milliseconds, whole decades.
  const double x_lo = std::log2(static_cast<double>(std::max<int64_t>(1, curve.contexts.front())));
  const double x_hi = std::max(x_lo + 1, std::log2(static_cast<double>(curve.contexts.back())));
  double lo = std::numeric_limits<double>::infinity(), hi = 0;
  for (const CostSeries& s : curve.series) {
    for (const auto* v : {&s.cached_ms, &s.uncached_ms}) {
      for (double ms : *v) {
        if (std::isnan(ms) || ms <= 0) continue;
        lo = std::min(lo, ms);
        hi = std::max(hi, ms);
      }
    }
  }
  if (notes.bandwidth_floor_ms > 0) {
    lo = std::min(lo, notes.bandwidth_floor_ms);
    hi = std::max(hi, notes.bandwidth_floor_ms);
  }
  KVDIFF_CHECK(hi > 0, "plot: the curve has no positive times");
  // A third of a decade below the lowest point (room for the floor's label), a little above the
  // top.
  const double y_lo = std::log10(lo) - 0.3, y_hi = std::max(y_lo + 1, std::log10(hi) + 0.08);
  auto X = [&](double context) { return left + pw * (std::log2(context) - x_lo) / (x_hi - x_lo); };
  auto Y = [&](double ms) { return top + ph * (1 - (std::log10(ms) - y_lo) / (y_hi - y_lo)); };

  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" "
      "viewBox=\"0 0 {0} {1}\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n"
      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      width, height);
  svg += fmt::format("<text x=\"{}\" y=\"30\" font-size=\"19\" font-weight=\"bold\">{}</text>\n",
                     left - 60, XmlEscape(notes.title));
  for (size_t i = 0; i < lines.size(); ++i) {
    svg += fmt::format(
        "<text x=\"{}\" y=\"{}\" font-size=\"13\" fill=\"#444\" xml:space=\"preserve\">{}</text>\n",
        left - 60, 54 + 18 * i, XmlEscape(lines[i]));
  }

  // Grid and ticks. y: labelled lines at 1, 2 and 5 x each decade, light lines at the others.
  svg += "<g stroke-width=\"1\">\n";
  for (int e = static_cast<int>(std::floor(y_lo)); e <= static_cast<int>(std::ceil(y_hi)); ++e) {
    for (int m = 1; m <= 9; ++m) {
      const double ms = m * std::pow(10.0, e);
      if (std::log10(ms) < y_lo || std::log10(ms) > y_hi) continue;
      const bool major = m == 1 || m == 2 || m == 5;
      svg += fmt::format(
          "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"{}\"/>\n", left,
          Y(ms), left + pw, Y(ms),
          m == 1  ? "#bbb"
          : major ? "#ddd"
                  : "#f0f0f0");
      if (major) {
        svg += fmt::format(
            "<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"13\" text-anchor=\"end\">{}</text>\n",
            left - 8, Y(ms) + 4, MsLabel(ms));
      }
    }
  }
  for (int64_t context : curve.contexts) {
    const double x = X(static_cast<double>(context));
    svg += fmt::format(
        "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#ddd\"/>\n", x, top,
        x, top + ph);
    svg += fmt::format(
        "<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"13\" text-anchor=\"middle\">{}</text>\n", x,
        top + ph + 20, context);
  }
  svg += fmt::format(
      "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#333\"/>\n", left,
      top, pw, ph);
  svg += "</g>\n";
  svg += fmt::format(
      "<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"14\" text-anchor=\"middle\">context length: "
      "positions already in the cache before the step (log scale)</text>\n",
      left + pw / 2, height - 22);
  svg += fmt::format(
      "<text transform=\"translate(24,{:.1f}) rotate(-90)\" font-size=\"14\" "
      "text-anchor=\"middle\">time to produce the next token's logits (log scale)</text>\n",
      top + ph / 2);

  // The memory-bandwidth line: a cached step cannot be much faster than reading its weights once.
  if (notes.bandwidth_floor_ms > 0) {
    const double y = Y(notes.bandwidth_floor_ms);
    svg += fmt::format(
        "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#2ca02c\" "
        "stroke-width=\"1.5\" stroke-dasharray=\"2,4\"/>\n",
        left, y, left + pw, y);
    svg += fmt::format(
        "<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"12\" fill=\"#2ca02c\" text-anchor=\"end\">"
        "memory-bandwidth limit: one streaming read of the weights a step reads = {}</text>\n",
        left + pw - 6, y + 16, MsLabel(notes.bandwidth_floor_ms));
  }

  // The series: one colour per backend; solid circles cached, dashed squares uncached.
  const char* kColours[] = {"#1f63b4", "#d9480f", "#7b2cbf", "#555555", "#c2255c", "#0b7285"};
  struct Legend {
    std::string colour, text;
    bool dashed;
  };
  std::vector<Legend> legend;
  for (size_t k = 0; k < curve.series.size(); ++k) {
    const CostSeries& s = curve.series[k];
    const std::string colour = kColours[k % 6];
    for (int uncached = 0; uncached < 2; ++uncached) {
      const std::vector<double>& ms = uncached ? s.uncached_ms : s.cached_ms;
      std::string points;
      std::string markers;
      for (size_t i = 0; i < curve.contexts.size() && i < ms.size(); ++i) {
        if (std::isnan(ms[i]) || ms[i] <= 0) continue;
        const double x = X(static_cast<double>(curve.contexts[i])), y = Y(ms[i]);
        points += fmt::format("{:.1f},{:.1f} ", x, y);
        markers += uncached
                       ? fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"7\" height=\"7\"/>",
                                     x - 3.5, y - 3.5)
                       : fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3.5\"/>", x, y);
      }
      if (points.empty()) continue;
      svg += fmt::format(
          "<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2.2\"{}/>\n", points,
          colour, uncached ? " stroke-dasharray=\"8,5\"" : "");
      svg += fmt::format("<g fill=\"{}\">{}</g>\n", colour, markers);
      legend.push_back({colour,
                        uncached ? s.backend + ", uncached: ForwardFull of the whole history"
                                 : s.backend + ", cached: Session Append of 1 token",
                        uncached == 1});
    }
  }
  const double lx = left + 16, ly = top + 14;
  svg += fmt::format(
      "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"400\" height=\"{:.1f}\" fill=\"white\" "
      "fill-opacity=\"0.9\" stroke=\"#999\"/>\n",
      lx - 8, ly - 6, 22.0 * legend.size() + 8);
  for (size_t i = 0; i < legend.size(); ++i) {
    const double y = ly + 22.0 * i + 8;
    svg += fmt::format(
        "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"{}\" "
        "stroke-width=\"2.2\"{}/>\n",
        lx, y, lx + 34, y, legend[i].colour, legend[i].dashed ? " stroke-dasharray=\"8,5\"" : "");
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"13\">{}</text>\n", lx + 44,
                       y + 4.5, XmlEscape(legend[i].text));
  }
  svg += "</svg>\n";
  return svg;
}

}  // namespace kvdiff::bench
