// The LibTorch reference: HuggingFace transformers' LlamaForCausalLM (eager attention) re-read
// block by block. Names follow modeling_llama.py (LlamaRMSNorm, LlamaRotaryEmbedding, rotate_half,
// apply_rotary_pos_emb, repeat_kv, eager_attention_forward, LlamaMLP, LlamaDecoderLayer,
// LlamaModel, LlamaForCausalLM) and cache_utils.py (DynamicCache), so a reader can check each
// function against its Python twin. Only ATen ops are used, in the order and dtypes Python uses,
// including the scalar-on-the-left operators (`1.0 / t` is `t.reciprocal() * 1.0` in PyTorch).
//
// Shapes (batch is always 1): hidden [1, s, hidden]; q [1, nh, s, d]; k, v [1, nkv, s, d];
// cached K/V [1, nkv, P, d]; scores [1, nh, s, P+s]; mask [1, 1, s, P+s+1]; logits [1, s, vocab].
#include "reference/reference_model.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <dlfcn.h>
#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "format/error.h"

namespace kvdiff::ref {
namespace {

// LibTorch's GEMMs run in whatever BLAS libblas.so.3 resolves to. OpenBLAS keeps a thread pool of
// its own, sized to every core when it loads, whose workers spin after each call: it is held to
// the reference's own thread count, so a reference on one thread (kvdiff check, any --jobs) never
// wakes them to spin against kvdiff's other threads. Looked up at run time: other BLAS have no
// such call, and LibTorch is not linked against OpenBLAS, only against libblas.so.3.
void HoldBlasThreads(int threads) {
  using SetThreads = void (*)(int);
  using GetThreads = int (*)();
  static const auto set =
      reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  static const auto get =
      reinterpret_cast<GetThreads>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  if (set == nullptr || get == nullptr || get() == threads) return;
  static std::mutex mutex;  // a process-wide setting: one writer at a time
  std::lock_guard<std::mutex> lock(mutex);
  if (get() != threads) set(threads);
}

using at::Tensor;

constexpr double kPi = 3.141592653589793;  // math.pi

at::ScalarType ModelDtype(Precision precision) {
  return precision == Precision::kFloat64 ? at::kDouble : at::kFloat;
}

// transformers forces float32 for the RMSNorm variance, the RoPE tables and the softmax. The
// arbiter (ref64) keeps those in double too: it must never be less precise than the model dtype.
at::ScalarType UpcastDtype(Precision precision) { return ModelDtype(precision); }

const char* PrecisionName(Precision precision) {
  return precision == Precision::kFloat64 ? "float64" : "float32";
}

// torch.finfo(dtype).min: the additive mask value for hidden keys.
double MinOf(at::ScalarType dtype) {
  return dtype == at::kDouble ? std::numeric_limits<double>::lowest()
                              : static_cast<double>(std::numeric_limits<float>::lowest());
}

std::string ShapeString(at::IntArrayRef shape) {
  return fmt::format("[{}]", fmt::join(shape.begin(), shape.end(), ", "));
}

// [1, s, cols] (any float dtype) -> row-major float [s, cols].
RowMatrix ToRowMatrix(const Tensor& t) {
  Tensor rows = t.reshape({-1, t.size(-1)}).to(at::kFloat).contiguous();
  RowMatrix out(rows.size(0), rows.size(1));
  std::memcpy(out.data(), rows.data_ptr<float>(), sizeof(float) * rows.numel());
  return out;
}

// A LibTorch failure is never bad input (inputs are checked first); report it as ours, with the
// first line of torch's message and no C++ backtrace.
[[noreturn]] void RethrowTorchError(const c10::Error& e, const char* where) {
  std::string message = e.what_without_backtrace();
  const auto newline = message.find('\n');
  if (newline != std::string::npos) message.resize(newline);
  throw std::runtime_error(fmt::format("reference {}: LibTorch error: {}", where, message));
}

struct LayerWeights {
  Tensor input_layernorm;           // [hidden]
  Tensor q_proj, k_proj, v_proj;    // [nh*d, hidden], [nkv*d, hidden], [nkv*d, hidden]
  Tensor o_proj;                    // [hidden, nh*d]
  Tensor post_attention_layernorm;  // [hidden]
  Tensor gate_proj, up_proj;        // [intermediate, hidden]
  Tensor down_proj;                 // [hidden, intermediate]
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// DynamicCache (cache_utils.py): one K and one V tensor per layer, grown by concatenation on the
// sequence dimension (-2). Nothing here knows about positions: the model derives them from
// GetSeqLength(), which is why reusing a cache continues the old conversation.

struct DynamicCache::Impl {
  std::vector<Tensor> key_cache;    // per layer [1, nkv, P, d]
  std::vector<Tensor> value_cache;  // per layer [1, nkv, P, d]

