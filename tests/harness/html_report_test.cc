// The HTML reports without a browser: user text is escaped, the page fetches nothing, and the
// figures carry the report's exact values (html_report_browser_test.cc loads real pages).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <limits>
#include <string>

#include "harness/campaign/campaign.h"
#include "harness/report/html_check_report.h"
#include "harness/report/html_run_report.h"
#include "harness/report/svg_chart.h"

namespace kvdiff::testing {
namespace {

using harness::RunReport;
using ::testing::HasSubstr;
using ::testing::Not;

const char* const kHostile = "<script>alert('x')</script>&\"";

// A failing run of one prefill step whose user-given strings are all hostile.
RunReport HostileRun() {
  RunReport r;
  r.scenario = kHostile;
  r.model_source = kHostile;
  r.backends = {"impl"};
  r.notes = {kHostile};
  harness::StepReport s;
  s.index = 0;
  s.step = harness::Step::Prefill(kHostile, {1, 2});
  harness::PathOutcome o;
  o.path = "impl";
  o.status = harness::PathStatus::kFail;
  o.max_abs_diff = 0.25;
  o.message = kHostile;
  for (int64_t p = 0; p < 2; ++p) {
    harness::ComparedRow row;
    row.row = p;
    row.conversation = kHostile;
    row.position = p;
    row.cmp.max_abs_diff = p == 0 ? 0.0 : 0.25;  // a zero difference is drawn, not dropped
    o.rows.push_back(row);
  }
  s.outcomes = {o};
  r.steps = {s};
  harness::Divergence d;
  d.path = d.a = d.b = kHostile;
  d.params = kHostile;
  d.row = o.rows[1];
  r.first_divergence = d;
  harness::BackendFailure e;
  e.message = e.backend = e.params = kHostile;
  r.first_error = e;
  r.rows_compared = 2;
  r.worst_diff = 0.25;
  harness::Localization loc;
  loc.found = true;
  loc.layer = 1;
  loc.block = "mlp";
  loc.attention_diffs = {1e-7, 1e-6};
  loc.mlp_diffs = {1e-7, std::numeric_limits<double>::infinity()};
  // Two conversations in the step: the column labels name them (escaped).
  loc.columns = {{0, kHostile, 0}, {1, "main", 1}};
  loc.divergent_column = 1;
  loc.attention_map = {{0.0, 1e-7}, {1e-6, 1e-6}};
  loc.mlp_map = {{0.0, 1e-7}, {1e-6, std::numeric_limits<double>::infinity()}};
  loc.first_cell = harness::LocalizedCell{1, "mlp", 1};
  r.localization = loc;
  return r;
}

TEST(HtmlReport, RunPageEscapesUserTextAndFetchesNothing) {
  const std::string html = harness::RunReportToHtml(HostileRun());
  EXPECT_THAT(html, Not(HasSubstr("<script")));
  EXPECT_THAT(html, Not(HasSubstr("alert('x')")));
  EXPECT_THAT(html, HasSubstr("&lt;script&gt;alert(&apos;x&apos;)&lt;/script&gt;&amp;&quot;"));
  // Self-contained: nothing loaded from anywhere (the SVG namespace is a name, not a fetch).
  for (const char* s : {"src=", "href=", "<link", "@import", "url("}) {
    EXPECT_THAT(html, Not(HasSubstr(s))) << s;
  }
  EXPECT_THAT(html, HasSubstr("id=\"first-divergence\""));
  EXPECT_THAT(html, HasSubstr("id=\"localization-map\""));
  EXPECT_THAT(html, HasSubstr("id=\"worst-diff\" data-value=\"0.25\""));
  EXPECT_THAT(html, HasSubstr("data-value=\"inf\""));  // the non-finite MLP cell
  // The map's rows are layer and block, its columns positions; the start is outlined.
  EXPECT_THAT(html, HasSubstr("id=\"localization-map-highlight\" data-row=\"layer 1 mlp\" "
                              "data-column=\"main:1\" data-value=\"inf\""));
  EXPECT_THAT(html, HasSubstr("data-column=\"&lt;script&gt;"));
  EXPECT_THAT(html, HasSubstr("id=\"localization-map-marked-column\""));
  EXPECT_THAT(html, HasSubstr("class=\"colour-scale\""));
}

TEST(HtmlReport, CheckPageListsFailuresEscaped) {
  harness::CampaignReport r;
  r.backends = {"impl"};
  r.cases = 1;
  harness::CaseResult c;
  c.index = 7;
  c.passed = false;
  c.failure = kHostile;
  c.scenario_file = "fails/check-seed0-case7.json";
  c.shrunk = harness::CaseResult::Shrunk{"fails/check-seed0-case7-shrunk.json", kHostile, 2, 9};
  r.results = {c};
  r.coverage.ops = {{"prefill", 3}, {kHostile, 1}};
  r.coverage.lengths = {{1, 2}, {4, 1}};
  const std::string html = harness::CampaignReportToHtml(r);
  EXPECT_THAT(html, Not(HasSubstr("<script")));
  EXPECT_THAT(html, HasSubstr("data-case=\"7\""));
  EXPECT_THAT(html, HasSubstr("kvdiff run fails/check-seed0-case7-shrunk.json"));
  EXPECT_THAT(html, HasSubstr("id=\"failures\" data-value=\"1\""));
  EXPECT_THAT(html, HasSubstr("data-category=\"4-7\" data-series=\"count\" data-value=\"1\""));
  EXPECT_THAT(html, HasSubstr("batches: none"));  // empty: said so, not left out
}

TEST(HtmlReport, LogScatterPutsZeroOnTheFloorAndInfOnTheCeiling) {
  harness::LogScatterChart c;
  c.id = "c";
  c.series = {{"s", {{0, 0.0}, {1, 1e-3}, {2, std::numeric_limits<double>::infinity()}}}};
  const std::string svg = harness::SvgLogScatter(c);
  // Three points drawn: none dropped for being 0 or inf.
  size_t circles = 0;
  for (size_t at = svg.find("<circle cx"); at != std::string::npos;
       at = svg.find("<circle cx", at + 1))
    ++circles;
  EXPECT_EQ(circles, 3u + 1u);  // + the legend's swatch
}

}  // namespace
}  // namespace kvdiff::testing
