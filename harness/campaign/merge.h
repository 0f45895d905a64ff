// `kvdiff merge`: the reports of a campaign's shards (`check --json`, one per machine) put back
// together into the report of the whole campaign, as if one machine had run it, and a verdict
// that fails when a shard is missing or ran twice: a fleet that lost a machine never passes.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "harness/campaign/campaign.h"

namespace kvdiff::harness {

struct MergedCampaign {
  // check --json's shape for the whole campaign (shard 1/1, every case in order) plus "merge":
  // the shard count, the files merged, the shards missing and duplicated.
  nlohmann::json report;
  CampaignReport campaign;  // the same cases, for the terminal summary and JUnit
  // The shards no report ran: how many, and the first kListedMissing of their 1-based indices (a
  // report may say it is shard 1 of 10^15; listing every shard missing would never end).
  static constexpr size_t kListedMissing = 100;
  int64_t missing_count = 0;
  std::vector<int64_t> missing;
  std::vector<int64_t> duplicated;  // shard indices given by more than one report
  std::vector<std::string> files;

  bool Passed() const { return campaign.Passed() && missing_count == 0 && duplicated.empty(); }
  int ExitCode() const { return Passed() ? 0 : 1; }
  std::string Summary() const;
  // The campaign's cases, plus one failing case per listed missing shard and one for the rest.
  std::string ToJUnit() const;
};

// reports: (file name, parsed JSON). InputError naming the file for a report that is not a
// `check --json` report (ReadShardReport: a field of the wrong type or range, or one that
// contradicts the report's cases), or that belongs to another campaign (seed, cases, shard count,
// model, backends, tolerance, version) than the first.
MergedCampaign MergeCampaignReports(
    const std::vector<std::pair<std::string, nlohmann::json>>& reports);

// Reads and parses the files (InputError naming an unreadable or malformed one), then merges.
MergedCampaign MergeCampaignReportFiles(const std::vector<std::string>& files);

}  // namespace kvdiff::harness
