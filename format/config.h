// config.json of a HuggingFace Llama checkpoint, as a plain struct.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

namespace kvdiff::format {

// rope_scaling {"rope_type": "llama3", ...}; any other type is refused when parsing.
struct RopeScaling {
  std::string type = "llama3";
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

// Bounds past which a config is refused with the field named, before anything is allocated. The
// largest Llama checkpoints stay far below them: 126 layers (Llama 3.1 405B), 131072 positions.
inline constexpr int64_t kMaxLayers = 1024;                 // num_hidden_layers
inline constexpr int64_t kMaxPositions = int64_t{1} << 20;  // max_position_embeddings (1048576)

struct LlamaConfig {
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;  // explicit in config.json, or hidden_size / num_attention_heads
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;
  double rope_theta = 10000.0;
  std::optional<RopeScaling> rope_scaling;
  double rms_norm_eps = 1e-5;
  bool tie_word_embeddings = false;
  int64_t bos_token_id = 1;             // -1 when config.json has null
  int64_t eos_token_id = 2;             // the first id when config.json lists several; -1 when null
  std::string torch_dtype = "float32";  // "float32", "bfloat16", "float16" or "float64"
  // Sliding-window attention in every layer (HF Mistral's key): the query at position p sees the
  // keys at positions j with p - W < j <= p (W keys, itself included), as transformers' sliding
  // window mask and llama.cpp's LLAMA_SWA_TYPE_STANDARD. 0: none (full causal attention).
  int64_t sliding_window = 0;

  int64_t QDim() const { return num_attention_heads * head_dim; }
  int64_t KvDim() const { return num_key_value_heads * head_dim; }
  int64_t NumRep() const { return num_attention_heads / num_key_value_heads; }
  bool Windowed() const { return sliding_window > 0; }

  // Throws InputError naming the field when the shape is impossible.
  void Validate() const;
};

// Parses the text of a config.json. Missing optional fields take transformers' LlamaConfig
// defaults (num_key_value_heads = num_attention_heads, rope_theta 10000, rms_norm_eps 1e-6,
// tie_word_embeddings false, bos 1, eos 2, torch_dtype float32); unknown keys are ignored, since
// real configs carry many (architectures, attention_bias, ...). rope_scaling of type "default" is
// the unscaled rotary embedding, same as null. sliding_window: an integer, or null/absent for
// none; Qwen2's "use_sliding_window": false means none whatever sliding_window says; model_type
// "mistral" (Llama with a window) is accepted besides "llama". Throws InputError (naming the field)
// on bad JSON, a missing or ill-typed field, an unsupported rope_scaling, or a config that fails
// Validate().
LlamaConfig ParseConfig(const std::string& json_text);
LlamaConfig LoadConfig(const std::filesystem::path& config_json);
// ParseConfig for a config written by hand, such as a scenario's inline "model": {"config": ...}:
// every key (and every key of rope_scaling) must be one ParseConfig reads or ConfigToJson writes,
// so a misspelt field is refused instead of silently taking its default. Messages name the
// document `source` where ParseConfig's say config.json ("model.config field \"head_dim\": ...").
LlamaConfig ParseConfigStrict(const std::string& json_text, const std::string& source);
// The config.json text for a config (stable key order, so files are byte-identical across runs).
std::string ConfigToJson(const LlamaConfig& config);

}  // namespace kvdiff::format
