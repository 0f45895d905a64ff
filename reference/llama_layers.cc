// LlamaModel and the blocks it runs, each named after its twin in modeling_llama.py:
// LlamaRotaryEmbedding, LlamaRMSNorm, rotate_half, apply_rotary_pos_emb, repeat_kv,
// eager_attention_forward, LlamaAttention, LlamaMLP, LlamaDecoderLayer, LlamaModel; and Linear,
// nn.Linear's product. They are ReferenceModel::Impl's methods (reference_model_impl.h);
// LlamaForCausalLM around them (lm_head, the checks, the forwards) is reference_model.cc. Only ATen
// ops, in the order and dtypes Python uses. Shapes as at the top of reference_model.cc.
#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <tuple>
#include <utility>
#include <vector>

#include "reference/attention_mask.h"
#include "reference/dynamic_cache_impl.h"
#include "reference/reference_model_impl.h"
#include "reference/torch_glue.h"

namespace kvdiff::ref {

using at::Tensor;

// LlamaRotaryEmbedding.forward(x, position_ids) -> cos, sin [B, s, d] in the model dtype.
std::pair<Tensor, Tensor> ReferenceModel::Impl::RotaryEmbedding(
    const Tensor& position_ids /*[B, s] long*/) const {
  Tensor inv_freq_expanded =
      inv_freq.index({at::indexing::None, at::indexing::Slice(), at::indexing::None})
          .to(upcast)
          .expand({position_ids.size(0), -1, 1});  // [B, d/2, 1]
  Tensor position_ids_expanded =
      position_ids.index({at::indexing::Slice(), at::indexing::None, at::indexing::Slice()})
          .to(upcast);                                                                  // [B, 1, s]
  Tensor freqs = at::matmul(inv_freq_expanded, position_ids_expanded).transpose(1, 2);  // [B,s,d/2]
  Tensor emb = at::cat({freqs, freqs}, -1);                                             // [B, s, d]
  // attention_scaling is 1.0 for the default and llama3 rope types: no multiply needed.
  return {emb.cos().to(dtype), emb.sin().to(dtype)};
}

// LlamaRMSNorm: variance in float32 (eps inside the root), cast back, weight last.
Tensor ReferenceModel::Impl::RmsNorm(const Tensor& hidden_states, const Tensor& weight) const {
  const at::ScalarType input_dtype = hidden_states.scalar_type();
  Tensor h = hidden_states.to(upcast);
  Tensor variance = h.pow(2).mean(-1, /*keepdim=*/true);
  h = h * at::rsqrt(variance + config.rms_norm_eps);
  return weight * h.to(input_dtype);
}

Tensor ReferenceModel::Impl::RotateHalf(const Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  Tensor x1 = x.narrow(-1, 0, half);
  Tensor x2 = x.narrow(-1, half, x.size(-1) - half);
  return at::cat({-x2, x1}, -1);
}

// apply_rotary_pos_emb with unsqueeze_dim=1: cos/sin [B, s, d] -> [B, 1, s, d].
std::pair<Tensor, Tensor> ReferenceModel::Impl::ApplyRotaryPosEmb(const Tensor& q, const Tensor& k,
                                                                  Tensor cos, Tensor sin) {
  cos = cos.unsqueeze(1);
  sin = sin.unsqueeze(1);
  Tensor q_embed = (q * cos) + (RotateHalf(q) * sin);
  Tensor k_embed = (k * cos) + (RotateHalf(k) * sin);
  return {q_embed, k_embed};
}

// repeat_kv: [B, nkv, L, d] -> [B, nkv*n_rep, L, d]; query head h reads KV head h / n_rep.
Tensor ReferenceModel::Impl::RepeatKv(const Tensor& hidden_states, int64_t n_rep) {
  if (n_rep == 1) return hidden_states;
  const int64_t batch = hidden_states.size(0), nkv = hidden_states.size(1),
                slen = hidden_states.size(2), head_dim = hidden_states.size(3);
  return hidden_states.unsqueeze(2)
      .expand({batch, nkv, n_rep, slen, head_dim})
      .reshape({batch, nkv * n_rep, slen, head_dim});
}

// eager_attention_forward: scores in the model dtype, softmax in float32, cast back. A mask
// built per block (CausalMask) takes the queries a block of kWholeMaskEntries at a time.
Tensor ReferenceModel::Impl::EagerAttention(const Tensor& query, const Tensor& key,
                                            const Tensor& value, const CausalMask& mask) const {
  const int64_t n_rep = config.NumRep();
  Tensor key_states = RepeatKv(key, n_rep);
  Tensor value_states = RepeatKv(value, n_rep);
  Tensor attn_output;  // [B, nh, s, d]
  if (mask.whole.defined()) {
    attn_output = AttendRows(query, key_states, value_states, mask.whole);
  } else {
    const int64_t s = query.size(2);
    const int64_t block = std::max<int64_t>(1, kWholeMaskEntries / mask.target_length);
    std::vector<Tensor> blocks;
    for (int64_t start = 0; start < s; start += block) {
      const int64_t n = std::min(block, s - start);
      blocks.push_back(AttendRows(query.narrow(2, start, n), key_states, value_states,
                                  mask.Rows(start, n, query.size(0))));
    }
    attn_output = at::cat(blocks, 2);
  }
  return attn_output.transpose(1, 2).contiguous();  // [B, s, nh, d]
}

// Softmax(q k^T * scaling + mask) v for the queries of `query` ([B, nh, n, d]) and the rows of
// the mask that belong to them ([B, 1, n, >= keys]).
Tensor ReferenceModel::Impl::AttendRows(const Tensor& query, const Tensor& key_states,
                                        const Tensor& value_states,
                                        const Tensor& attention_mask) const {
  const double scaling = std::pow(static_cast<double>(config.head_dim), -0.5);
  Tensor attn_weights = at::matmul(query, key_states.transpose(2, 3)) * scaling;
  Tensor causal_mask = attention_mask.narrow(-1, 0, key_states.size(-2));
  attn_weights = attn_weights + causal_mask;
  attn_weights = at::softmax(attn_weights, -1, upcast).to(query.scalar_type());
  return at::matmul(attn_weights, value_states);  // [B, nh, n, d]
}

// at::linear, except that a single row goes through a matrix-vector product. For every call
// OpenBLAS's sgemm first packs the whole weight, which for one row (a decode step) costs more
// than the product: lm_head of the smollm2-135m shape takes 12.9 ms by at::linear and 3.7 ms
// by at::mv, one thread. The sums are the same; their rounding may differ in the last bit, as
// between any two BLAS kernels.
Tensor ReferenceModel::Impl::Linear(const Tensor& x, const Tensor& weight) {
  if (x.numel() != x.size(-1)) return at::linear(x, weight);
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = weight.size(0);
  return at::mv(weight, x.reshape({-1})).view(shape);
}

// LlamaAttention.forward
Tensor ReferenceModel::Impl::Attention(const Tensor& hidden_states, const LayerWeights& w,
                                       const std::pair<Tensor, Tensor>& position_embeddings,
                                       const CausalMask& attention_mask,
                                       DynamicCache::Impl* past_key_value, size_t layer_idx) const {
  const int64_t b = hidden_states.size(0), s = hidden_states.size(1);
  const std::vector<int64_t> hidden_shape = {b, s, -1, config.head_dim};
  Tensor query_states = Linear(hidden_states, w.q_proj).view(hidden_shape).transpose(1, 2);
  Tensor key_states = Linear(hidden_states, w.k_proj).view(hidden_shape).transpose(1, 2);
  Tensor value_states = Linear(hidden_states, w.v_proj).view(hidden_shape).transpose(1, 2);

  auto [q, k] = ApplyRotaryPosEmb(query_states, key_states, position_embeddings.first,
                                  position_embeddings.second);
  Tensor v = value_states;
  if (past_key_value != nullptr) std::tie(k, v) = past_key_value->Update(k, v, layer_idx);

  Tensor attn_output = EagerAttention(q, k, v, attention_mask);
  attn_output = attn_output.reshape({b, s, -1}).contiguous();
  return Linear(attn_output, w.o_proj);
}

// LlamaMLP: down(silu(gate(x)) * up(x))
Tensor ReferenceModel::Impl::Mlp(const Tensor& x, const LayerWeights& w) const {
  return Linear(at::silu(Linear(x, w.gate_proj)) * Linear(x, w.up_proj), w.down_proj);
}

// LlamaDecoderLayer.forward
Tensor ReferenceModel::Impl::DecoderLayer(const Tensor& hidden_states_in, size_t layer_idx,
                                          const std::pair<Tensor, Tensor>& position_embeddings,
                                          const CausalMask& attention_mask,
                                          DynamicCache::Impl* past_key_value,
                                          ForwardTrace* trace) const {
  const LayerWeights& w = layers[layer_idx];
  Tensor residual = hidden_states_in;
  Tensor hidden_states = RmsNorm(hidden_states_in, w.input_layernorm);
  hidden_states =
      Attention(hidden_states, w, position_embeddings, attention_mask, past_key_value, layer_idx);
  hidden_states = residual + hidden_states;
  if (trace != nullptr) trace->layers[layer_idx].after_attention = ToRowMatrix(hidden_states);

  residual = hidden_states;
  hidden_states = RmsNorm(hidden_states, w.post_attention_layernorm);
  hidden_states = Mlp(hidden_states, w);
  hidden_states = residual + hidden_states;
  if (trace != nullptr) trace->layers[layer_idx].after_mlp = ToRowMatrix(hidden_states);
  return hidden_states;
}

// LlamaModel.forward, then LlamaForCausalLM's final norm: hidden states [B, s, hidden].
// position_ids undefined: LlamaModel's fallback, cache_position for every row. attention_mask
// (2-D, [B, P+s]) undefined: nothing is padded. padded_inputs [B, s, 1] (or undefined): the
// input columns that are padding.
Tensor ReferenceModel::Impl::LlamaModel(const Tensor& input_ids, Tensor position_ids,
                                        const Tensor& attention_mask, const Tensor& padded_inputs,
                                        DynamicCache::Impl* past_key_values,
                                        ForwardTrace* trace) const {
  const int64_t batch_size = input_ids.size(0), s = input_ids.size(1);
  const int64_t past_seen_tokens = past_key_values ? past_key_values->SeqLength() : 0;
  Tensor inputs_embeds = at::embedding(embed_tokens, input_ids);  // [B, s, hidden]
  Tensor cache_position = at::arange(past_seen_tokens, past_seen_tokens + s, at::kLong);
  if (!position_ids.defined()) position_ids = cache_position.unsqueeze(0);
  // Without a 2-D mask transformers sizes a DynamicCache's mask one past the keys; the
  // attention narrows it to the keys.
  const int64_t target_length =
      attention_mask.defined() ? attention_mask.size(-1) : past_seen_tokens + s + 1;
  CausalMask causal_mask{Tensor(), cache_position, target_length, dtype,
                         config.Windowed() ? config.sliding_window : 0};
  if (attention_mask.defined() || s * target_length <= kWholeMaskEntries) {
    causal_mask.whole = Prepare4dCausalAttentionMask(attention_mask, s, target_length, dtype,
                                                     cache_position, batch_size);
    if (config.Windowed()) {
      // Each key column's position: its count among the row's real columns (padding counts
      // none), or its column when nothing is padded.
      const Tensor key_positions = attention_mask.defined()
                                       ? attention_mask.cumsum(-1) - 1
                                       : at::arange(target_length, at::kLong).unsqueeze(0);
      causal_mask.whole =
          ApplySlidingWindow(causal_mask.whole, key_positions, position_ids, config.sliding_window);
    }
  }
  Tensor hidden_states = inputs_embeds;
  const std::pair<Tensor, Tensor> position_embeddings = RotaryEmbedding(position_ids);
  for (size_t l = 0; l < layers.size(); ++l) {
    // Padded inputs are held at zero, so their K/V are exactly 0 (RMSNorm and the projections
    // map 0 to 0). transformers lets them compute freely, which gives a real row the same
    // result as long as they stay finite; held at zero, a padded key can never bring an
    // overflow into a real row (its score inf, or its weight 0 times an inf value: NaN).
    if (padded_inputs.defined()) hidden_states = hidden_states.masked_fill(padded_inputs, 0);
    hidden_states =
        DecoderLayer(hidden_states, l, position_embeddings, causal_mask, past_key_values, trace);
  }
  return RmsNorm(hidden_states, norm);
}

}  // namespace kvdiff::ref
