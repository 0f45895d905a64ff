// Inline SVG charts for the HTML reports: no script, no external resource, every label escaped
// (series names are backend names and scenario text, i.e. user input).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace kvdiff::harness {

// Text for HTML and SVG content and attributes (XmlEscape: & < > " ' and control characters).
std::string HtmlEscape(const std::string& text);

struct ChartPoint {
  double x = 0, y = 0;
};
struct ChartSeries {
  std::string name;
  std::vector<ChartPoint> points;
};
// A point to call out (the first divergence): a ring with its label, id'd for tests and links.
struct ChartMarker {
  double x = 0, y = 0;
  std::string label, id;
};

// Points against a linear x and a log10 y: |a-b| per row against position. A y of 0 sits on the
// bottom edge and a non-finite y on the top edge (labelled "0" and "inf"), never dropped: a zero
// difference is the good news and an inf the worst, and both must show.
struct LogScatterChart {
  std::string id, title, x_label, y_label;
  std::vector<ChartSeries> series;
  std::optional<double> gate;  // drawn as a dashed horizontal line
  std::string gate_label;
  std::optional<ChartMarker> marker;
};
std::string SvgLogScatter(const LogScatterChart& chart);

// Vertical bars, one group per category, one bar per series in each group (a plain histogram is
// one series). Each bar carries its value in a <title> and a data-value attribute.
struct BarChart {
  std::string id, title;
  std::vector<std::string> series;  // legend; one name for a plain histogram
  std::vector<std::string> categories;
  std::vector<std::vector<double>> values;  // [category][series]
};
std::string SvgBarChart(const BarChart& chart);

// A grid of cells coloured by log10(value / gate): blue well within, white at the gate, red
// beyond it, with the colour scale drawn under the grid. Values may be 0 or non-finite. Cells
// narrow as columns grow (a long prefill), and column labels thin out so they never overlap.
struct HeatmapChart {
  std::string id, title, row_axis, column_axis;
  std::vector<std::string> row_labels, column_labels;
  std::vector<std::vector<double>> values;  // [row][column]
  double gate = 0;
  // Outlined, with the id ID-highlight and this label in its tooltip.
  std::optional<std::pair<size_t, size_t>> highlight;  // (row, column)
  std::string highlight_label;
  // A column called out above the grid (id ID-marked-column), with its label.
  std::optional<size_t> marked_column;
  std::string marked_column_label;
};
std::string SvgHeatmap(const HeatmapChart& chart);

}  // namespace kvdiff::harness
