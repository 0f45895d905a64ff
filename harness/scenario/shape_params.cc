#include "harness/scenario/shape_params.h"

#include <fmt/format.h>

namespace kvdiff::harness {

std::string AttentionKind(const format::LlamaConfig& c) {
  if (c.num_key_value_heads == c.num_attention_heads) return "MHA";
  if (c.num_key_value_heads == 1) return "MQA";
  return fmt::format("GQA n_rep={}", c.NumRep());
}

std::string ShapeParams(const format::LlamaConfig& c) {
  std::string out = fmt::format(
      "layers={}, heads={}/{}kv, head_dim={}, hidden={}, ffn={}, vocab={}, ctx={}, theta={}, "
      "eps={}, {}",
      c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.hidden_size,
      c.intermediate_size, c.vocab_size, c.max_position_embeddings, c.rope_theta, c.rms_norm_eps,
      c.tie_word_embeddings ? "tied" : "untied");
  if (c.rope_scaling) {
    const format::RopeScaling& s = *c.rope_scaling;
    out += fmt::format(", llama3(factor={}, low={}, high={}, orig={})", s.factor, s.low_freq_factor,
                       s.high_freq_factor, s.original_max_position_embeddings);
  }
  return out;
}

}  // namespace kvdiff::harness
