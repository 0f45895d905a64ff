#include "harness/report/html_check_report.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "harness/compare/compare.h"
#include "harness/report/html_page.h"
#include "harness/report/run_report.h"
#include "harness/report/svg_chart.h"

namespace kvdiff::harness {
namespace {

std::string Summary(const CampaignReport& r) {
  std::string worst = WorstRowText(r.worst);
  if (r.worst_case >= 0) worst += fmt::format(" in case {}", r.worst_case);
  std::vector<SummaryItem> items = {
      {"verdict", HtmlVerdict(r.Passed()) + ": " + HtmlFigure("failures", r.Failures()) +
                      HtmlEscape(fmt::format(" of {} cases failed", r.results.size()))},
      {"model", HtmlEscape(r.random_shapes
                               ? r.model_description
                               : fmt::format("{} ({})", r.model.Describe(), r.model_description))},
      {"backends", HtmlEscape(fmt::format("{}", fmt::join(r.backends, ", ")))},
      {"tolerance", HtmlFigure("tolerance", r.tolerance, FormatDiff(r.tolerance))},
      {"seed, cases, shard", HtmlEscape(fmt::format("seed {}, {} cases, shard {}/{}", r.seed,
                                                    r.cases, r.shard.index, r.shard.count))},
      {"rows compared", HtmlFigure("rows-compared", r.rows_compared)},
      {"worst difference", HtmlFigure("worst-diff", r.worst_diff, worst)},
      {"seconds", HtmlEscape(fmt::format("{:.2f}", r.seconds))},
  };
  // Demanding::Text() is the terminal's line(s), which already begin "demanding part".
  items.push_back({"demanding", "<pre>" + HtmlEscape(r.demanding.Text()) + "</pre>"});
  return HtmlSummary(items);
}

std::string Failures(const CampaignReport& r) {
  if (r.Passed()) return "";
  std::string out =
      "<h2>Failing cases</h2>\n<table id=\"failures\">\n"
      "<tr><th>case</th><th>failure</th><th>shrunk</th><th>replay</th></tr>\n";
  for (const CaseResult& c : r.results) {
    if (c.passed) continue;
    std::string shrunk = c.not_shrunk.empty() ? "-" : c.not_shrunk,
                replay = "kvdiff run " + c.scenario_file;
    if (c.shrunk) {
      shrunk = fmt::format("to {} steps ({} replays{}): {}", c.shrunk->steps, c.shrunk->runs,
                           c.shrunk->exhausted ? ", budget spent" : "", c.shrunk->failure);
      replay += "\nkvdiff run " + c.shrunk->file;
    }
    out += fmt::format(
        "<tr class=\"failed\" data-case=\"{}\"><td>{}</td><td>{}</td><td>{}</td>"
        "<td><pre>{}</pre></td></tr>\n",
        c.index, c.index, HtmlEscape(c.failure), HtmlEscape(shrunk), HtmlEscape(replay));
  }
  return out + "</table>\n";
}

BarChart Histogram(const std::string& id, const std::string& title,
                   const std::map<int64_t, int64_t>& h) {
  BarChart c{id, title, {"count"}, {}, {}};
  for (const auto& [lo, n] : h) {
    c.categories.push_back(BucketName(lo));
    c.values.push_back({static_cast<double>(n)});
  }
  return c;
}

BarChart Counts(const std::string& id, const std::string& title,
                const std::map<std::string, int64_t>& h) {
  BarChart c{id, title, {"count"}, {}, {}};
  for (const auto& [name, n] : h) {
    c.categories.push_back(name);
    c.values.push_back({static_cast<double>(n)});
  }
  return c;
}

// Per boundary, the calls and rows that reached it and that went past it: a boundary with a zero
// "over" bar was never crossed.
BarChart Boundaries(const Coverage& cov) {
  BarChart c{"coverage-boundaries",
             "boundaries: calls of b-1 or b tokens, calls past b, rows at b-1, rows past b",
             {"calls at", "calls over", "rows at", "rows over"},
             {},
             {}};
  for (const BoundaryCoverage& b : cov.boundaries) {
    // The backends that declared a boundary go in a note under the chart: as a bar label they
    // overlap their neighbours.
    c.categories.push_back(std::to_string(b.size) + (b.declared_by.empty() ? "" : "*"));
    c.values.push_back({static_cast<double>(b.calls_at), static_cast<double>(b.calls_over),
                        static_cast<double>(b.rows_at), static_cast<double>(b.rows_over)});
  }
  return c;
}

std::string CoverageSection(const Coverage& cov) {
  std::string out = "<h2>Coverage</h2>\n";
  out += fmt::format(
      "<p>{} cases ({} long); longest history {} of a context of {}; {} reached the context.</p>\n",
      cov.cases, cov.long_cases, cov.longest, cov.context, cov.cases_at_context);
  if (!cov.reach_limit.empty()) out += "<p>Reach: " + HtmlEscape(cov.reach_limit) + ".</p>\n";
  for (const std::string& w : cov.Warnings())
    out += "<p class=\"fail\">" + HtmlEscape(w) + "</p>\n";
  const BarChart charts[] = {
      Histogram("coverage-lengths", "lengths: each case's longest history", cov.lengths),
      Histogram("coverage-call-sizes", "call sizes: tokens per forward call", cov.call_sizes),
      Histogram("coverage-conversations", "conversations per case", cov.conversations),
      Counts("coverage-ops", "ops: steps of each kind", cov.ops),
      Counts("coverage-batches", "batches", cov.batches),
      Counts("coverage-deep",
             "deep ops: forks, truncations, batch items and ends (deep: on a conversation "
             "past 64 positions; far: past 256)",
             cov.deep),
      Boundaries(cov),
  };
  for (const BarChart& c : charts) {
    out += c.categories.empty() ? "<p>" + HtmlEscape(c.title) + ": none</p>\n" : SvgBarChart(c);
  }
  for (const BoundaryCoverage& b : cov.boundaries) {
    if (b.declared_by.empty()) continue;
    out += HtmlEscape(fmt::format("{}*: declared by {}", b.size, b.declared_by)) + "<br>\n";
  }
  return out;
}

}  // namespace

std::string CampaignReportToHtml(const CampaignReport& r) {
  const std::string title = fmt::format("kvdiff check, seed {}", r.seed);
  std::string body = "<h1>" + HtmlEscape(title) + "</h1>\n";
  body += Summary(r);
  body += Failures(r);
  body += CoverageSection(r.coverage);
  return HtmlPage(title, body);
}

}  // namespace kvdiff::harness