  // get_seq_length(layer_idx=0)
  int64_t SeqLength() const {
    if (key_cache.empty() || !key_cache[0].defined() || key_cache[0].numel() == 0) return 0;
    return key_cache[0].size(-2);
  }

  // update(key_states, value_states, layer_idx): returns the whole K/V of that layer.
  std::pair<Tensor, Tensor> Update(const Tensor& key_states, const Tensor& value_states,
                                   size_t layer_idx) {
    if (key_cache.size() <= layer_idx) {
      key_cache.push_back(key_states);
      value_cache.push_back(value_states);
    } else if (key_cache[layer_idx].numel() == 0) {
      key_cache[layer_idx] = key_states;
      value_cache[layer_idx] = value_states;
    } else {
      key_cache[layer_idx] = at::cat({key_cache[layer_idx], key_states}, -2);
      value_cache[layer_idx] = at::cat({value_cache[layer_idx], value_states}, -2);
    }
    return {key_cache[layer_idx], value_cache[layer_idx]};
  }

  // crop(max_length): views of the first max_length positions, as transformers slices them.
  void CropTo(int64_t length) {
    for (size_t l = 0; l < key_cache.size(); ++l) {
      if (key_cache[l].numel() == 0) continue;
      key_cache[l] = key_cache[l].narrow(-2, 0, length);
      value_cache[l] = value_cache[l].narrow(-2, 0, length);
    }
  }
};

DynamicCache::DynamicCache() : impl_(std::make_unique<Impl>()) {}
DynamicCache::~DynamicCache() = default;
DynamicCache::DynamicCache(DynamicCache&&) noexcept = default;
DynamicCache& DynamicCache::operator=(DynamicCache&&) noexcept = default;

int64_t DynamicCache::GetSeqLength() const { return impl_->SeqLength(); }

void DynamicCache::Crop(int64_t length) {
  const int64_t current = impl_->SeqLength();
  // transformers accepts a negative length (meaning "drop that many") and ignores a length past
  // the end; both are misuse in a checked API, so they are refused here.
  KVDIFF_CHECK(length >= 0, "DynamicCache::Crop: length must be >= 0, got {}", length);
  KVDIFF_CHECK(length <= current,
               "DynamicCache::Crop: length {} is beyond the cache length {} (Crop only shortens)",
               length, current);
  c10::InferenceMode guard;
  impl_->CropTo(length);
}

void DynamicCache::Reset() {
  impl_->key_cache.clear();
  impl_->value_cache.clear();
}

DynamicCache DynamicCache::Fork() const {
  c10::InferenceMode guard;
  DynamicCache copy;
  for (size_t l = 0; l < impl_->key_cache.size(); ++l) {
    copy.impl_->key_cache.push_back(impl_->key_cache[l].clone());
    copy.impl_->value_cache.push_back(impl_->value_cache[l].clone());
  }
  return copy;
}

// ---------------------------------------------------------------------------------------------
// The model.

struct ReferenceModel::Impl {
  std::shared_ptr<const format::ModelWeights> weights;  // owns the memory `ref` tensors alias
  format::LlamaConfig config;
  Precision precision;
  at::ScalarType dtype;   // the model dtype: float32 (ref) or float64 (ref64)
  at::ScalarType upcast;  // RMSNorm variance, RoPE tables, softmax
  int threads;

  Tensor embed_tokens;  // [vocab, hidden]
  std::vector<LayerWeights> layers;
  Tensor norm;      // [hidden]
  Tensor lm_head;   // [vocab, hidden]; the embedding matrix itself when tied
  Tensor inv_freq;  // [d/2] in `upcast`

