// What the two kinds of campaign share (campaign.cc, shape_campaign.cc): the options check, the
// report's head, one case run on a set of backends, a failing case's scenario file, and the fold
// of a case into the report. Not for use outside the campaign.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "harness/campaign/campaign.h"

namespace kvdiff::harness::campaign_detail {

// InputError naming --cases or --tolerance.
void CheckOptions(const CampaignOptions& options);
// The report's seed, cases, shard, tolerance and backends; its cases and figures come after.
CampaignReport NewReport(const std::vector<std::string>& backend_names,
                         const CampaignOptions& options);
// The backends that outlasted their time-out in a campaign (RunReport::hung_backends), each with
// the first case it hung in, shared by the jobs and the parts. A new process of a hung engine would
// most likely hang as long again, so the cases that start after it do not run (RunCase), and
// --shapes random does not start it (RunShapeCase): the time-out is waited for once, not once a
// case (only cases already running on other jobs may wait too).
class HungBackends {
 public:
  struct Hang {
    std::string backend;
    int64_t first_case = 0;
    std::string Refusal() const;  // "not run: backend X did not answer ... in case K ..."
  };
  void Add(const std::string& name, int64_t k);
  // The first of these backends that hung, if one did.
  std::optional<Hang> FirstOf(const std::vector<std::string>& names) const;

 private:
  mutable std::mutex mutex_;
  std::map<std::string, int64_t> first_case_;
};

// Case k's scenario on `model` (whose config is `config`), with the campaign's backends and
// gate, validated (a generator bug must not pass as a backend bug). A demanding case
// (harness/campaign/demanding_part.h) also has the relative gate tolerance_rel.
Scenario NewCase(const format::LlamaConfig& config, const ModelSpec& model,
                 const std::vector<std::string>& backend_names, const CampaignOptions& options,
                 const GenerationOptions& generation, int64_t k, double tolerance_rel = 0);
// Runs case k's scenario on one job's backends (or, through for_each_backend, some replays on an
// idle job's equal ones); writes its file when it fails. With `hung`: not run when one of its
// backends hung before (failing, saying so), and its own hangs are added.
CaseResult RunCase(const Scenario& sc, const std::vector<const Backend*>& backends,
                   const CampaignOptions& options, int64_t k, bool demanding = false,
                   const ForEachBackend& for_each_backend = {}, HungBackends* hung = nullptr);
// Writes case k's scenario into options.out_dir as check-seedS-caseK<suffix>.json (safe from
// several jobs); returns its path.
std::string WriteFailingCase(const CampaignOptions& options, int64_t k, const Scenario& sc,
                             const std::string& suffix = "");
// A failed run's first divergence or error, one line, as reports show it.
std::string FailureLine(const RunReport& run, bool demanding);
// Shrinks failing cases among results[i] for i in `which` (in that order) on `backends`
// (harness/campaign/shrink.h) while *shrinks_left > 0, counting each down, and records each one's
// smallest failing scenario (written beside its case).
void ShrinkFirstFailures(const format::LlamaConfig& config, const std::vector<Scenario>& scenarios,
                         std::vector<CaseResult>& results, const std::vector<size_t>& which,
                         const std::vector<const Backend*>& backends,
                         const CampaignOptions& options, int64_t* shrinks_left);
// Adds a finished case's figures to the report (in case order).
void AddResult(CampaignReport& report, CaseResult result);
// Makes an ordinary case's worst row the report's when it is worse (the first on ties).
void AddWorst(CampaignReport& report, const CaseResult& result);

}  // namespace kvdiff::harness::campaign_detail
