// A scenario's model spec made real: its weights, its tokenizer, its config, its files.
#include "harness/run/model_for.h"

#include <fmt/format.h>

#include "format/error.h"
#include "format/llama2c.h"

namespace kvdiff::harness {

format::LlamaConfig ConfigFor(const ModelSpec& spec) {
  if (spec.path) return format::InspectModel(*spec.path).config;  // headers only: loads nothing
  if (spec.config) return *spec.config;
  if (spec.llama2c) return LoadModelFor(spec)->config;  // the checkpoint holds its config inline
  return format::PresetConfig(spec.preset.value_or(""));
}

std::shared_ptr<const format::ModelWeights> LoadModelFor(const ModelSpec& spec) {
  if (spec.path) return std::make_shared<const format::ModelWeights>(format::LoadModel(*spec.path));
  if (spec.llama2c) {
    // Checked before reading: a missing shared-data file is the likely mistake, and it deserves
    // a message naming the field rather than the reader's "cannot open".
    KVDIFF_CHECK(std::filesystem::is_regular_file(spec.llama2c->checkpoint),
                 "model.llama2c.checkpoint: {} does not exist (the llama2.c model file, e.g. "
                 "stories260K.bin; a scenario file's relative paths are read from its folder)",
                 spec.llama2c->checkpoint.string());
    if (spec.llama2c->tokenizer) {
      KVDIFF_CHECK(std::filesystem::is_regular_file(*spec.llama2c->tokenizer),
                   "model.llama2c.tokenizer: {} does not exist (the llama2.c tokenizer file, "
                   "e.g. tok512.bin; a scenario file's relative paths are read from its folder)",
                   spec.llama2c->tokenizer->string());
    }
    auto weights = std::make_shared<const format::ModelWeights>(
        format::ReadLlama2cCheckpoint(spec.llama2c->checkpoint));
    // The tokenizer is read whether or not the scenario has text, as convert reads it: a file of
    // random bytes is refused here rather than accepted until a text prompt needs it.
    if (spec.llama2c->tokenizer) {
      (void)format::Tokenizer::ReadLlama2c(*spec.llama2c->tokenizer, weights->config.vocab_size);
    }
    return weights;
  }
  if (spec.config) {
    return std::make_shared<const format::ModelWeights>(
        format::MakeRandomModel(*spec.config, spec.seed, spec.scale));
  }
  return std::make_shared<const format::ModelWeights>(format::MakeRandomModel(
      format::PresetConfig(spec.preset.value_or("")), spec.seed, spec.scale));
}

std::optional<format::Tokenizer> LoadTokenizerFor(const ModelSpec& spec, int64_t vocab_size) {
  if (spec.path) {
    std::optional<format::Tokenizer> tokenizer = format::Tokenizer::LoadFromModelDir(*spec.path);
    if (tokenizer) tokenizer->CheckFitsVocabulary(vocab_size, spec.path->string());
    return tokenizer;
  }
  if (spec.llama2c && spec.llama2c->tokenizer) {
    return format::Tokenizer::ReadLlama2c(*spec.llama2c->tokenizer, vocab_size);
  }
  return std::nullopt;
}

std::string MissingModelData(const ModelSpec& spec) {
  if (spec.path) {
    if (!std::filesystem::is_regular_file(*spec.path / "config.json")) {
      return fmt::format("model data not found: {} has no config.json", spec.path->string());
    }
  } else if (spec.llama2c) {
    std::vector<std::filesystem::path> files = {spec.llama2c->checkpoint};
    if (spec.llama2c->tokenizer) files.push_back(*spec.llama2c->tokenizer);
    for (const auto& f : files) {
      if (!std::filesystem::is_regular_file(f)) {
        return fmt::format(
            "model data not found: {} (the llama2.c model is read from outside the repository; "
            "set it up to run this set)",
            f.string());
      }
    }
  }
  return "";
}

std::vector<std::filesystem::path> ModelDataFiles(const ModelSpec& spec) {
  std::vector<std::filesystem::path> files;
  if (spec.path) {
    files.push_back(*spec.path / "config.json");
    for (const auto& f : format::InspectModel(*spec.path).safetensors_files) files.push_back(f);
  } else if (spec.llama2c) {
    files.push_back(spec.llama2c->checkpoint);
    if (spec.llama2c->tokenizer) files.push_back(*spec.llama2c->tokenizer);
  }
  return files;
}

std::string DescribeModel(const format::LlamaConfig& c) {
  return fmt::format(
      "{} layers, hidden {}, {}/{} heads (head_dim {}), intermediate {}, vocab {}, {} "
      "positions{}{}{}",
      c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
      c.intermediate_size, c.vocab_size, c.max_position_embeddings,
      c.tie_word_embeddings ? ", tied head" : "",
      c.rope_scaling ? fmt::format(", llama3 rope scaling x{}", c.rope_scaling->factor) : "",
      c.Windowed() ? fmt::format(", sliding window {}", c.sliding_window) : "");
}

}  // namespace kvdiff::harness