  // ref wraps the float weights without copying; ref64 converts each once to double.
  Tensor Weight(const std::string& name) const {
    const format::Tensor& t = weights->Get(name);
    return WrapTensor(t, name);
  }
  Tensor WrapTensor(const format::Tensor& t, const std::string& name) const {
    int64_t count = 1;
    for (int64_t dim : t.shape) count *= dim;
    KVDIFF_CHECK(count == static_cast<int64_t>(t.data.size()),
                 "reference: tensor {} has shape {} ({} values) but holds {} values", name,
                 ShapeString(t.shape), count, t.data.size());
    Tensor view = at::from_blob(const_cast<float*>(t.data.data()), t.shape,
                                at::TensorOptions().dtype(at::kFloat));
    return dtype == at::kFloat ? view : view.to(dtype);
  }

  void CheckShapes() const {
    for (const format::TensorSpec& spec : format::ExpectedTensors(config)) {
      const format::Tensor& t = weights->Get(spec.name);
      KVDIFF_CHECK(t.shape == spec.shape, "reference: tensor {} has shape {}, expected {}",
                   spec.name, ShapeString(t.shape), ShapeString(spec.shape));
    }
  }

  // ---- LlamaRotaryEmbedding.__init__: rope_init_fn(config) -> inv_freq ----
  // _compute_default_rope_parameters: 1.0 / (base ** (arange(0, dim, 2, int64).float() / dim))
  Tensor ComputeDefaultInvFreq() const {
    const int64_t dim = config.head_dim;
    Tensor exponent = at::arange(0, dim, 2, at::kLong).to(upcast) / dim;
    return at::pow(config.rope_theta, exponent).reciprocal() * 1.0;
  }

  // _compute_llama3_parameters: long wavelengths slowed by `factor`, short ones kept, a smooth
  // blend between; the same tensor expressions as transformers, in the same dtype.
  Tensor ComputeLlama3InvFreq() const {
    const format::RopeScaling& s = *config.rope_scaling;
    Tensor inv_freq = ComputeDefaultInvFreq();
    const double factor = s.factor;
    const double low_freq_factor = s.low_freq_factor;
    const double high_freq_factor = s.high_freq_factor;
    const double old_context_len = static_cast<double>(s.original_max_position_embeddings);
    const double low_freq_wavelen = old_context_len / low_freq_factor;
    const double high_freq_wavelen = old_context_len / high_freq_factor;

    Tensor wavelen = inv_freq.reciprocal() * (2 * kPi);  // 2 * math.pi / inv_freq
    Tensor inv_freq_llama = at::where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq);
    Tensor smooth_factor = (wavelen.reciprocal() * old_context_len - low_freq_factor) /
                           (high_freq_factor - low_freq_factor);
    Tensor smoothed_inv_freq =
        at::rsub(smooth_factor, 1) * inv_freq_llama / factor + smooth_factor * inv_freq_llama;
    Tensor is_medium_freq =
        (wavelen < high_freq_wavelen).logical_not() * (wavelen > low_freq_wavelen).logical_not();
    return at::where(is_medium_freq, smoothed_inv_freq, inv_freq_llama);
  }

  // LlamaRotaryEmbedding.forward(x, position_ids) -> cos, sin [1, s, d] in the model dtype.
  std::pair<Tensor, Tensor> RotaryEmbedding(const Tensor& position_ids /*[1, s] long*/) const {
    Tensor inv_freq_expanded =
        inv_freq.index({at::indexing::None, at::indexing::Slice(), at::indexing::None})
            .to(upcast)
            .expand({position_ids.size(0), -1, 1});  // [1, d/2, 1]
    Tensor position_ids_expanded =
        position_ids.index({at::indexing::Slice(), at::indexing::None, at::indexing::Slice()})
            .to(upcast);  // [1, 1, s]
    Tensor freqs =
        at::matmul(inv_freq_expanded, position_ids_expanded).transpose(1, 2);  // [1,s,d/2]
    Tensor emb = at::cat({freqs, freqs}, -1);                                  // [1, s, d]
    // attention_scaling is 1.0 for the default and llama3 rope types: no multiply needed.
    return {emb.cos().to(dtype), emb.sin().to(dtype)};
  }

  // LlamaRMSNorm: variance in float32 (eps inside the root), cast back, weight last.
  Tensor RmsNorm(const Tensor& hidden_states, const Tensor& weight) const {
    const at::ScalarType input_dtype = hidden_states.scalar_type();
    Tensor h = hidden_states.to(upcast);
    Tensor variance = h.pow(2).mean(-1, /*keepdim=*/true);
    h = h * at::rsqrt(variance + config.rms_norm_eps);
    return weight * h.to(input_dtype);
  }

