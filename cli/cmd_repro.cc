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
  std::string model;
  std::string llama2c, tokenizer;  // a llama2.c checkpoint and its tokenizer.bin
  std::string preset;
  uint64_t seed = 0;
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
  const int sources = !args.model.empty() + !args.llama2c.empty() + !args.preset.empty();
  KVDIFF_CHECK(sources == 1,
               "repro: give one of --model DIR, --llama2c FILE.bin or --preset NAME (with "
               "--seed), not {}",
               sources == 0 ? "neither" : "several");
  KVDIFF_CHECK(args.save.empty() || !all,
               "--save: writes one experiment's scenario; name one experiment instead of all");

  harness::ModelSpec spec;
  if (!args.model.empty()) {
    spec.path = args.model;
  } else if (!args.llama2c.empty()) {
    spec.llama2c = harness::Llama2cSpec{args.llama2c, std::nullopt};
    if (!args.tokenizer.empty()) spec.llama2c->tokenizer = args.tokenizer;
  } else {
    spec.preset = args.preset;
    spec.seed = args.seed;
  }
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
  auto* model = cmd->add_option("--model", args->model, "Model directory");
  auto* llama2c =
      cmd->add_option("--llama2c", args->llama2c,
                      "A llama2.c checkpoint (e.g. stories260K.bin), converted in memory");
  cmd->add_option("--tokenizer", args->tokenizer,
                  "The llama2.c checkpoint's tokenizer.bin (e.g. tok512.bin), for text prompts")
      ->needs(llama2c);
  auto* preset =
      cmd->add_option("--preset", args->preset, "Random model preset: tiny, smollm2-135m");
  model->excludes(preset);
  preset->excludes(model);
  cmd->add_option("--seed", args->seed, "Seed of the preset's random weights")
      ->capture_default_str()
      ->needs(preset);
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
