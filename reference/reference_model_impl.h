// ReferenceModel's inside, shared by the files of reference/ only: this header includes LibTorch.
// Its weights as tensors and the declarations of its methods, which two files define:
// llama_layers.cc (LlamaModel and the blocks it runs, modeling_llama.py's LlamaRMSNorm to
// LlamaDecoderLayer) and reference_model.cc (LlamaForCausalLM: construction, the checks, lm_head,
// Forward, ForwardBatch).
#pragma once

#include <ATen/ATen.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "format/model_files.h"
#include "format/tensor.h"
#include "reference/attention_mask.h"
#include "reference/dynamic_cache_impl.h"
#include "reference/padded_batch.h"
#include "reference/reference_model.h"

namespace kvdiff::ref {

struct LayerWeights {
  at::Tensor input_layernorm;           // [hidden]
  at::Tensor q_proj, k_proj, v_proj;    // [nh*d, hidden], [nkv*d, hidden], [nkv*d, hidden]
  at::Tensor o_proj;                    // [hidden, nh*d]
  at::Tensor post_attention_layernorm;  // [hidden]
  at::Tensor gate_proj, up_proj;        // [intermediate, hidden]
  at::Tensor down_proj;                 // [hidden, intermediate]
};

struct ReferenceModel::Impl {
  std::shared_ptr<const format::ModelWeights> weights;  // owns the memory `ref` tensors alias
  format::LlamaConfig config;
  Precision precision;
  at::ScalarType dtype;   // the model dtype: float32 (ref) or float64 (ref64)
  at::ScalarType upcast;  // RMSNorm variance, RoPE tables, softmax
  int threads;

  at::Tensor embed_tokens;  // [vocab, hidden]
  std::vector<LayerWeights> layers;
  at::Tensor norm;      // [hidden]
  at::Tensor lm_head;   // [vocab, hidden]; the embedding matrix itself when tied
  at::Tensor inv_freq;  // [d/2] in `upcast`

  // Construction (reference_model.cc).
  at::Tensor Weight(const std::string& name) const;
  at::Tensor WrapTensor(const format::Tensor& t, const std::string& name) const;
  void CheckShapes() const;

  // LlamaModel and its blocks (llama_layers.cc).
  std::pair<at::Tensor, at::Tensor> RotaryEmbedding(const at::Tensor& position_ids) const;
  at::Tensor RmsNorm(const at::Tensor& hidden_states, const at::Tensor& weight) const;
  static at::Tensor RotateHalf(const at::Tensor& x);
  static std::pair<at::Tensor, at::Tensor> ApplyRotaryPosEmb(const at::Tensor& q,
                                                             const at::Tensor& k, at::Tensor cos,
                                                             at::Tensor sin);
  static at::Tensor RepeatKv(const at::Tensor& hidden_states, int64_t n_rep);
  at::Tensor EagerAttention(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                            const CausalMask& mask) const;
  at::Tensor AttendRows(const at::Tensor& query, const at::Tensor& key_states,
                        const at::Tensor& value_states, const at::Tensor& attention_mask) const;
  static at::Tensor Linear(const at::Tensor& x, const at::Tensor& weight);
  at::Tensor Attention(const at::Tensor& hidden_states, const LayerWeights& w,
                       const std::pair<at::Tensor, at::Tensor>& position_embeddings,
                       const CausalMask& attention_mask, DynamicCache::Impl* past_key_value,
                       size_t layer_idx) const;
  at::Tensor Mlp(const at::Tensor& x, const LayerWeights& w) const;
  at::Tensor DecoderLayer(const at::Tensor& hidden_states_in, size_t layer_idx,
                          const std::pair<at::Tensor, at::Tensor>& position_embeddings,
                          const CausalMask& attention_mask, DynamicCache::Impl* past_key_value,
                          ForwardTrace* trace) const;
  at::Tensor LlamaModel(const at::Tensor& input_ids, at::Tensor position_ids,
                        const at::Tensor& attention_mask, const at::Tensor& padded_inputs,
                        DynamicCache::Impl* past_key_values, ForwardTrace* trace) const;

  // LlamaForCausalLM: lm_head, the checks, the forwards (reference_model.cc).
  Logits LogitsOf(const at::Tensor& hidden_states) const;
  void CheckTokens(const Tokens& tokens, int64_t past_seen_tokens) const;
  void CheckCacheBelongs(const DynamicCache::Impl& cache) const;
  void UseThreads() const;
  Logits Forward(const Tokens& tokens, DynamicCache::Impl* past_key_values,
                 ForwardTrace* trace) const;
  void CheckBatch(const std::vector<BatchRow>& rows, const std::vector<BatchPart>& parts) const;
  std::vector<Logits> ForwardBatch(const std::vector<BatchRow>& rows,
                                   const std::vector<BatchPart>& parts,
                                   BatchPositions positions) const;
  static void RollBack(DynamicCache::Impl& cache, int64_t length);
};

}  // namespace kvdiff::ref