  static Tensor RotateHalf(const Tensor& x) {
    const int64_t half = x.size(-1) / 2;
    Tensor x1 = x.narrow(-1, 0, half);
    Tensor x2 = x.narrow(-1, half, x.size(-1) - half);
    return at::cat({-x2, x1}, -1);
  }

  // apply_rotary_pos_emb with unsqueeze_dim=1: cos/sin [1, s, d] -> [1, 1, s, d].
  static std::pair<Tensor, Tensor> ApplyRotaryPosEmb(const Tensor& q, const Tensor& k, Tensor cos,
                                                     Tensor sin) {
    cos = cos.unsqueeze(1);
    sin = sin.unsqueeze(1);
    Tensor q_embed = (q * cos) + (RotateHalf(q) * sin);
    Tensor k_embed = (k * cos) + (RotateHalf(k) * sin);
    return {q_embed, k_embed};
  }

  // repeat_kv: [1, nkv, L, d] -> [1, nkv*n_rep, L, d]; query head h reads KV head h / n_rep.
  static Tensor RepeatKv(const Tensor& hidden_states, int64_t n_rep) {
    if (n_rep == 1) return hidden_states;
    const int64_t batch = hidden_states.size(0), nkv = hidden_states.size(1),
                  slen = hidden_states.size(2), head_dim = hidden_states.size(3);
    return hidden_states.unsqueeze(2)
        .expand({batch, nkv, n_rep, slen, head_dim})
        .reshape({batch, nkv * n_rep, slen, head_dim});
  }

  // LlamaModel._prepare_4d_causal_attention_mask_with_cache_position (no padding mask).
  // target_length is past_seen_tokens + s + 1 for a DynamicCache, as transformers sizes it.
  Tensor CausalMask(int64_t sequence_length, int64_t target_length,
                    const Tensor& cache_position) const {
    const double min_dtype = MinOf(dtype);
    Tensor causal_mask =
        at::full({sequence_length, target_length}, min_dtype, at::TensorOptions().dtype(dtype));
    if (sequence_length != 1) causal_mask = at::triu(causal_mask, /*diagonal=*/1);
    causal_mask *= at::arange(target_length, at::kLong) > cache_position.reshape({-1, 1});
    return causal_mask.index({at::indexing::None, at::indexing::None}).expand({1, 1, -1, -1});
  }

  // eager_attention_forward: scores in the model dtype, softmax in float32, cast back.
  Tensor EagerAttention(const Tensor& query, const Tensor& key, const Tensor& value,
                        const Tensor& attention_mask) const {
    const int64_t n_rep = config.NumRep();
    Tensor key_states = RepeatKv(key, n_rep);
    Tensor value_states = RepeatKv(value, n_rep);
    const double scaling = std::pow(static_cast<double>(config.head_dim), -0.5);
    Tensor attn_weights = at::matmul(query, key_states.transpose(2, 3)) * scaling;
    Tensor causal_mask = attention_mask.narrow(-1, 0, key_states.size(-2));
    attn_weights = attn_weights + causal_mask;
    attn_weights = at::softmax(attn_weights, -1, upcast).to(query.scalar_type());
    Tensor attn_output = at::matmul(attn_weights, value_states);  // [1, nh, s, d]
    return attn_output.transpose(1, 2).contiguous();              // [1, s, nh, d]
  }

  // at::linear, except that a single row goes through a matrix-vector product. For every call
  // OpenBLAS's sgemm first packs the whole weight, which for one row (a decode step) costs more
  // than the product: lm_head of the smollm2-135m shape takes 12.9 ms by at::linear and 3.7 ms
  // by at::mv, one thread. The sums are the same; their rounding may differ in the last bit, as
  // between any two BLAS kernels.
  static Tensor Linear(const Tensor& x, const Tensor& weight) {
    if (x.numel() != x.size(-1)) return at::linear(x, weight);
    std::vector<int64_t> shape = x.sizes().vec();
    shape.back() = weight.size(0);
    return at::mv(weight, x.reshape({-1})).view(shape);
  }

