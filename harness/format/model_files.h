// A model on disk (config.json + model.safetensors, HF Llama names) and in memory, presets, and the
// deterministic random-weight generator behind `kvdiff make-model`.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "harness/format/config.h"
#include "harness/format/safetensors.h"

namespace kvdiff::format {

struct Tensor {
  std::vector<int64_t> shape;
  std::vector<float> data;  // row-major; weights are (out_features, in_features)
};

// Every tensor name and shape a checkpoint with this config must hold, in checkpoint order:
// model.embed_tokens.weight, model.layers.{i}.{input_layernorm, self_attn.{q,k,v,o}_proj,
// post_attention_layernorm, mlp.{gate,up,down}_proj}.weight, model.norm.weight, and
// lm_head.weight unless tie_word_embeddings.
struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
};
std::vector<TensorSpec> ExpectedTensors(const LlamaConfig& config);

struct ModelWeights {
  LlamaConfig config;
  std::map<std::string, Tensor> tensors;
  DType dtype_on_disk = DType::kF32;
  const Tensor& Get(const std::string& name) const;  // throws InputError when absent
  // lm_head.weight, or the embedding matrix when the head is tied.
  const Tensor& LmHead() const;
  int64_t NumParameters() const;  // tied embeddings counted once
};

// Loads DIR/config.json and DIR/model.safetensors; every tensor validated against the config
// (missing, unexpected, wrong shape: InputError naming the tensor, expected and actual).
ModelWeights LoadModel(const std::filesystem::path& dir);
// Writes DIR/config.json and DIR/model.safetensors (creating DIR).
void SaveModel(const std::filesystem::path& dir, const ModelWeights& model, DType dtype);

// Presets: "tiny" and "smollm2-135m". Throws InputError listing the known names.
LlamaConfig PresetConfig(const std::string& preset);
std::vector<std::string> PresetNames();
// Random weights from a seed with kvdiff's own PRNG: identical on every platform.
ModelWeights MakeRandomModel(const LlamaConfig& config, uint64_t seed);

}  // namespace kvdiff::format
