#include "cli/cli_util.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <filesystem>
#include <sstream>

#include "format/error.h"
#include "harness/backend/registry.h"

namespace kvdiff::cli {
namespace {

std::string Trim(const std::string& s) {
  const auto not_space = [](unsigned char c) { return !std::isspace(c); };
  const auto b = std::find_if(s.begin(), s.end(), not_space);
  const auto e = std::find_if(s.rbegin(), s.rend(), not_space).base();
  return b < e ? std::string(b, e) : std::string();
}

// Commas separate items when there are any (so "1,,3" has an empty item); otherwise whitespace.
std::vector<std::string> SplitItems(const std::string& text) {
  std::vector<std::string> items;
  if (text.find(',') != std::string::npos) {
    size_t start = 0;
    while (true) {
      const size_t comma = text.find(',', start);
      items.push_back(Trim(text.substr(start, comma == std::string::npos ? comma : comma - start)));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
  } else {
    std::istringstream in(text);
    for (std::string word; in >> word;) items.push_back(word);
    if (items.empty()) items.push_back("");
  }
  return items;
}

}  // namespace

std::vector<int64_t> ParseIntList(const std::string& flag, const std::string& text) {
  std::vector<int64_t> values;
  for (const std::string& item : SplitItems(text)) {
    KVDIFF_CHECK(
        !item.empty() && item.size() <= 18 &&
            std::all_of(item.begin(), item.end(), [](char c) { return c >= '0' && c <= '9'; }),
        "{}: expected non-negative integers separated by commas or spaces, like 1,2,3; "
        "item {} is \"{}\"",
        flag, values.size(), item);
    values.push_back(std::stoll(item));
  }
  return values;
}

Tokens ParseTokenIds(const std::string& flag, const std::string& text, int64_t vocab_size) {
  Tokens tokens;
  for (const int64_t id : ParseIntList(flag, text)) {
    KVDIFF_CHECK(vocab_size < 0 || id < vocab_size,
                 "{}: token id {} at index {} is out of range for vocab_size {}", flag, id,
                 tokens.size(), vocab_size);
    KVDIFF_CHECK(id <= INT32_MAX, "{}: token id {} at index {} does not fit a 32-bit token id",
                 flag, id, tokens.size());
    tokens.push_back(static_cast<Token>(id));
  }
  return tokens;
}

BackendSet MakeBackends(const std::vector<std::string>& names,
                        std::shared_ptr<const format::ModelWeights> weights,
                        const harness::BackendOptions& options) {
  BackendSet set;
  for (const std::string& name : names) {
    set.owned.push_back(harness::BackendRegistry::Global().Make(name, weights, options));
    set.all.push_back(set.owned.back().get());
  }
  return set;
}

void AddIsolateFlag(CLI::App* cmd, harness::BackendOptions& options) {
  CLI::Option* isolate = cmd->add_flag(
      "--isolate",
      "Run engine plugins in a child process (the default): a crash, hang or exit while loading, "
      "opening, running or closing fails that call, naming what happened");
  CLI::Option* in_process = cmd->add_flag_callback(
      "--in-process", [&options] { options.isolate = false; },
      "Load engine plugins into kvdiff itself: faster, but a plugin that crashes or hangs takes "
      "kvdiff with it");
  in_process->excludes(isolate);
  cmd->add_option("--isolate-timeout", options.isolate_timeout_seconds,
                  "Seconds one isolated engine call (opening it too) may take before it is killed")
      ->default_val(600)
      ->check(CLI::Range(0.001, 86400.0));
}

void AddModelFlags(CLI::App* cmd, const ModelFlagsSpelling& spelling, ModelFlags& flags) {
  flags.rules = spelling.rules;
  CLI::Option* model = cmd->add_option("--model", flags.model, spelling.model_help);
  const bool one_source = spelling.rules == ModelFlagRules::kOneSource;
  if (one_source) {
    CLI::Option* llama2c =
        cmd->add_option("--llama2c", flags.llama2c,
                        "A llama2.c checkpoint (e.g. stories260K.bin), converted in memory");
    cmd->add_option("--tokenizer", flags.tokenizer,
                    "The llama2.c checkpoint's tokenizer.bin (e.g. tok512.bin), for text prompts")
        ->needs(llama2c);
  }
  CLI::Option* preset = flags.preset_option =
      cmd->add_option("--preset", flags.preset, spelling.preset_help);
  // Where --model and --preset may not meet, the parser says so and --help shows it; check and
  // conform refuse the pair after parsing, in a message that names --model-seed too.
  if (spelling.rules != ModelFlagRules::kPresetUnlessModel) preset->excludes(model);
  flags.seed_option =
      cmd->add_option(spelling.seed_flag, flags.seed, "Seed of the preset's random weights")
          ->default_val(spelling.seed_default);
  if (one_source) flags.seed_option->needs(preset);
}

ModelFlagsSpelling PresetUnlessModelSpelling() {
  return {ModelFlagRules::kPresetUnlessModel, "Model directory (default: the tiny preset, seed 7)",
          "Random model preset (tiny, tiny-swa, smollm2-135m)", "--model-seed", 7};
}

bool ModelFlags::SeedGiven() const { return seed_option && seed_option->count() > 0; }

harness::ModelSpec ModelFlags::Spec() const {
  harness::ModelSpec spec;
  switch (rules) {
    case ModelFlagRules::kPresetUnlessModel:
      KVDIFF_CHECK(model.empty() || (preset.empty() && !SeedGiven()),
                   "--model cannot be combined with --preset/--model-seed (a model directory has "
                   "its own weights)");
      if (!model.empty()) {
        spec.path = std::filesystem::absolute(model).lexically_normal();
      } else {
        spec.preset = preset.empty() ? "tiny" : preset;
        spec.seed = seed;
      }
      return spec;
    case ModelFlagRules::kOneSource: {
      const int sources = !model.empty() + !llama2c.empty() + !preset.empty();
      KVDIFF_CHECK(sources == 1,
                   "repro: give one of --model DIR, --llama2c FILE.bin or --preset NAME (with "
                   "--seed), not {}",
                   sources == 0 ? "neither" : "several");
      break;
    }
    case ModelFlagRules::kModelOrPreset:
      break;
  }
  if (!model.empty()) {
    spec.path = model;
  } else if (!llama2c.empty()) {
    spec.llama2c = harness::Llama2cSpec{llama2c, std::nullopt};
    if (!tokenizer.empty()) spec.llama2c->tokenizer = tokenizer;
  } else if (preset_option->count() > 0) {  // bench: an empty --preset is an unknown preset
    spec.preset = preset;
    spec.seed = seed;
  }
  return spec;
}

std::string BackendsHelp(const std::string& defaults_note) {
  return fmt::format(
      "Comma-separated backends: {}, plugin:PATH[?key=value&...] (an engine plugin), "
      "exec:COMMAND[?key=value&...] (an engine program on stdin/stdout: "
      "docs/protocol.md){}",
      harness::BackendRegistry::Global().HelpText(),
      defaults_note.empty() ? "" : " (" + defaults_note + ")");
}

}  // namespace kvdiff::cli
