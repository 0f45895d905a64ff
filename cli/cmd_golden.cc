// kvdiff golden verify|regen: the golden files (golden/README.md) as a correctness gate.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/engine_guard.h"
#include "format/error.h"
#include "harness/golden/golden.h"
#include "harness/report/run_report.h"
#include "harness/scenario/scenario.h"

namespace kvdiff::cli {
namespace {

std::vector<std::filesystem::path> ToPaths(const std::vector<std::string>& args) {
  return std::vector<std::filesystem::path>(args.begin(), args.end());
}

struct VerifyArgs {
  std::vector<std::string> paths;
  std::string backends;
  std::string json;
  std::string junit;
  std::optional<double> tolerance;
  int threads = 0;
  harness::BackendOptions isolation;  // --isolate, --isolate-timeout
};

int Verify(const VerifyArgs& args) {
  SeparateReportFromEngines();  // what an engine prints is not the report
  const std::vector<harness::GoldenPaths> sets = harness::FindGoldenSets(ToPaths(args.paths));
  const std::vector<std::string> backends =
      args.backends.empty() ? std::vector<std::string>{} : harness::ParseBackendList(args.backends);
  const harness::VerifyReport report = harness::VerifyGoldens(
      sets, backends, WithThreads(args.isolation, args.threads), args.tolerance);
  fmt::print(Report(), "{}", report.ToTerminal(isatty(fileno(Report())) != 0));
  // The report lists every set; an unreadable one is also an error on stderr, like every command's.
  for (const auto& set : report.sets) {
    if (!set.input_error.empty()) fmt::print(stderr, "kvdiff: error: {}\n", set.input_error);
  }
  if (!args.json.empty()) harness::WriteTextFile(args.json, report.ToJson().dump(2) + "\n");
  if (!args.junit.empty()) harness::WriteTextFile(args.junit, report.ToJUnit());
  return report.ExitCode();
}

struct RegenArgs {
  std::vector<std::string> paths;
  std::string backend;
  bool check = false;
  int threads = 0;
};

int Regen(const RegenArgs& args) {
  SeparateReportFromEngines();  // what an engine prints is not the report
  if (!args.backend.empty()) harness::ParseBackendList(args.backend);  // one known name
  KVDIFF_CHECK(args.backend.find(',') == std::string::npos,
               "--backend: a golden is made by one backend, got \"{}\"", args.backend);
  const std::vector<harness::GoldenPaths> sets = harness::FindGoldenSets(ToPaths(args.paths));
  harness::RegenOptions options;
  options.backend = args.backend;
  options.check_only = args.check;
  options.threads = args.threads;
  int exit_code = 0;
  std::map<harness::RegenStatus, int> counts;
  for (const harness::GoldenPaths& p : sets) {
    const harness::RegenResult r = harness::RegenGoldenSet(p, options);
    ++counts[r.status];
    std::string line = fmt::format("{}: {}", p.golden.string(), harness::RegenStatusName(r.status));
    switch (r.status) {
      case harness::RegenStatus::kUnchanged:
      case harness::RegenStatus::kWritten:
      case harness::RegenStatus::kWouldChange:
        line += ": " + r.change.Summary();
        break;
      default:
        line += ": " + r.message;
        break;
    }
    fmt::print(Report(), "{}\n", line);
    for (const auto& w : r.warnings) fmt::print(Report(), "  warning: {}\n", w);
    std::fflush(Report());
    if (r.status == harness::RegenStatus::kError) exit_code = 2;
    if (exit_code < 2 && (r.status == harness::RegenStatus::kRefused ||
                          r.status == harness::RegenStatus::kWouldChange)) {
      exit_code = 1;
    }
  }
  std::string summary;
  for (const auto& [status, n] : counts) {
    summary +=
        fmt::format("{}{} {}", summary.empty() ? "" : ", ", n, harness::RegenStatusName(status));
  }
  fmt::print(Report(), "golden regen{}: {} golden set{}: {}\n", args.check ? " --check" : "",
             sets.size(), sets.size() == 1 ? "" : "s", summary);
  return exit_code;
}

}  // namespace

void AddGoldenCommand(CLI::App& app, int& exit_code) {
  CLI::App* golden = app.add_subcommand(
      "golden", "Golden files: pinned reference outputs of scenarios (see golden/README.md)");
  golden->require_subcommand(1);

  auto verify_args = std::make_shared<VerifyArgs>();
  CLI::App* verify = golden->add_subcommand(
      "verify",
      "Replay each golden set's scenario on each backend and compare every row with the golden "
      "within its tolerance (exit 0 agree, 1 a mismatch or stale golden, 2 bad input)");
  verify
      ->add_option("paths", verify_args->paths,
                   "Golden folders (searched recursively) or files: NAME.json or NAME.golden.json")
      ->required();
  verify->add_option(
      "--backends", verify_args->backends,
      BackendsHelp("default: " + fmt::format("{}", fmt::join(harness::DefaultBackends(), ","))));
  verify->add_option("--tolerance", verify_args->tolerance,
                     "Gate on max |a-b| of logits (default: each golden's recorded tolerance)");
  verify->add_option("--json", verify_args->json, "Write the report as JSON to this file");
  verify->add_option("--junit", verify_args->junit, "Write a JUnit XML report to this file");
  verify->add_option("--threads", verify_args->threads, "Threads per backend (0: every core)")
      ->check(CLI::NonNegativeNumber);
  AddIsolateFlag(verify, verify_args->isolation);
  verify->callback([verify_args, &exit_code] { exit_code = Verify(*verify_args); });

  auto regen_args = std::make_shared<RegenArgs>();
  CLI::App* regen = golden->add_subcommand(
      "regen",
      "Recompute golden sets with their recorded backend (ref64 for new ones) and rewrite, "
      "atomically, those that moved; refuses a backend whose cached and uncached rows disagree "
      "(exit 0 done, 1 refused or --check found changes, 2 bad input)");
  regen
      ->add_option("paths", regen_args->paths,
                   "Golden folders (searched recursively) or files: NAME.json or NAME.golden.json")
      ->required();
  regen->add_option("--backend", regen_args->backend,
                    "Backend to compute with (default: the one the golden records, else the "
                    "registry's float64 backend, ref64)");
  regen->add_flag("--check", regen_args->check,
                  "Compute and report, write nothing; exit 1 if any file would change");
  regen->add_option("--threads", regen_args->threads, "Threads per backend (0: every core)")
      ->check(CLI::NonNegativeNumber);
  regen->callback([regen_args, &exit_code] { exit_code = Regen(*regen_args); });
}

}  // namespace kvdiff::cli
