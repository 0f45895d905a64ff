// A scenario's model spec (harness/scenario/scenario.h's ModelSpec) made real: the weights, the
// tokenizer and the config it names, the files it reads, and the shape as text. Every command that
// takes a model (run, check, golden, repro, conform, bench) goes through here.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "format/config.h"
#include "format/model_files.h"
#include "format/tokenizer.h"
#include "harness/scenario/scenario.h"

namespace kvdiff::harness {

// The config of a spec without loading its weights where it can: config.json's (validated), the
// inline config, the preset's; a llama2.c checkpoint is read whole (its config is inside it).
format::LlamaConfig ConfigFor(const ModelSpec& spec);
// The model of a spec: format::LoadModel(path), MakeRandomModel(PresetConfig(preset), seed),
// MakeRandomModel(config, seed), or a llama2.c checkpoint converted in memory
// (format::ReadLlama2cCheckpoint). InputError naming the
// missing file when the model's data is absent.
std::shared_ptr<const format::ModelWeights> LoadModelFor(const ModelSpec& spec);
// The model's tokenizer: tokenizer.kvdiff.json of a directory, or a llama2c spec's tokenizer.bin
// read for vocab_size tokens. nullopt for a preset or a model without one.
std::optional<format::Tokenizer> LoadTokenizerFor(const ModelSpec& spec, int64_t vocab_size);
// "" when every file the spec reads is present; else "model data not found: FILE ..." (golden sets
// are skipped, not failed, where the shared data is absent).
std::string MissingModelData(const ModelSpec& spec);
// The files the model is read from, for recording their hashes: config.json and the safetensors
// files of a directory; the checkpoint and tokenizer of a llama2c model; none for a preset.
std::vector<std::filesystem::path> ModelDataFiles(const ModelSpec& spec);
// "2 layers, hidden 64, 4/2 heads (head_dim 16), intermediate 172, vocab 256, 2048 positions",
// then ", tied head" and ", llama3 rope scaling x8" when they apply
std::string DescribeModel(const format::LlamaConfig& config);

}  // namespace kvdiff::harness
