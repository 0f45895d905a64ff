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

// Presets: "tiny", "tiny-swa" (tiny with a sliding window of 32) and "smollm2-135m". Throws
// InputError listing the known names.
LlamaConfig PresetConfig(const std::string& preset);
std::vector<std::string> PresetNames();
// How far a random model's numbers are pushed beyond the well-conditioned defaults, so that
// arithmetic that is right only for O(1) numbers (a softmax that does not subtract the row max, an
// RMSNorm whose float32 sum of squares overflows, a tolerance that is absolute) shows. Each factor
// multiplies one statistic of the default model; 1 leaves it as it is. In exact arithmetic the
// activation factor changes nothing (every block reads RMSNorm(x), which does not depend on x's
// scale, eps aside), so it tests only how the arithmetic copes with large hidden states.
//
// `scores` scales the scores of the first kDemandingScoreLayers layers only, to the standard
// deviation of a shallow model (4) times the factor whatever the depth; deeper layers keep the
// default, depth-tempered scores. Peaked attention in every layer makes a deep random network
// chaotic: float32 rounding is amplified layer after layer, until two correct float32 engines
// disagree by 10% of max |logit| at 30 layers (docs: "The demanding part", measured by the
// demanding_depth program), while what large scores are there to test (a float32 exp that
// overflows, a softmax without the max) needs them in one layer, not in thirty.
inline constexpr int64_t kDemandingScoreLayers = 2;
struct RandomModelScale {
  double scores = 1;       // attention scores q.k/sqrt(d) of the first kDemandingScoreLayers
                           // layers: standard deviation 4 x scores (when not 1)
  double activations = 1;  // the residual stream (the hidden state between norms) x activations
  double logits = 1;       // the logits x logits

  // "demanding": scores x25 (std 100 on tiny: max |score| in the hundreds, past float32 exp's
  // overflow at 88.7), activations x1e19 (hidden states ~1e19: a float32 sum of their squares
  // overflows, beyond 3.4e38), logits x300 (in the thousands). Measured in model_files_test.cc.
  static RandomModelScale Demanding();
  bool IsDefault() const { return scores == 1 && activations == 1 && logits == 1; }
  bool operator==(const RandomModelScale& o) const {
    return scores == o.scores && activations == o.activations && logits == o.logits;
  }
  bool operator!=(const RandomModelScale& o) const { return !(*this == o); }
  // "demanding", "default", or "scores=25,activations=1e+19,logits=300" (the factors that are not
  // 1); ParseRandomModelScale reads each back to the same scale.
  std::string ToString() const;
};
// "default", "demanding", or comma-separated factors "scores=25,activations=1e19,logits=300" (any
// subset, each once, a finite number > 0; scores, activations and logits at most 1e30). InputError
// naming `what` (e.g. "--scale") and the offending part otherwise.
RandomModelScale ParseRandomModelScale(const std::string& text, const std::string& what);
// The same checks on a scale built in code (or parsed from JSON); InputError naming `what`.
void ValidateRandomModelScale(const RandomModelScale& scale, const std::string& what);

// Random weights from a seed with kvdiff's own PRNG (format/prng.h): identical on every
// platform. Scaled so that logits have a standard deviation of about 3 and attention scores of
// about 4 (see random_model.cc for the reasoning), each times `scale`'s factor. The same PRNG draws
// are used whatever the scale: a scaled model is the default one with some tensors multiplied.
ModelWeights MakeRandomModel(const LlamaConfig& config, uint64_t seed,
                             const RandomModelScale& scale = {});

}  // namespace kvdiff::format