  // LlamaAttention.forward
  Tensor Attention(const Tensor& hidden_states, const LayerWeights& w,
                   const std::pair<Tensor, Tensor>& position_embeddings,
                   const Tensor& attention_mask, DynamicCache::Impl* past_key_value,
                   size_t layer_idx) const {
    const int64_t s = hidden_states.size(1);
    const std::vector<int64_t> hidden_shape = {1, s, -1, config.head_dim};
    Tensor query_states = Linear(hidden_states, w.q_proj).view(hidden_shape).transpose(1, 2);
    Tensor key_states = Linear(hidden_states, w.k_proj).view(hidden_shape).transpose(1, 2);
    Tensor value_states = Linear(hidden_states, w.v_proj).view(hidden_shape).transpose(1, 2);

    auto [q, k] = ApplyRotaryPosEmb(query_states, key_states, position_embeddings.first,
                                    position_embeddings.second);
    Tensor v = value_states;
    if (past_key_value != nullptr) std::tie(k, v) = past_key_value->Update(k, v, layer_idx);

    Tensor attn_output = EagerAttention(q, k, v, attention_mask);
    attn_output = attn_output.reshape({1, s, -1}).contiguous();
    return Linear(attn_output, w.o_proj);
  }

  // LlamaMLP: down(silu(gate(x)) * up(x))
  Tensor Mlp(const Tensor& x, const LayerWeights& w) const {
    return Linear(at::silu(Linear(x, w.gate_proj)) * Linear(x, w.up_proj), w.down_proj);
  }

  // LlamaDecoderLayer.forward
  Tensor DecoderLayer(const Tensor& hidden_states_in, size_t layer_idx,
                      const std::pair<Tensor, Tensor>& position_embeddings,
                      const Tensor& attention_mask, DynamicCache::Impl* past_key_value,
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

  void CheckTokens(const Tokens& tokens, int64_t past_seen_tokens) const {
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
  void CheckCacheBelongs(const DynamicCache::Impl& cache) const {
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

  // LlamaForCausalLM.forward(input_ids, past_key_values=cache, use_cache=cache != nullptr).
  Logits Forward(const Tokens& tokens, DynamicCache::Impl* past_key_values,
                 ForwardTrace* trace) const {
    const int64_t past_seen_tokens = past_key_values ? past_key_values->SeqLength() : 0;
    if (past_key_values != nullptr) CheckCacheBelongs(*past_key_values);
    CheckTokens(tokens, past_seen_tokens);
    if (at::get_num_threads() != threads) at::set_num_threads(threads);
    HoldBlasThreads(threads);
    if (trace != nullptr) trace->layers.assign(config.num_hidden_layers, LayerTrace{});

    c10::InferenceMode guard;
    try {
      const int64_t s = static_cast<int64_t>(tokens.size());
      std::vector<int64_t> ids(tokens.begin(), tokens.end());
      Tensor input_ids = at::tensor(ids, at::kLong).reshape({1, s});

      // LlamaModel.forward
      Tensor inputs_embeds = at::embedding(embed_tokens, input_ids);  // [1, s, hidden]
      Tensor cache_position = at::arange(past_seen_tokens, past_seen_tokens + s, at::kLong);
      Tensor position_ids = cache_position.unsqueeze(0);
      Tensor causal_mask = CausalMask(s, past_seen_tokens + s + 1, cache_position);
      Tensor hidden_states = inputs_embeds;
      const std::pair<Tensor, Tensor> position_embeddings = RotaryEmbedding(position_ids);
      for (size_t l = 0; l < layers.size(); ++l) {
        hidden_states = DecoderLayer(hidden_states, l, position_embeddings, causal_mask,
                                     past_key_values, trace);
      }
      hidden_states = RmsNorm(hidden_states, norm);

      // LlamaForCausalLM: logits for every position (logits_to_keep = 0).
      Tensor logits = Linear(hidden_states, lm_head);  // [1, s, vocab]
      return ToRowMatrix(logits);
    } catch (const c10::Error& e) {
      // Leave the cache as it was: a failed call must not half-append K/V to some layers.
      if (past_key_values != nullptr) RollBack(*past_key_values, past_seen_tokens);
      RethrowTorchError(e, "forward");
    } catch (...) {
      if (past_key_values != nullptr) RollBack(*past_key_values, past_seen_tokens);
      throw;
    }
  }

  static void RollBack(DynamicCache::Impl& cache, int64_t length) {
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
};

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
    m.inv_freq = m.config.rope_scaling ? m.ComputeLlama3InvFreq() : m.ComputeDefaultInvFreq();
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

}  // namespace kvdiff::ref
