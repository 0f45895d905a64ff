// kvdiff merge: the shard reports of a campaign (`check --json`) into the report of the whole.
#include <fmt/format.h>

#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "harness/campaign/merge.h"
#include "harness/report/run_report.h"

namespace kvdiff::cli {
namespace {

struct MergeArgs {
  std::vector<std::string> reports;
  std::string json;
  std::string junit;
};

int Merge(const MergeArgs& args) {
  const harness::MergedCampaign m = harness::MergeCampaignReportFiles(args.reports);
  fmt::print("kvdiff merge: {} reports of campaign seed {} ({} cases in {} shards), backends {}\n",
             m.files.size(), m.campaign.seed, m.campaign.cases,
             m.report.at("merge").at("shards").get<int64_t>(), fmt::join(m.campaign.backends, ","));
  fmt::print("{}", m.Summary());
  if (!args.json.empty()) harness::WriteTextFile(args.json, m.report.dump(2) + "\n");
  if (!args.junit.empty()) harness::WriteTextFile(args.junit, m.ToJUnit());
  return m.ExitCode();
}

}  // namespace

void AddMergeCommand(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<MergeArgs>();
  CLI::App* cmd = app.add_subcommand(
      "merge",
      "Merge the --json reports of a campaign's shards into one (fails when a shard is missing "
      "or duplicated)");
  cmd->add_option("reports", args->reports, "The shards' `kvdiff check --json` reports")
      ->required();
  cmd->add_option("--json", args->json, "Write the merged campaign report as JSON to this file");
  cmd->add_option("--junit", args->junit, "Write one JUnit XML report for the whole campaign");
  cmd->callback([args, &exit_code] { exit_code = Merge(*args); });
}

}  // namespace kvdiff::cli
