// Argument parsing shared by the subcommands.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "format/model_files.h"
#include "format/tensor.h"
#include "harness/backend/backend.h"
#include "harness/scenario/scenario.h"

namespace CLI {
class App;
class Option;
}  // namespace CLI

namespace kvdiff::cli {

// "1,2,3" or "1 2 3" -> {1, 2, 3}. Every item must be a whole non-negative integer: "1,x,3",
// "1,,3", "1.5" are refused (InputError) naming the flag and the offending item.
std::vector<int64_t> ParseIntList(const std::string& flag, const std::string& text);

// ParseIntList, then every id checked against the vocabulary when vocab_size >= 0.
Tokens ParseTokenIds(const std::string& flag, const std::string& text, int64_t vocab_size = -1);

// The backends named, built by the registry over one set of weights.
struct BackendSet {
  std::vector<std::unique_ptr<harness::Backend>> owned;
  std::vector<const harness::Backend*> all;  // the same, in order, as RunScenario takes them
};
BackendSet MakeBackends(const std::vector<std::string>& names,
                        std::shared_ptr<const format::ModelWeights> weights,
                        const harness::BackendOptions& options);

// Plugin backends run their engine in a child process by default, so a crash, hang or exit fails
// the call it happened in (exit 1, the signal named) instead of killing kvdiff and its report;
// --in-process opts out, --isolate (the default) is still accepted, --isolate-timeout bounds a
// call.
void AddIsolateFlag(CLI::App* cmd, harness::BackendOptions& options);
// `options` with its thread count set.
inline harness::BackendOptions WithThreads(harness::BackendOptions options, int threads) {
  options.threads = threads;
  return options;
}

// The flags naming the model a command runs on (--model DIR, --preset NAME and its seed, repro's
// --llama2c FILE), declared here once with the ModelSpec they make. The commands grew them with
// different defaults and rules, which their --help and the bad-input catalogue document, so each
// command says which rules it keeps (ModelFlagRules) and how it words the flags.
enum class ModelFlagRules {
  // check, conform: --model DIR, else --preset (default tiny) and --model-seed; --model with
  // either is refused after parsing. The directory is made absolute: the scenario files of failing
  // cases are written elsewhere and must still find it.
  kPresetUnlessModel,
  // repro: exactly one of --model DIR, --llama2c FILE [--tokenizer FILE], --preset NAME [--seed].
  kOneSource,
  // bench: --model DIR, else --preset (absent: the bench's own default) with --seed.
  kModelOrPreset,
};
struct ModelFlagsSpelling {
  ModelFlagRules rules;
  std::string model_help;
  std::string preset_help;
  std::string seed_flag;  // "--model-seed" where --seed seeds the campaign (check, conform)
  uint64_t seed_default = 0;
};
struct ModelFlags {
  ModelFlagRules rules = ModelFlagRules::kPresetUnlessModel;
  std::string model;               // --model
  std::string preset;              // --preset
  std::string llama2c, tokenizer;  // kOneSource: a llama2.c checkpoint and its tokenizer.bin
  uint64_t seed = 0;               // the preset's random weights
  CLI::Option* preset_option = nullptr;
  CLI::Option* seed_option = nullptr;

  bool SeedGiven() const;
  // The model the flags name; InputError, in the command's words, when they name it twice or, for
  // kOneSource, not at all. kModelOrPreset with neither: a spec with no source.
  harness::ModelSpec Spec() const;
};
void AddModelFlags(CLI::App* cmd, const ModelFlagsSpelling& spelling, ModelFlags& flags);
// check's and conform's: kPresetUnlessModel, worded alike.
ModelFlagsSpelling PresetUnlessModelSpelling();

// "Comma-separated backends: impl (Eigen, float32, ...), ref (...)" from the registry.
std::string BackendsHelp(const std::string& defaults_note);

}  // namespace kvdiff::cli
