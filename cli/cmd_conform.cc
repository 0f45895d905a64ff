// `kvdiff conform ENGINE`: the conformance suite for an engine (a plugin path, plugin:PATH?k=v,
// exec:COMMAND?k=v, or any backend name): every op against an oracle backend, the error paths,
// fork, reset, determinism, capacity, batched calls (against the oracle and the items alone, and
// their refusals), context shifts when the engine shifts (rows after a shift held to ref64), then
// a campaign. Exit 0 when every check passes, 1 when one fails, 2 on bad
// input (an engine that cannot be loaded, an unknown backend).
#include <fmt/format.h>

#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/engine_guard.h"
#include "format/error.h"
#include "harness/backend/registry.h"
#include "harness/compare/gate.h"
#include "harness/conform/conform.h"
#include "harness/report/run_report.h"
#include "harness/run/differential_run.h"

namespace kvdiff::cli {
namespace {

struct ConformArgs {
  std::string engine;
  ModelFlags model;  // --model, --preset, --model-seed
  std::string against = "impl";
  int64_t cases = 100;
  uint64_t seed = 0;
  std::optional<double> tolerance;
  std::string json, junit;
  std::string out_dir = "kvdiff-failures";
  harness::BackendOptions isolation;  // --isolate, --isolate-timeout
};

// A backend name, or the path of a plugin (the engine author's usual first argument).
std::string EngineBackendName(const std::string& engine) {
  if (harness::BackendRegistry::Global().Knows(engine)) return engine;
  const std::string path = engine.substr(0, engine.find('?'));
  KVDIFF_CHECK(std::filesystem::is_regular_file(path),
               "conform: '{}' is neither a backend ({}) nor a plugin file", engine,
               harness::BackendRegistry::Global().NamesText());
  return std::string(harness::kPluginPrefix) + engine;
}

int Conform(const ConformArgs& args) {
  SeparateReportFromEngines();  // what an engine prints is not the report
  const harness::ModelSpec model = args.model.Spec();
  const std::string engine_name = EngineBackendName(args.engine);
  auto weights = harness::LoadModelFor(model);
  const BackendSet backends =
      MakeBackends({engine_name, args.against}, weights, WithThreads(args.isolation, 1));

  harness::ConformOptions options;
  std::vector<std::string> gate_notes;
  options.gate = harness::ResolveGate(args.tolerance, {}, backends.all, &gate_notes);
  options.campaign_cases = args.cases;
  options.seed = args.seed;
  options.out_dir = args.out_dir;
  // Rows after a shift have no uncached oracle: ref64 replays the same shifts exactly and
  // arbitrates, as in a differential run. Made only for an engine that shifts; without LibTorch,
  // the oracle arbitrates if it shifts (impl: in float32, itself held to ref64 by its tests).
  std::unique_ptr<harness::Backend> ref64;
  if (backends.all[0]->Info().shifts && args.against != "ref64" &&
      harness::BackendRegistry::Global().Has("ref64")) {
    ref64 =
        harness::BackendRegistry::Global().Make("ref64", weights, WithThreads(args.isolation, 1));
    options.shift_arbiter = ref64.get();
  }
  fmt::print(Report(), "kvdiff conform: {} ({}) against {}, model {} ({})\n", engine_name,
             backends.all[0]->Info().description, args.against, model.Describe(),
             harness::DescribeModel(weights->config));
  for (const std::string& note : gate_notes) fmt::print(Report(), "{}\n", note);
  std::fflush(Report());
  const harness::ConformReport report =
      harness::RunConformance(model, *backends.all[0], *backends.all[1], options);
  fmt::print(Report(), "{}", report.Table());
  if (!args.json.empty()) harness::WriteTextFile(args.json, report.ToJson().dump(2) + "\n");
  if (!args.junit.empty()) harness::WriteTextFile(args.junit, report.ToJUnit());
  return report.ExitCode();
}

}  // namespace

void AddConformCommand(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<ConformArgs>();
  CLI::App* cmd = app.add_subcommand(
      "conform",
      "Put an engine through the conformance suite: every session op held to an oracle backend, "
      "the error paths, fork, reset, determinism, capacity, batched calls of several sessions "
      "(each row held to the oracle and to the items alone; the refusals), then a check "
      "campaign");
  cmd->add_option(
         "engine", args->engine,
         "The engine: a plugin file (PATH[?key=value&...]), plugin:PATH, exec:COMMAND (an engine "
         "program: docs/any-language.md), or a backend name")
      ->required();
  AddModelFlags(cmd, PresetUnlessModelSpelling(), args->model);
  cmd->add_option("--against", args->against,
                  "The oracle backend every row is held to (impl; ref64 with LibTorch)")
      ->default_val("impl");
  cmd->add_option("--cases", args->cases, "Cases of the closing campaign (0: none)")
      ->default_val(100)
      ->check(CLI::Range(int64_t{0}, int64_t{1000000}));
  cmd->add_option("--seed", args->seed, "Seed of the checks' tokens and of the campaign")
      ->default_val(0);
  cmd->add_option(
      "--tolerance", args->tolerance,
      fmt::format("Gate on max |a-b| of logits (default {})", harness::kDefaultTolerance));
  cmd->add_option("--json", args->json, "Write the report as JSON to this file");
  cmd->add_option("--junit", args->junit, "Write a JUnit XML report (one testcase per check)");
  cmd->add_option("--out-dir", args->out_dir, "Where the campaign's failing cases are written")
      ->default_val("kvdiff-failures");
  AddIsolateFlag(cmd, args->isolation);
  cmd->callback([args, &exit_code] { exit_code = Conform(*args); });
}

}  // namespace kvdiff::cli
