#include "harness/campaign/merge.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>

#include "format/error.h"
#include "format/input_file.h"
#include "format/json_document.h"
#include "harness/campaign/campaign_detail.h"
#include "harness/campaign/coverage.h"
#include "harness/campaign/shard_report.h"
#include "harness/report/junit.h"
#include "harness/report/run_report.h"

namespace kvdiff::harness {
namespace {

using nlohmann::json;

// The fields every shard of one campaign shares; a report that differs is another campaign's.
constexpr const char* kCampaignFields[] = {"kvdiff_version", "model", "backends",
                                           "tolerance",      "seed",  "cases"};
// Options a report records when they were given, which every shard must share as well: "shapes"
// (absent: fixed), "generation" (--max-length, --long-fraction, --deep-fraction, --batch-percent,
// --shift-percent, and whether cases end with follow-ups: a shard of an older kvdiff has none),
// and the demanding part's settings (not its counts, which are the shard's own).
constexpr const char* kOptionalCampaignFields[] = {"shapes", "generation"};
constexpr const char* kDemandingSettings[] = {"skipped", "model", "backends", "fraction", "rtol"};

// `field` of `object` as its JSON text, or "absent".
std::string FieldText(const json& object, const char* field) {
  return object.is_object() && object.contains(field) ? object.at(field).dump() : "absent";
}

// `field` must read the same in both reports (absent in both counts as the same).
void CheckSameField(const ShardReport& s, const ShardReport& first, const json& a, const json& b,
                    const std::string& field, const char* key) {
  const std::string x = FieldText(a, key), y = FieldText(b, key);
  KVDIFF_CHECK(x == y,
               "{}: \"{}\" is {} but {} has {}: reports of different campaigns cannot merge",
               s.file, field, x, first.file, y);
}

void CheckSameCampaign(const ShardReport& s, const ShardReport& first) {
  for (const char* field : kCampaignFields)
    CheckSameField(s, first, *s.root, *first.root, field, field);
  for (const char* field : kOptionalCampaignFields) {
    CheckSameField(s, first, *s.root, *first.root, field, field);
  }
  const json none = json::object();
  const json& a = s.root->contains("demanding") ? s.root->at("demanding") : none;
  const json& b = first.root->contains("demanding") ? first.root->at("demanding") : none;
  for (const char* key : kDemandingSettings) {
    CheckSameField(s, first, a, b, std::string("demanding.") + key, key);
  }
}

}  // namespace

namespace {

// The demanding part over every shard's cases (harness/campaign/demanding_part.h): the head
// report's settings, which the shards share, and the counts of all the cases.
CampaignReport::Demanding MergeDemandingPart(const CampaignReport::Demanding& head,
                                             const std::vector<CaseResult>& results) {
  CampaignReport::Demanding d = head;
  if (!d.skipped.empty()) return d;
  d.cases = d.failures = 0;
  d.worst_relative_diff = 0;
  for (const CaseResult& r : results) {
    if (!r.demanding) continue;
    ++d.cases;
    d.failures += r.passed ? 0 : 1;
    const double rel = std::isfinite(r.worst_relative_diff)
                           ? r.worst_relative_diff
                           : std::numeric_limits<double>::infinity();
    d.worst_relative_diff = std::max(d.worst_relative_diff, rel);
  }
  return d;
}

// The shard indices in 1..count that no report gave: how many, and the first kListedMissing of
// them. The count comes from the report (check takes any n, even past the cases), so the work is
// bounded by the reports given, not by it.
void FindMissing(const std::map<int64_t, const ShardReport*>& by_index, int64_t count,
                 MergedCampaign& m) {
  m.missing_count = count - static_cast<int64_t>(by_index.size());
  for (int64_t i = 1; i <= count && m.missing.size() < MergedCampaign::kListedMissing; ++i) {
    if (by_index.count(i) == 0) m.missing.push_back(i);
  }
}

}  // namespace

MergedCampaign MergeCampaignReports(const std::vector<std::pair<std::string, json>>& reports) {
  KVDIFF_CHECK(!reports.empty(), "merge: expected at least one `check --json` report");
  std::vector<ShardReport> shards;
  for (const auto& [file, root] : reports) shards.push_back(ReadShardReport(file, root));
  const ShardReport& first = shards[0];
  for (const ShardReport& s : shards) {
    CheckSameCampaign(s, first);
    KVDIFF_CHECK(s.shard.count == first.shard.count,
                 "{}: shard {}/{} but {} is shard {}/{}: a campaign is split one way", s.file,
                 s.shard.index, s.shard.count, first.file, first.shard.index, first.shard.count);
  }

  MergedCampaign m;
  CampaignReport& c = m.campaign;
  c.seed = first.seed;
  c.cases = first.cases;
  c.tolerance = first.tolerance;
  c.backends = first.backends;
  c.shard = Shard{1, 1};
  std::map<int64_t, const ShardReport*> by_index;
  for (const ShardReport& s : shards) {
    m.files.push_back(s.file);
    if (!by_index.emplace(s.shard.index, &s).second) m.duplicated.push_back(s.shard.index);
  }
  std::sort(m.duplicated.begin(), m.duplicated.end());
  m.duplicated.erase(std::unique(m.duplicated.begin(), m.duplicated.end()), m.duplicated.end());
  FindMissing(by_index, first.shard.count, m);

  // Every case once (a duplicated shard's first report), in case order, verbatim.
  std::vector<std::pair<int64_t, json>> case_json;
  std::optional<Coverage> coverage;  // the shards' coverage, added up (warnings recomputed)
  for (const auto& [index, s] : by_index) {
    const json& results = s->root->at("results");
    for (size_t k = 0; k < results.size(); ++k) {
      c.results.push_back(s->results[k]);
      case_json.emplace_back(s->results[k].index, results[k]);
    }
    c.seconds += s->seconds;
    if (s->coverage) {
      if (coverage) {
        coverage->Merge(*s->coverage);
      } else {
        coverage = s->coverage;
      }
    }
  }
  std::sort(c.results.begin(), c.results.end(),
            [](const CaseResult& a, const CaseResult& b) { return a.index < b.index; });
  std::sort(case_json.begin(), case_json.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const CaseResult& r : c.results) {
    c.rows_compared += r.rows_compared;
    // As in the campaign: worst_diff is over the ordinary cases, the demanding ones are relative.
    if (!r.demanding) campaign_detail::AddWorst(c, r);
  }

  m.report = *first.root;  // fields a later kvdiff adds travel along
  json results = json::array();
  std::vector<int64_t> indices;
  for (auto& [index, j] : case_json) {
    indices.push_back(index);
    results.push_back(std::move(j));
  }
  m.report["shard"] = {{"index", 1}, {"count", 1}};
  m.report["case_indices"] = indices;
  m.report["passed"] = m.Passed();
  m.report["failures"] = c.Failures();
  m.report["rows_compared"] = c.rows_compared;
  m.report["worst_diff"] = Number(c.worst_diff);
  m.report["worst"] = WorstRowToJson(c.worst);
  m.report["worst_case"] = c.worst_case;
  m.report["seconds"] = c.seconds;
  if (first.demanding) {  // the summary's line, as the campaign prints it, and the JSON's counts
    c.demanding = MergeDemandingPart(*first.demanding, c.results);
    if (c.demanding.skipped.empty()) {
      json& d = m.report["demanding"];
      d["cases"] = c.demanding.cases;
      d["failures"] = c.demanding.failures;
      d["worst_relative_diff"] = Number(c.demanding.worst_relative_diff);
    }
  }
  m.report["results"] = std::move(results);
  if (coverage) {  // the terminal summary's coverage block as well as the JSON's
    c.coverage = *coverage;
    m.report["coverage"] = coverage->ToJson();
  }
  m.report["merge"] = {{"shards", first.shard.count},
                       {"files", m.files},
                       {"missing", m.missing},
                       {"missing_count", m.missing_count},
                       {"duplicated", m.duplicated}};
  return m;
}

MergedCampaign MergeCampaignReportFiles(const std::vector<std::string>& files) {
  std::vector<std::pair<std::string, json>> reports;
  for (const std::string& file : files) {
    // Like every reader: a regular file of bounded size (a FIFO would wait forever), parsed with
    // the depth and duplicate-key checks.
    const std::string text = format::ReadInputFile(file, "report");
    reports.emplace_back(file, format::ParseJsonDocument(text, file));
  }
  return MergeCampaignReports(reports);
}

std::string MergedCampaign::Summary() const {
  const int64_t count = report.at("merge").at("shards").get<int64_t>();
  std::string out = campaign.Summary();
  if (missing_count > 0 || !duplicated.empty()) {
    // The cases present may all pass; the campaign still did not run as a whole.
    const size_t last = out.rfind('\n', out.size() - 2) + 1;
    if (out.compare(last, 5, "PASS:") == 0) out.replace(last, 4, "INCOMPLETE");
  }
  for (int64_t i : missing) {
    out += fmt::format("FAIL shard {}/{}: missing (no report): its {} cases did not run\n", i,
                       count, ShardCaseCount(campaign.cases, Shard{i, count}));
  }
  if (missing_count > static_cast<int64_t>(missing.size())) {
    out += fmt::format("FAIL {} more shards missing after shard {}/{} (listed: the first {})\n",
                       missing_count - static_cast<int64_t>(missing.size()), missing.back(), count,
                       missing.size());
  }
  for (int64_t i : duplicated) {
    out += fmt::format("FAIL shard {}/{}: given by more than one report (merged once)\n", i, count);
  }
  out += fmt::format(
      "{}: {} reports merged, {} of {} shards present{}\n", Passed() ? "PASS" : "FAIL",
      files.size(), count - missing_count, count,
      missing_count == 0 && duplicated.empty()
          ? ""
          : fmt::format(" ({} missing, {} duplicated)", missing_count, duplicated.size()));
  return out;
}

std::string MergedCampaign::ToJUnit() const {
  JUnitSuite suite = campaign.ToJUnitSuite();
  const int64_t count = report.at("merge").at("shards").get<int64_t>();
  for (int64_t i : missing) {
    JUnitCase c;
    c.name = fmt::format("shard {}/{}", i, count);
    c.outcome = JUnitOutcome::kFailure;
    c.type = "missing_shard";
    c.message = fmt::format("shard {}/{}: no report; its cases did not run", i, count);
    suite.cases.push_back(std::move(c));
  }
  if (missing_count > static_cast<int64_t>(missing.size())) {
    JUnitCase c;
    c.name = fmt::format("shards after {}/{}", missing.back(), count);
    c.outcome = JUnitOutcome::kFailure;
    c.type = "missing_shard";
    c.message =
        fmt::format("{} more shards after {}/{}: no report; their cases did not run",
                    missing_count - static_cast<int64_t>(missing.size()), missing.back(), count);
    suite.cases.push_back(std::move(c));
  }
  for (int64_t i : duplicated) {
    JUnitCase c;
    c.name = fmt::format("shard {}/{}", i, count);
    c.outcome = JUnitOutcome::kFailure;
    c.type = "duplicated_shard";
    c.message = fmt::format("shard {}/{}: given by more than one report", i, count);
    suite.cases.push_back(std::move(c));
  }
  return ToJUnitXml("kvdiff", campaign.seconds, {suite});
}

}  // namespace kvdiff::harness
