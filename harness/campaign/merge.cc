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
#include "harness/report/junit.h"
#include "harness/report/run_report.h"

namespace kvdiff::harness {
namespace {

using nlohmann::json;

// The fields every shard of one campaign shares; a report that differs is another campaign's.
constexpr const char* kCampaignFields[] = {"kvdiff_version", "model", "backends",
                                           "tolerance",      "seed",  "cases"};
// Options a report records when they were given, which every shard must share as well: "shapes"
// (absent: fixed), "generation" (--max-length, --long-fraction, --deep-fraction, --batch-percent),
// and the demanding part's settings (not its counts, which are the shard's own).
constexpr const char* kOptionalCampaignFields[] = {"shapes", "generation"};
constexpr const char* kDemandingSettings[] = {"skipped", "model", "backends", "fraction", "rtol"};

// `field` of `object` as its JSON text, or "absent".
std::string FieldText(const json& object, const char* field) {
  return object.is_object() && object.contains(field) ? object.at(field).dump() : "absent";
}

double DiffOf(const json& value) {
  return value.is_null() ? std::numeric_limits<double>::quiet_NaN() : value.get<double>();
}

CaseResult CaseFromJson(const json& j) {
  CaseResult r;
  r.index = j.at("case").get<int64_t>();
  r.passed = j.at("passed").get<bool>();
  r.steps = j.at("steps").get<int64_t>();
  r.rows_compared = j.at("rows_compared").get<int64_t>();
  r.worst_diff = DiffOf(j.at("worst_diff"));
  if (j.contains("worst")) r.worst = WorstRowFromJson(j.at("worst"), "worst");  // since 0.1.0+
  r.shape = j.value("shape", "");                                               // --shapes random
  r.demanding = j.value("demanding", false);
  if (r.demanding) r.worst_relative_diff = DiffOf(j.at("worst_relative_diff"));
  if (!r.passed) {
    r.failure = j.value("failure", "");
    r.scenario_file = j.value("scenario_file", "");
    if (j.contains("shrunk")) {  // since 0.3: the shrunk failing scenario
      const json& s = j.at("shrunk");
      r.shrunk =
          CaseResult::Shrunk{s.at("scenario_file").get<std::string>(),
                             s.at("failure").get<std::string>(), s.at("steps").get<int64_t>(),
                             s.at("replays").get<int64_t>(), s.at("budget_spent").get<bool>()};
    }
    r.not_shrunk = j.value("not_shrunk", "");
    r.not_run = j.value("not_run", false);  // a backend hung in an earlier case (or absent)
  }
  return r;
}

// One shard report, checked: it is a check report, and it ran exactly its shard's cases.
struct ShardReport {
  std::string file;
  const json* root = nullptr;
  Shard shard;
  std::vector<CaseResult> results;
};

// A report's own verdict must be the one its cases give: merge recomputes the verdict from the
// cases, so a report that says it failed while its cases pass (or the reverse) was edited or
// truncated, and is refused rather than silently overruled.
void CheckVerdictMatchesResults(const json& root, const std::vector<CaseResult>& results) {
  int64_t failed = 0;
  for (const CaseResult& r : results) failed += r.passed ? 0 : 1;
  const json& passed = root.at("passed");
  KVDIFF_CHECK(passed.is_boolean() && passed.get<bool>() == (failed == 0),
               "\"passed\" is {} but its results say {} ({} of {} cases failed): a report that "
               "contradicts itself",
               passed.dump(), failed == 0, failed, results.size());
  const json& failures = root.at("failures");
  KVDIFF_CHECK(failures.is_number_integer() && failures.get<int64_t>() == failed,
               "\"failures\" is {} but {} of its {} results failed: a report that contradicts "
               "itself",
               failures.dump(), failed, results.size());
}

ShardReport ReadShard(const std::string& file, const json& root) {
  ShardReport s;
  s.file = file;
  s.root = &root;
  try {
    KVDIFF_CHECK(root.is_object() && root.value("command", "") == "check",
                 "not a `kvdiff check --json` report (no \"command\": \"check\")");
    for (const char* field : kCampaignFields) {
      KVDIFF_CHECK(root.contains(field), "no \"{}\" field", field);
    }
    s.shard.index = root.at("shard").at("index").get<int64_t>();
    s.shard.count = root.at("shard").at("count").get<int64_t>();
    KVDIFF_CHECK(s.shard.count >= 1 && s.shard.index >= 1 && s.shard.index <= s.shard.count,
                 "shard {}/{} is not a shard", s.shard.index, s.shard.count);
    for (const json& c : root.at("results")) s.results.push_back(CaseFromJson(c));
    std::vector<int64_t> ran;
    for (const auto& r : s.results) ran.push_back(r.index);
    const auto expected = ShardCases(root.at("cases").get<int64_t>(), s.shard);
    KVDIFF_CHECK(ran == expected,
                 "shard {}/{} of {} cases should hold {} results (cases {}...), it holds {}: a "
                 "truncated or edited report",
                 s.shard.index, s.shard.count, root.at("cases").get<int64_t>(), expected.size(),
                 expected.empty() ? -1 : expected[0], ran.size());
    CheckVerdictMatchesResults(root, s.results);
  } catch (const json::exception& e) {
    throw InputError(fmt::format("{}: not a `kvdiff check --json` report: {}", file, e.what()));
  } catch (const InputError& e) {
    throw InputError(fmt::format("{}: {}", file, e.what()));
  }
  return s;
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
// The demanding part's counts (harness/campaign/demanding_part.h) over every shard's cases: the
// head report's "demanding" object describes its model, backends and gate, which the shards share.
void MergeDemandingPart(const json& results, json& report) {
  if (!report.contains("demanding") || report["demanding"].contains("skipped")) return;
  int64_t cases = 0, failures = 0;
  double worst = 0;
  for (const json& r : results) {
    if (!r.value("demanding", false)) continue;
    ++cases;
    failures += r.value("passed", true) ? 0 : 1;
    const double rel = r.at("worst_relative_diff").is_null()
                           ? std::numeric_limits<double>::infinity()
                           : r.at("worst_relative_diff").get<double>();
    if (!(rel <= worst)) worst = rel;
  }
  report["demanding"]["cases"] = cases;
  report["demanding"]["failures"] = failures;
  report["demanding"]["worst_relative_diff"] = Number(worst);
}
}  // namespace

MergedCampaign MergeCampaignReports(const std::vector<std::pair<std::string, json>>& reports) {
  KVDIFF_CHECK(!reports.empty(), "merge: expected at least one `check --json` report");
  std::vector<ShardReport> shards;
  for (const auto& [file, root] : reports) shards.push_back(ReadShard(file, root));
  const ShardReport& first = shards[0];
  for (const ShardReport& s : shards) {
    CheckSameCampaign(s, first);
    KVDIFF_CHECK(s.shard.count == first.shard.count,
                 "{}: shard {}/{} but {} is shard {}/{}: a campaign is split one way", s.file,
                 s.shard.index, s.shard.count, first.file, first.shard.index, first.shard.count);
  }

  MergedCampaign m;
  const json& head = *first.root;
  CampaignReport& c = m.campaign;
  c.seed = head.at("seed").get<uint64_t>();
  c.cases = head.at("cases").get<int64_t>();
  c.tolerance = head.at("tolerance").at("abs").get<double>();
  c.backends = head.at("backends").get<std::vector<std::string>>();
  c.shard = Shard{1, 1};
  std::map<int64_t, const ShardReport*> by_index;
  for (const ShardReport& s : shards) {
    m.files.push_back(s.file);
    if (!by_index.emplace(s.shard.index, &s).second) {
      if (m.duplicated.empty() || m.duplicated.back() != s.shard.index) {
        m.duplicated.push_back(s.shard.index);
      }
    }
  }
  std::sort(m.duplicated.begin(), m.duplicated.end());
  m.duplicated.erase(std::unique(m.duplicated.begin(), m.duplicated.end()), m.duplicated.end());
  for (int64_t i = 1; i <= first.shard.count; ++i) {
    if (by_index.count(i) == 0) m.missing.push_back(i);
  }

  // Every case once (a duplicated shard's first report), in case order, verbatim.
  std::vector<std::pair<int64_t, json>> case_json;
  std::optional<Coverage> coverage;  // the shards' coverage, added up (warnings recomputed)
  for (const auto& [index, s] : by_index) {
    const json& results = s->root->at("results");
    for (size_t k = 0; k < results.size(); ++k) {
      c.results.push_back(s->results[k]);
      case_json.emplace_back(s->results[k].index, results[k]);
    }
    c.seconds += s->root->value("seconds", 0.0);
    if (s->root->contains("coverage")) {
      const Coverage shard = Coverage::FromJson(s->root->at("coverage"), s->file + ": coverage");
      if (coverage) {
        coverage->Merge(shard);
      } else {
        coverage = shard;
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

  m.report = head;  // fields a later kvdiff adds travel along
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
  MergeDemandingPart(results, m.report);
  if (m.report.contains("demanding")) {  // the summary's line, as the campaign prints it
    const json& d = m.report["demanding"];
    c.demanding.skipped = d.value("skipped", "");
    c.demanding.notes = d.value("notes", std::vector<std::string>{});
    c.demanding.model = d.value("model", "");
    c.demanding.backends = d.value("backends", std::vector<std::string>{});
    c.demanding.fraction = d.value("fraction", 0.0);
    c.demanding.rtol = d.value("rtol", 0.0);
    c.demanding.cases = d.value("cases", int64_t{0});
    c.demanding.failures = d.value("failures", int64_t{0});
    c.demanding.worst_relative_diff =
        d.contains("worst_relative_diff") && !d.at("worst_relative_diff").is_null()
            ? d.at("worst_relative_diff").get<double>()
            : 0.0;
  }
  m.report["results"] = std::move(results);
  if (coverage) {  // the terminal summary's coverage block as well as the JSON's
    c.coverage = *coverage;
    m.report["coverage"] = coverage->ToJson();
  }
  m.report["merge"] = {{"shards", first.shard.count},
                       {"files", m.files},
                       {"missing", m.missing},
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
  if (!missing.empty() || !duplicated.empty()) {
    // The cases present may all pass; the campaign still did not run as a whole.
    const size_t last = out.rfind('\n', out.size() - 2) + 1;
    if (out.compare(last, 5, "PASS:") == 0) out.replace(last, 4, "INCOMPLETE");
  }
  for (int64_t i : missing) {
    out += fmt::format("FAIL shard {}/{}: missing (no report): its {} cases did not run\n", i,
                       count, ShardCases(campaign.cases, Shard{i, count}).size());
  }
  for (int64_t i : duplicated) {
    out += fmt::format("FAIL shard {}/{}: given by more than one report (merged once)\n", i, count);
  }
  out += fmt::format(
      "{}: {} reports merged, {} of {} shards present{}\n", Passed() ? "PASS" : "FAIL",
      files.size(), count - missing.size(), count,
      missing.empty() && duplicated.empty()
          ? ""
          : fmt::format(" ({} missing, {} duplicated)", missing.size(), duplicated.size()));
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
