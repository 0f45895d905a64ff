// kvdiff run SCENARIO.json: replay one scenario on the backends and report every divergence.
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
#include "harness/backend/backend.h"
#include "harness/compare/compare.h"
#include "harness/compare/gate.h"
#include "harness/report/html_run_report.h"
#include "harness/report/run_report.h"
#include "harness/run/differential_run.h"
#include "harness/scenario/scenario.h"

namespace kvdiff::cli {
namespace {

struct RunArgs {
  std::string scenario;
  std::string model;
  std::string backends;
  std::string json;
  std::string junit;
  std::string html;
  std::optional<double> tolerance;
  bool localize = false;
  int threads = 0;
  harness::BackendOptions isolation;  // --isolate, --isolate-timeout
};

int Run(const RunArgs& args) {
  SeparateReportFromEngines();  // what an engine prints is not the report
  harness::Scenario sc = harness::LoadScenario(args.scenario);
  if (!args.model.empty()) {
    sc.model = harness::ModelSpec{};
    sc.model.path = args.model;
  }
  std::vector<std::string> notes;
  const std::vector<std::string> requested =
      args.backends.empty() ? std::vector<std::string>{} : harness::ParseBackendList(args.backends);
  const std::vector<std::string> names = harness::PlanBackends(requested, sc, &notes);
  auto weights = harness::LoadModelFor(sc.model);
  try {
    harness::PrepareScenario(sc, *weights);  // checks the steps against the model
  } catch (const InputError& e) {
    throw InputError(fmt::format("{}: {}", args.scenario, e.what()));
  }
  const BackendSet backends =
      MakeBackends(names, weights, WithThreads(args.isolation, args.threads));
  sc.gate = harness::ResolveGate(args.tolerance, sc.gate, backends.all, &notes);
  harness::RunOptions options;
  options.localize = args.localize;
  harness::RunReport report = harness::RunScenario(sc, backends.all, options);
  report.notes.insert(report.notes.begin(), notes.begin(), notes.end());
  fmt::print(Report(), "{}", harness::FormatTerminal(report, isatty(fileno(Report())) != 0));
  if (!args.json.empty()) {
    harness::WriteTextFile(args.json, harness::ReportToJson(report).dump(2) + "\n");
  }
  if (!args.junit.empty()) harness::WriteTextFile(args.junit, harness::ReportToJUnit(report));
  if (!args.html.empty()) harness::WriteTextFile(args.html, harness::RunReportToHtml(report));
  return report.ExitCode();
}

}  // namespace

void AddRunCommand(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<RunArgs>();
  CLI::App* cmd = app.add_subcommand(
      "run",
      "Replay a scenario on each backend; compare every cached logits row with the same "
      "backend's uncached forward and with the other backends (exit 0 agree, 1 diverge, 2 bad "
      "input)");
  cmd->add_option("scenario", args->scenario, "Scenario JSON file")->required();
  cmd->add_option("--model", args->model, "Model directory (overrides the scenario's model)");
  cmd->add_option("--backends", args->backends,
                  BackendsHelp("default: the scenario's, else " +
                               fmt::format("{}", fmt::join(harness::DefaultBackends(), ","))));
  cmd->add_option("--tolerance", args->tolerance,
                  fmt::format("Gate on max |a-b| of logits (default: the scenario's tolerance.abs, "
                              "else {})",
                              harness::kDefaultTolerance));
  cmd->add_option("--json", args->json, "Write the full report as JSON to this file");
  cmd->add_option("--junit", args->junit, "Write a JUnit XML report to this file");
  cmd->add_option("--html", args->html,
                  "Write a self-contained HTML page (steps, |a-b| per row against position, the "
                  "first divergence; with --localize the per-layer map) to this file");
  cmd->add_flag("--localize", args->localize,
                "On the first divergence, find the first layer (attention or MLP) that differs");
  cmd->add_option("--threads", args->threads, "Threads per backend (0: every core)")
      ->check(CLI::NonNegativeNumber);
  AddIsolateFlag(cmd, args->isolation);
  cmd->callback([args, &exit_code] { exit_code = Run(*args); });
}

}  // namespace kvdiff::cli
