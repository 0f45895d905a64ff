// The LibTorch reference: HuggingFace transformers' LlamaForCausalLM (eager attention) re-read
// block by block. Names follow modeling_llama.py (LlamaRMSNorm, LlamaRotaryEmbedding, rotate_half,
// apply_rotary_pos_emb, repeat_kv, eager_attention_forward, LlamaMLP, LlamaDecoderLayer,
// LlamaModel, LlamaForCausalLM) and cache_utils.py (DynamicCache), so a reader can check each
// function against its Python twin. Only ATen ops are used, in the order and dtypes Python uses,
// including the scalar-on-the-left operators (`1.0 / t` is `t.reciprocal() * 1.0` in PyTorch).
// This file is LlamaForCausalLM around LlamaModel: construction from the weights, the checks of
// a call's input, lm_head, Forward, ForwardBatch, Shift. Beside it: llama_layers.cc (LlamaModel
// and its blocks, LlamaRotaryEmbedding to LlamaDecoderLayer), reference_model_impl.h (the model's
// weights and the methods those two files define), dynamic_cache_impl.h (cache_utils.py),
// rope_utils.cc (modeling_rope_utils.py), attention_mask.cc (the 4-D mask, position_ids from a
// 2-D mask) and padded_batch.cc (a batch of conversations as a transformers user pads it).
//
// Shapes (B = 1 for one conversation, the padded batch's rows for ForwardBatch): hidden
// [B, s, hidden]; q [B, nh, s, d]; k, v [B, nkv, s, d]; cached K/V [B, nkv, P, d]; scores
// [B, nh, s, P+s]; mask [B, 1, s, P+s+1] (one conversation) or [B, 1, s, P+s] (a padded batch);
// logits [1, s, vocab] (one conversation) or [1, rows asked for, vocab] (a batch).
#include "reference/reference_model.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <fmt/format.h>

#include <cstdint>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "format/error.h"
#include "reference/attention_mask.h"
#include "reference/dynamic_cache_impl.h"
#include "reference/padded_batch.h"
#include "reference/reference_model_impl.h"
#include "reference/rope_utils.h"
#include "reference/shared_double_weights.h"
#include "reference/torch_glue.h"

