// A model on disk (config.json + model.safetensors, HF Llama names) and in memory, presets, and the
// deterministic random-weight generator behind `kvdiff make-model`.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "format/config.h"
#include "format/safetensors.h"

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

// Loads DIR/config.json and DIR/model.safetensors (or a sharded checkpoint:
// model.safetensors.index.json and the shards it names); every tensor validated against the config
// (missing, unexpected, wrong shape: InputError naming the tensor, expected and actual).
// Like transformers, a tied checkpoint that still carries lm_head.weight loads (the copy is
// ignored: the head is the embedding), and saved rotary_emb.inv_freq buffers are ignored.
ModelWeights LoadModel(const std::filesystem::path& dir);

// What `kvdiff info` shows: the same validation as LoadModel, from the headers alone (no tensor
// data is converted, so it is fast on any model size).
struct ModelFileInfo {
  LlamaConfig config;
  std::vector<std::filesystem::path> safetensors_files;  // one, or the shards
  uint64_t file_bytes = 0;                               // all safetensors files on disk
  std::map<std::string, int64_t> tensors_by_dtype;       // "BF16" -> number of tensors
  int64_t num_tensors = 0;                               // tensors used (ignored ones excluded)
  int64_t num_parameters = 0;                            // tied embeddings counted once
  std::vector<std::string> ignored_tensors;              // present on disk but unused
};
ModelFileInfo InspectModel(const std::filesystem::path& dir);
// Writes DIR/config.json and DIR/model.safetensors (creating DIR), each atomically. config.json's
// torch_dtype is set to match `dtype`; the tensors must match ExpectedTensors(model.config).
void SaveModel(const std::filesystem::path& dir, const ModelWeights& model, DType dtype);

// Presets: "tiny" and "smollm2-135m". Throws InputError listing the known names.
LlamaConfig PresetConfig(const std::string& preset);
std::vector<std::string> PresetNames();
// Random weights from a seed with kvdiff's own PRNG (format/prng.h): identical on every
// platform. Scaled so that logits have a standard deviation of about 3 and attention scores of
// about 4 (see model_files.cc for the reasoning).
ModelWeights MakeRandomModel(const LlamaConfig& config, uint64_t seed);

}  // namespace kvdiff::format
