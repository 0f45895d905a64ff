// `kvdiff repro NAME`: the source document's experiments (ok, pos0, reuse, reuse1, fresh, fresh1,
// quantized, stale-position, reference-reuse, or all) on a model directory or a random preset. Exit
// codes: 0 when every experiment behaves as the document says (the bugs reproduce, the fixes are
// correct), 1 when one does not, 2 on bad input or usage.
#include <fmt/format.h>

#include <filesystem>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/engine_guard.h"
#include "format/error.h"
#include "format/model_files.h"
#include "format/tokenizer.h"
#include "harness/report/run_report.h"
#include "harness/repro/repro.h"
#include "harness/run/differential_run.h"
#include "harness/scenario/scenario.h"

namespace kvdiff::cli {
namespace {

struct ReproArgs {
  std::string name;
  ModelFlags model;  // --model, --llama2c, --tokenizer, --preset, --seed
  std::optional<std::string> prompt, second, tokens, second_tokens;
  std::optional<int64_t> second1_token;
  int64_t n = 20;
  std::string save;
  std::string backend = "impl";
  int threads = 0;
  harness::BackendOptions isolation;  // --isolate, --isolate-timeout
};

int Run(const ReproArgs& args) {
  SeparateReportFromEngines();  // what an engine prints is not the report
  const bool all = args.name == "all";
  std::vector<harness::Experiment> experiments =
      all ? harness::AllExperiments()
          : std::vector<harness::Experiment>{harness::ParseExperimentName(args.name)};
  const harness::ModelSpec spec = args.model.Spec();
  KVDIFF_CHECK(args.save.empty() || !all,
               "--save: writes one experiment's scenario; name one experiment instead of all");

  auto weights = harness::LoadModelFor(spec);
  const format::LlamaConfig& config = weights->config;
  const std::optional<format::Tokenizer> tokenizer =
      harness::LoadTokenizerFor(spec, config.vocab_size);

  harness::ReproInput input;
  input.prompt = args.prompt;
  input.second = args.second;
  if (args.tokens) input.tokens = ParseTokenIds("--tokens", *args.tokens);
  if (args.second_tokens)
    input.second_tokens = ParseTokenIds("--second-tokens", *args.second_tokens);
  if (args.second1_token) {
    KVDIFF_CHECK(*args.second1_token >= 0 && *args.second1_token <= INT32_MAX,
                 "--second1-token: expected a token id, got {}", *args.second1_token);
    input.second1_token = static_cast<Token>(*args.second1_token);
  }
  input.n = args.n;
  const format::Tokenizer* tok = tokenizer ? &*tokenizer : nullptr;
  harness::ReproPrompts prompts = harness::MakeReproPrompts(input, config, tok);
  harness::Repro repro = harness::Repro::OnModel(weights, prompts, args.backend,
                                                 WithThreads(args.isolation, args.threads));
  if (!all) {
    const std::string why = repro.Unavailable(experiments[0]);
    KVDIFF_CHECK(why.empty(), "repro {}: {}", args.name, why);
  }

  if (!args.save.empty()) {
    // Model files are written relative to the scenario's folder (how `kvdiff run` resolves
    // them), so a file saved beside the model keeps working when both move together. A model
    // given as --model DIR stays a directory ({"path": ...}), a --llama2c one a checkpoint.
    const auto folder = std::filesystem::absolute(args.save).parent_path();
    auto relative = [&folder](const std::filesystem::path& p) {
      return std::filesystem::proximate(std::filesystem::absolute(p), folder);
    };
    harness::ModelSpec saved = spec;
    if (spec.path) saved.path = relative(*spec.path);
    if (spec.llama2c) {
      saved.llama2c->checkpoint = relative(spec.llama2c->checkpoint);
      if (spec.llama2c->tokenizer) saved.llama2c->tokenizer = relative(*spec.llama2c->tokenizer);
    }
    const harness::Scenario sc =
        harness::ExperimentScenario(experiments[0], prompts, saved, config, args.backend);
    harness::WriteTextFile(args.save, sc.ToText());
  }

  std::vector<harness::ExperimentResult> results;
  for (harness::Experiment e : experiments) results.push_back(repro.Run(e));

  std::string out = harness::FormatReproHeader(spec.Describe(), config, prompts, tok) + "\n";
  if (all) {
    out += harness::FormatReproTable(results, tok);
  } else {
    out += harness::FormatExperiment(results[0], tok);
  }
  if (!args.save.empty()) {
    out += fmt::format("\nwrote {}: replay it with kvdiff run {}\n", args.save, args.save);
  }
  fmt::print(Report(), "{}", out);
  return harness::ReproExitCode(results);
}

}  // namespace

void AddReproCommand(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<ReproArgs>();
  CLI::App* cmd = app.add_subcommand(
      "repro",
      "Run the source document's KV-cache experiments (a first conversation, n greedy tokens, "
      "then a second one) and say where each line departs from the correct output (exit 0 every "
      "experiment behaves as documented, 1 one does not, 2 bad input)");
  cmd->add_option("name", args->name,
                  "ok, pos0, reuse, reuse1, fresh, fresh1, quantized, stale-position, "
                  "reference-reuse, or all")
      ->required();
  AddModelFlags(cmd,
                {ModelFlagRules::kOneSource, "Model directory",
                 "Random model preset: tiny, tiny-swa, smollm2-135m", "--seed", 0},
                args->model);
  auto* prompt = cmd->add_option(
      "--prompt", args->prompt,
      "First prompt as text (needs the model's tokenizer; BOS first). Default \"Once upon a time, "
      "Lily\" with a tokenizer, else ids 5 17 3 99 42");
  auto* tokens = cmd->add_option("--tokens", args->tokens, "First prompt as token ids (\"1,2,3\")");
  prompt->excludes(tokens);
  auto* second = cmd->add_option(
      "--second", args->second,
      "Second prompt as text (at least 2 tokens). Default \"The dog\", else ids 8 17 3 120 42");
  auto* second_tokens =
      cmd->add_option("--second-tokens", args->second_tokens, "Second prompt as token ids");
  second->excludes(second_tokens);
  cmd->add_option("--second1-token", args->second1_token,
                  "The one-token second prompt of reuse1/fresh1 (default: the second prompt's "
                  "first token after BOS)");
  cmd->add_option("-n", args->n, "Greedy tokens generated per conversation")->capture_default_str();
  cmd->add_option("--save", args->save,
                  "Write the experiment as a scenario file that `kvdiff run` replays");
  cmd->add_option("--backend", args->backend,
                  "The engine the experiments run on (reference-reuse always runs on the "
                  "transformers-semantics backend, ref)")
      ->capture_default_str();
  cmd->add_option("--threads", args->threads, "Threads (0: every core)")
      ->check(CLI::NonNegativeNumber);
  AddIsolateFlag(cmd, args->isolation);
  cmd->callback([args, &exit_code] { exit_code = Run(*args); });
}

}  // namespace kvdiff::cli