namespace kvdiff::ref {
namespace {

using at::Tensor;

at::ScalarType ModelDtype(Precision precision) {
  return precision == Precision::kFloat64 ? at::kDouble : at::kFloat;
}

// transformers forces float32 for the RMSNorm variance, the RoPE tables and the softmax. The
// arbiter (ref64) keeps those in double too: it must never be less precise than the model dtype.
at::ScalarType UpcastDtype(Precision precision) { return ModelDtype(precision); }

const char* PrecisionName(Precision precision) {
  return precision == Precision::kFloat64 ? "float64" : "float32";
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// The model.

// ref wraps the float weights without copying; ref64 converts each once to double.
Tensor ReferenceModel::Impl::Weight(const std::string& name) const {
  const format::Tensor& t = weights->Get(name);
  return WrapTensor(t, name);
}
Tensor ReferenceModel::Impl::WrapTensor(const format::Tensor& t, const std::string& name) const {
  int64_t count = 1;
  for (int64_t dim : t.shape) count *= dim;
  KVDIFF_CHECK(count == static_cast<int64_t>(t.data.size()),
               "reference: tensor {} has shape {} ({} values) but holds {} values", name,
               ShapeString(t.shape), count, t.data.size());
  Tensor view = at::from_blob(const_cast<float*>(t.data.data()), t.shape,
                              at::TensorOptions().dtype(at::kFloat));
  return dtype == at::kFloat ? view : SharedDoubleCopy(t);
}

void ReferenceModel::Impl::CheckShapes() const {
  for (const format::TensorSpec& spec : format::ExpectedTensors(config)) {
    const format::Tensor& t = weights->Get(spec.name);
    KVDIFF_CHECK(t.shape == spec.shape, "reference: tensor {} has shape {}, expected {}", spec.name,
                 ShapeString(t.shape), ShapeString(spec.shape));
  }
}

// lm_head's logits of [1, s, hidden] states as a float32 (s, vocab) matrix, written in place by
// Linear's own products (at::linear is at::matmul with the weight transposed): a 1024-token
// ForwardFull's logits are 200 MB on smollm2-135m, and a tensor beside its copy was twice that.
// float64 logits are rounded into it as .to(kFloat) rounds them.
Logits ReferenceModel::Impl::LogitsOf(const Tensor& hidden_states) const {
  const int64_t vocab = lm_head.size(0);
  const int64_t s = hidden_states.numel() / hidden_states.size(-1);
  Logits out(s, vocab);
  Tensor target = at::from_blob(out.data(), {s, vocab}, at::kFloat);
  if (lm_head.scalar_type() != at::kFloat) {
    target.copy_(Linear(hidden_states, lm_head).reshape({s, vocab}));
  } else if (s == 1) {
    Tensor row = target.view({vocab});
    at::mv_out(row, lm_head, hidden_states.reshape({-1}));
  } else {
    at::matmul_out(target, hidden_states.reshape({s, -1}), lm_head.t());
  }
  return out;
}

void ReferenceModel::Impl::CheckTokens(const Tokens& tokens, int64_t past_seen_tokens) const {
  // The same words as impl's checks, so a user sees one message whichever backend refused.
  KVDIFF_CHECK(!tokens.empty(), "tokens is empty (expected at least one token)");
  for (size_t i = 0; i < tokens.size(); ++i) {
    KVDIFF_CHECK(tokens[i] >= 0 && tokens[i] < config.vocab_size,
                 "token id {} at index {} is out of range for vocab_size {}", tokens[i], i,
                 config.vocab_size);
  }
  const int64_t total = past_seen_tokens + static_cast<int64_t>(tokens.size());
  KVDIFF_CHECK(total <= config.max_position_embeddings,
               "reference forward: sequence length {} ({} cached + {} new) exceeds "
               "max_position_embeddings {}",
               total, past_seen_tokens, tokens.size(), config.max_position_embeddings);
}

// A cache filled by another model (other shape or precision) would fail inside at::cat.
void ReferenceModel::Impl::CheckCacheBelongs(const DynamicCache::Impl& cache) const {
  if (cache.SeqLength() == 0) return;
  const Tensor& k = cache.key_cache[0];
  const bool fits = static_cast<int64_t>(cache.key_cache.size()) == config.num_hidden_layers &&
                    k.dim() == 4 && k.size(1) == config.num_key_value_heads &&
                    k.size(3) == config.head_dim && k.scalar_type() == dtype;
  KVDIFF_CHECK(fits,
               "reference forward: the DynamicCache holds {} layers of K {} ({}) but this model "
               "expects {} layers of [1, {}, P, {}] ({}); a cache belongs to the model that "
               "filled it",
               cache.key_cache.size(), ShapeString(k.sizes()), c10::toString(k.scalar_type()),
               config.num_hidden_layers, config.num_key_value_heads, config.head_dim,
               PrecisionName(precision));
}

// LibTorch's and OpenBLAS's thread counts are process-wide: each call sets its own.
void ReferenceModel::Impl::UseThreads() const {
  if (at::get_num_threads() != threads) at::set_num_threads(threads);
  HoldBlasThreads(threads);
}

// LlamaForCausalLM.forward(input_ids, past_key_values=cache, use_cache=cache != nullptr).
Logits ReferenceModel::Impl::Forward(const Tokens& tokens, DynamicCache::Impl* past_key_values,
                                     ForwardTrace* trace) const {
  const int64_t past_seen_tokens = past_key_values ? past_key_values->SeqLength() : 0;
  if (past_key_values != nullptr) CheckCacheBelongs(*past_key_values);
  CheckTokens(tokens, past_seen_tokens);
  UseThreads();
  if (trace != nullptr) trace->layers.assign(config.num_hidden_layers, LayerTrace{});

  c10::InferenceMode guard;
  try {
    const int64_t s = static_cast<int64_t>(tokens.size());
    std::vector<int64_t> ids(tokens.begin(), tokens.end());
    Tensor input_ids = at::tensor(ids, at::kLong).reshape({1, s});
    Tensor hidden_states =
        LlamaModel(input_ids, Tensor(), Tensor(), Tensor(), past_key_values, trace);
    // LlamaForCausalLM: logits for every position (logits_to_keep = 0).
    return LogitsOf(hidden_states);  // (s, vocab)
  } catch (const c10::Error& e) {
    // Leave the cache as it was: a failed call must not half-append K/V to some layers.
    if (past_key_values != nullptr) RollBack(*past_key_values, past_seen_tokens);
    RethrowTorchError(e, "forward");
  } catch (...) {
    if (past_key_values != nullptr) RollBack(*past_key_values, past_seen_tokens);
    throw;
  }
}

void ReferenceModel::Impl::CheckBatch(const std::vector<BatchRow>& rows,
                                      const std::vector<BatchPart>& parts) const {
  KVDIFF_CHECK(!parts.empty(), "ForwardBatch: no parts (expected at least one)");
  for (size_t i = 0; i < parts.size(); ++i) {
    KVDIFF_CHECK(rows[i].cache != nullptr && rows[i].tokens != nullptr,
                 "ForwardBatch: part {} has no cache or no tokens", i);
    for (size_t j = 0; j < i; ++j) {
      KVDIFF_CHECK(rows[j].cache != rows[i].cache, "ForwardBatch: parts {} and {} share a cache", j,
                   i);
    }
    CheckCacheBelongs(*rows[i].cache);
    CheckTokens(*rows[i].tokens, rows[i].cache->SeqLength());
    KVDIFF_CHECK(parts[i].output.empty() || parts[i].output.size() == rows[i].tokens->size(),
                 "ForwardBatch: part {} has {} output flags for {} tokens", i,
                 parts[i].output.size(), rows[i].tokens->size());
  }
}

// The padded batch (padded_batch.h) through LlamaModel; then lm_head on the rows asked for
// only (logits_to_keep given as indices: a padded row's logits would be thrown away).
std::vector<Logits> ReferenceModel::Impl::ForwardBatch(const std::vector<BatchRow>& rows,
                                                       const std::vector<BatchPart>& parts,
                                                       BatchPositions positions) const {
  CheckBatch(rows, parts);
  UseThreads();
  std::vector<int64_t> lengths;  // each cache's, to roll back to on a failure
  for (const BatchRow& row : rows) lengths.push_back(row.cache->SeqLength());

  c10::InferenceMode guard;
  try {
    PaddedBatch batch = LeftPad(rows);
    Tensor position_ids = positions == BatchPositions::kFromAttentionMask
                              ? PositionIdsFromAttentionMask(batch.attention_mask, batch.new_length)
                              : Tensor();  // None: LlamaModel falls back to cache_position
    Tensor hidden_states = LlamaModel(batch.input_ids, position_ids, batch.attention_mask,
                                      batch.padded_inputs, &batch.past, nullptr);  // [B, S, hidden]
    const std::vector<int64_t> keep = OutputRows(batch, parts);
    Logits kept(0, config.vocab_size);
    if (!keep.empty()) {
      Tensor rows_kept = hidden_states.reshape({-1, config.hidden_size})
                             .index_select(0, at::tensor(keep, at::kLong))
                             .unsqueeze(0);  // [1, kept, hidden]
      kept = LogitsOf(rows_kept);            // (kept, vocab)
    }
    AppendNewKeyValues(batch.past, batch, rows);

    return SplitByPart(kept, parts);
  } catch (const c10::Error& e) {
    for (size_t b = 0; b < rows.size(); ++b) RollBack(*rows[b].cache, lengths[b]);
    RethrowTorchError(e, "batched forward");
  } catch (...) {
    for (size_t b = 0; b < rows.size(); ++b) RollBack(*rows[b].cache, lengths[b]);
    throw;
  }
}

void ReferenceModel::Impl::RollBack(DynamicCache::Impl& cache, int64_t length) {
  if (length == 0) {
    cache.key_cache.clear();
    cache.value_cache.clear();
    return;
  }
  for (size_t l = 0; l < cache.key_cache.size(); ++l) {
    if (cache.key_cache[l].size(-2) > length) {
      cache.key_cache[l] = cache.key_cache[l].narrow(-2, 0, length);
      cache.value_cache[l] = cache.value_cache[l].narrow(-2, 0, length);
    }
  }
}

ReferenceModel::ReferenceModel(std::shared_ptr<const format::ModelWeights> weights,
                               Precision precision, int threads)
    : impl_(std::make_unique<Impl>()) {
  KVDIFF_CHECK(weights != nullptr, "ReferenceModel: weights is null");
  KVDIFF_CHECK(threads >= 0, "ReferenceModel: threads must be >= 0 (0 = every core), got {}",
               threads);
  Impl& m = *impl_;
  m.weights = std::move(weights);
  m.config = m.weights->config;
  m.config.Validate();
  if (m.config.rope_scaling) {
    KVDIFF_CHECK(m.config.rope_scaling->type == "llama3",
                 "ReferenceModel: rope_scaling type \"{}\" is not supported (only \"llama3\")",
                 m.config.rope_scaling->type);
  }
  m.precision = precision;
  m.dtype = ModelDtype(precision);
  m.upcast = UpcastDtype(precision);
  const unsigned cores = std::thread::hardware_concurrency();
  m.threads = threads > 0 ? threads : static_cast<int>(cores > 0 ? cores : 1);
  HoldBlasThreads(m.threads);
  m.CheckShapes();

  c10::InferenceMode guard;
  try {
    m.embed_tokens = m.Weight("model.embed_tokens.weight");
    for (int64_t l = 0; l < m.config.num_hidden_layers; ++l) {
      const std::string p = fmt::format("model.layers.{}.", l);
      LayerWeights w;
      w.input_layernorm = m.Weight(p + "input_layernorm.weight");
      w.q_proj = m.Weight(p + "self_attn.q_proj.weight");
      w.k_proj = m.Weight(p + "self_attn.k_proj.weight");
      w.v_proj = m.Weight(p + "self_attn.v_proj.weight");
      w.o_proj = m.Weight(p + "self_attn.o_proj.weight");
      w.post_attention_layernorm = m.Weight(p + "post_attention_layernorm.weight");
      w.gate_proj = m.Weight(p + "mlp.gate_proj.weight");
      w.up_proj = m.Weight(p + "mlp.up_proj.weight");
      w.down_proj = m.Weight(p + "mlp.down_proj.weight");
      m.layers.push_back(std::move(w));
    }
    m.norm = m.Weight("model.norm.weight");
    // Tied: lm_head.weight is the embedding Parameter itself, not a copy.
    m.lm_head = m.config.tie_word_embeddings ? m.embed_tokens : m.Weight("lm_head.weight");
    // LlamaRotaryEmbedding.__init__: rope_init_fn(config) -> inv_freq
    m.inv_freq = m.config.rope_scaling ? ComputeLlama3Parameters(m.config, m.upcast)
                                       : ComputeDefaultRopeParameters(m.config, m.upcast);
  } catch (const c10::Error& e) {
    RethrowTorchError(e, "construction");
  }
}

ReferenceModel::~ReferenceModel() = default;
ReferenceModel::ReferenceModel(ReferenceModel&&) noexcept = default;

const format::LlamaConfig& ReferenceModel::config() const { return impl_->config; }
Precision ReferenceModel::precision() const { return impl_->precision; }

Logits ReferenceModel::ForwardFull(const Tokens& tokens, ForwardTrace* trace) const {
  return impl_->Forward(tokens, nullptr, trace);
}

Logits ReferenceModel::Forward(const Tokens& tokens, DynamicCache& cache,
                               ForwardTrace* trace) const {
  return impl_->Forward(tokens, cache.impl_.get(), trace);
}

void ReferenceModel::Shift(DynamicCache& cache, int64_t keep, int64_t discard) const {
  DynamicCache::Impl& c = *cache.impl_;
  const int64_t length = c.SeqLength();
  KVDIFF_CHECK(keep >= 0 && discard >= 0 && keep <= length && discard <= length - keep,
               "ReferenceModel::Shift: keep {} and discard {} must be >= 0 with keep + discard <= "
               "{} (the cache length)",
               keep, discard, length);
  KVDIFF_CHECK(!impl_->config.Windowed(),
               "ReferenceModel::Shift: this model has a sliding window ({} positions): a "
               "sliding-window conversation cannot shift its context",
               impl_->config.sliding_window);
  if (discard == 0) return;  // nothing moves
  c10::InferenceMode guard;
  try {
    // cos, sin of the delta: [1, 1, d] in the model dtype -> [1, 1, 1, d] against [1, nkv, L, d]
    auto [cos, sin] =
        impl_->RotaryEmbedding(at::full({1, 1}, -discard, at::TensorOptions().dtype(at::kLong)));
    cos = cos.unsqueeze(1);
    sin = sin.unsqueeze(1);
    const int64_t moved = length - keep - discard;
    for (size_t l = 0; l < c.key_cache.size(); ++l) {
      const Tensor& k = c.key_cache[l];    // [1, nkv, length, d]
      const Tensor& v = c.value_cache[l];  // [1, nkv, length, d]
      Tensor k_moved = k.narrow(-2, keep + discard, moved);
      k_moved = (k_moved * cos) + (Impl::RotateHalf(k_moved) * sin);
      c.key_cache[l] = at::cat({k.narrow(-2, 0, keep), k_moved}, -2);
      c.value_cache[l] = at::cat({v.narrow(-2, 0, keep), v.narrow(-2, keep + discard, moved)}, -2);
    }
  } catch (const c10::Error& e) {
    RethrowTorchError(e, "shift");
  }
}

std::vector<Logits> ReferenceModel::ForwardBatch(const std::vector<BatchPart>& parts,
                                                 BatchPositions positions) const {
  std::vector<BatchRow> rows;
  for (const BatchPart& part : parts) {
    rows.push_back({part.cache != nullptr ? part.cache->impl_.get() : nullptr, part.tokens});
  }
  return impl_->ForwardBatch(rows, parts, positions);
}

}  // namespace kvdiff::ref
