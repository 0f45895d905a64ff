// One shard's `kvdiff check --json` report as `kvdiff merge` reads it: every field merge uses,
// checked for its type and range, and for agreement with the report's own cases, before anything
// is merged. A report is input like any file: a wrong field is refused naming the file, the field,
// what was expected and what was found, never read as whatever nlohmann can convert it to.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "harness/campaign/campaign.h"
#include "harness/campaign/coverage.h"

namespace kvdiff::harness {

struct ShardReport {
  std::string file;
  const nlohmann::json* root = nullptr;  // the parsed report, for the fields compared as text
  Shard shard;
  uint64_t seed = 0;
  int64_t cases = 0;  // of the whole campaign, 1 to kMaxCases
  double tolerance = 0;
  std::vector<std::string> backends;
  double seconds = 0;
  std::vector<CaseResult> results;  // exactly the shard's cases, in order
  std::optional<Coverage> coverage;
  // The demanding part's settings and counts, when the report has a "demanding" object.
  std::optional<CampaignReport::Demanding> demanding;
};

// InputError "FILE: ..." naming the field for a report that is not a check report, has a field of
// the wrong type or out of range, does not hold exactly its shard's cases, or contradicts itself
// (its verdict or a case's "passed" against the case's own figures).
ShardReport ReadShardReport(const std::string& file, const nlohmann::json& root);

}  // namespace kvdiff::harness
