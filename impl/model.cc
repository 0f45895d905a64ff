// The forward pass of ../shared/spec/llama-forward.md, in float32. Read Model::State::Forward top
// to bottom: embedding, then per layer RMSNorm → attention (QKV, RoPE, cache, softmax, o_proj) →
// residual → RMSNorm → SwiGLU MLP → residual, then the final norm and the head. The arithmetic
// lives in kernels.cc; this file only says what is computed, in what order, into which buffer.
#include "impl/model.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "format/error.h"
#include "impl/batch_fault.h"
#include "impl/kernels.h"
#include "impl/session.h"
#include "impl/thread_pool.h"

namespace kvdiff::impl {
namespace {

struct LayerWeights {
  const float* input_norm;    // (hidden)
  WeightView q, k, v, o;      // (q_dim, hidden), (kv_dim, hidden) x2, (hidden, q_dim)
  const float* post_norm;     // (hidden)
  WeightView gate, up, down;  // (inter, hidden) x2, (hidden, inter)
};

// A part of a forward call and where its rows are among the call's.
struct PartRows {
  ForwardPart part;
  int64_t first_row = 0;  // its first row among all the call's rows
  int64_t size = 0;       // its number of rows (tokens)
  int64_t past = 0;       // its cache's length before the call: its first new row goes there
};

// Buffers for the rows of one forward call, grown (never shrunk) to the largest call seen, so a
// decode step allocates nothing. Shapes are per call: s = number of new tokens (of every part of
// a batched call).
struct Workspace {
  std::vector<float> x;     // (s, hidden): the residual stream
  std::vector<float> xn;    // (s, hidden): RMSNorm(x)
  std::vector<float> q;     // (s, q_dim): queries, post-RoPE
  std::vector<float> k;     // (s, kv_dim): new keys, post-RoPE, before each part's go to its cache
  std::vector<float> v;     // (s, kv_dim): new values
  std::vector<float> attn;  // (s, q_dim): attention output, heads concatenated
  std::vector<float> proj;  // (s, hidden): output of o_proj or down_proj, before the residual
  std::vector<float> gate;  // (s, inter)
  std::vector<float> up;    // (s, inter)
  std::vector<float> act;   // (s, inter): silu(gate) * up
  AttentionScratch scores;
  std::vector<float> window_keys;    // (held + p.size, kv_dim): a ring part's keys, in position
  std::vector<float> window_values;  // order (AttendThroughRing); grown, never shrunk
  std::vector<PartRows> parts;       // the call's parts
  Tokens tokens;                     // every part's tokens, in order

  void Reserve(const format::LlamaConfig& c, int64_t s, int threads, int64_t max_keys) {
    auto grow = [](std::vector<float>& v, int64_t n) {
      if (static_cast<int64_t>(v.size()) < n) v.resize(n);
    };
    grow(x, s * c.hidden_size);
    grow(xn, s * c.hidden_size);
    grow(q, s * c.QDim());
    grow(k, s * c.KvDim());
    grow(v, s * c.KvDim());
    grow(attn, s * c.QDim());
    grow(proj, s * c.hidden_size);
    grow(gate, s * c.intermediate_size);
    grow(up, s * c.intermediate_size);
    grow(act, s * c.intermediate_size);
    scores.Reserve(threads, s, max_keys, c.num_attention_heads, c.head_dim);
  }
};

const format::Tensor& CheckedTensor(const format::ModelWeights& w, const format::TensorSpec& spec) {
  auto it = w.tensors.find(spec.name);
  KVDIFF_CHECK(it != w.tensors.end(), "model weights: tensor '{}' is missing", spec.name);
  const format::Tensor& t = it->second;
  KVDIFF_CHECK(t.shape == spec.shape, "model weights: tensor '{}' has shape [{}], expected [{}]",
               spec.name, fmt::join(t.shape, ", "), fmt::join(spec.shape, ", "));
  int64_t elements = 1;
  for (int64_t d : t.shape) elements *= d;
  KVDIFF_CHECK(static_cast<int64_t>(t.data.size()) == elements,
               "model weights: tensor '{}' holds {} values, its shape needs {}", spec.name,
               t.data.size(), elements);
  return t;
}

WeightView View(const format::Tensor& t) { return {t.data.data(), t.shape[0], t.shape[1]}; }

// The 16-bit dtype the matrices are kept in: the checkpoint's, unless float32 is asked for.
WeightDtype StorageDtype(const format::ModelWeights& w, WeightStorage storage) {
  if (storage == WeightStorage::kF32) return WeightDtype::kF32;
  if (w.dtype_on_disk == format::DType::kBF16) return WeightDtype::kBF16;
  if (w.dtype_on_disk == format::DType::kF16) return WeightDtype::kF16;
  return WeightDtype::kF32;
}

// The names of the matrices (everything but the norm vectors).
bool IsMatrix(const format::TensorSpec& spec) { return spec.shape.size() == 2; }

// Every matrix in `dtype`, or nothing when a value is not exactly one of that dtype (weights
// edited in memory after loading): then the model stays in float32, whose bits are the same.
std::map<std::string, std::vector<uint16_t>> Narrow(const format::ModelWeights& w,
                                                    WeightDtype dtype) {
  std::map<std::string, std::vector<uint16_t>> out;
  if (dtype == WeightDtype::kF32) return out;
  for (const auto& spec : format::ExpectedTensors(w.config)) {
    if (!IsMatrix(spec)) continue;
    const std::vector<float>& values = w.Get(spec.name).data;
    std::vector<uint16_t> bits(values.size());
    for (size_t i = 0; i < values.size(); ++i) {
      if (!NarrowExact(values[i], dtype, &bits[i])) return {};
    }
    out.emplace(spec.name, std::move(bits));
  }
  return out;
}

}  // namespace

struct Model::State {
  std::shared_ptr<const format::ModelWeights> weights;  // owns every float the views point at
  format::LlamaConfig config;
  WeightDtype dtype = WeightDtype::kF32;              // of the matrices
  std::map<std::string, std::vector<uint16_t>> half;  // 16-bit matrices the views point at
  WeightView embed;                                   // (vocab, hidden)
  std::vector<LayerWeights> layers;
  const float* final_norm = nullptr;  // (hidden)
  WeightView lm_head;                 // (vocab, hidden): the embedding matrix when tied
  RopeTable rope;                     // (positions used so far, head_dim / 2), grown under mutex
  ThreadPool pool;
  std::mutex mutex;  // one forward call at a time: the workspace and the pool are shared
  Workspace ws;
  BatchFault fault = BatchFault::kNone;  // TEST-ONLY (impl/batch_fault.h); spares part 0

  State(std::shared_ptr<const format::ModelWeights> w, int threads, WeightStorage storage)
      : weights(std::move(w)), config(weights->config), pool(threads) {
    config.Validate();
    for (const auto& spec : format::ExpectedTensors(config)) CheckedTensor(*weights, spec);
    half = Narrow(*weights, StorageDtype(*weights, storage));
    if (!half.empty()) dtype = StorageDtype(*weights, storage);
    auto view_of = [&](const format::Tensor& t) {
      WeightView v = View(t);
      for (const auto& [name, bits] : half) {
        if (&weights->Get(name) != &t) continue;
        v.data = nullptr;  // every read goes through the 16-bit copy
        v.half = bits.data();
        v.dtype = dtype;
      }
      return v;
    };
    embed = view_of(weights->Get("model.embed_tokens.weight"));
    for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      auto get = [&](const std::string& name) -> const format::Tensor& {
        return weights->Get(p + name);
      };
      layers.push_back(
          {get("input_layernorm.weight").data.data(), view_of(get("self_attn.q_proj.weight")),
           view_of(get("self_attn.k_proj.weight")), view_of(get("self_attn.v_proj.weight")),
           view_of(get("self_attn.o_proj.weight")),
           get("post_attention_layernorm.weight").data.data(), view_of(get("mlp.gate_proj.weight")),
           view_of(get("mlp.up_proj.weight")), view_of(get("mlp.down_proj.weight"))});
    }
    final_norm = weights->Get("model.norm.weight").data.data();
    lm_head = view_of(weights->LmHead());
  }

  // 1. Embedding: row lookup.
  void Embed(const Tokens& tokens, float* x) const {
    for (size_t i = 0; i < tokens.size(); ++i)
      WidenRow(embed, tokens[i], x + i * config.hidden_size);
  }

  // 4. Attention: Q, K and V of every row of every part in one product; then, part by part,
  //    RoPE at the part's own positions, its K/V rows appended to its own cache, and its queries
  //    attending to that cache only; o_proj of every row in one product. Reads ws.xn, leaves
  //    o_proj's output in ws.proj.
  void AttentionBlock(int64_t l, const std::vector<PartRows>& parts, int64_t s) {
    const LayerWeights& w = layers[l];
    const int64_t nh = config.num_attention_heads, nkv = config.num_key_value_heads;
    const int64_t q_dim = config.QDim(), kv_dim = config.KvDim();
    const LinearOutput qkv[] = {{w.q, ws.q.data()}, {w.k, ws.k.data()}, {w.v, ws.v.data()}};
    LinearMany(pool, ws.xn.data(), s, qkv, 3);
    for (size_t i = 0; i < parts.size(); ++i) {
      const PartRows& p = parts[i];
      const BatchFault f = i > 0 ? fault : BatchFault::kNone;
      KvCache& cache = *p.part.cache;
      float* q = ws.q.data() + p.first_row * q_dim;
      if (cache.Ring()) {
        AttendThroughRing(l, p, q, ws.attn.data() + p.first_row * q_dim);
        continue;
      }
      float* new_keys = cache.KeyRow(l, p.past);  // (p.size, kv_dim): the cache rows of this call
      float* new_values = cache.ValueRow(l, p.past);
      std::copy_n(ws.k.data() + p.first_row * kv_dim, p.size * kv_dim, new_keys);
      std::copy_n(ws.v.data() + p.first_row * kv_dim, p.size * kv_dim, new_values);
      // (Under the test fault, part 0's positions, as far as the RoPE table reaches.)
      const int64_t first_position =
          f == BatchFault::kSharedPositions
              ? std::min(parts[0].part.index_pos, rope.positions - p.size)
              : p.part.index_pos;
      for (int64_t r = 0; r < p.size; ++r) {
        const float* cos = rope.Cos(first_position + r);
        const float* sin = rope.Sin(first_position + r);
        ApplyRope(q + r * q_dim, nh, rope.half, cos, sin);
        ApplyRope(new_keys + r * kv_dim, nkv, rope.half, cos, sin);
      }
      float* out = ws.attn.data() + p.first_row * q_dim;
      if (f == BatchFault::kSeesOtherSequence && parts[0].past > 0) {
        AttendWithAForeignCell(l, p, *parts[0].part.cache, q, out);
        continue;
      }
      const int64_t past =
          f == BatchFault::kMaskOfPartZero ? std::min(parts[0].past, p.past) : p.past;
      Attention(pool, q, p.size, past, cache.KeyRow(l, 0), cache.ValueRow(l, 0), nh, nkv,
                config.head_dim, out, ws.scores, config.sliding_window);
    }
    Linear(pool, ws.attn.data(), s, w.o, ws.proj.data());
  }

  // 4, with a sliding window W and a ring (KvCache): the part's queries at P..P+c-1 see the keys
  // of P-W+1.. on, so the held positions from max(0, P-W+1) and the chunk's own keys are
  // gathered, in position order, into ws.window_keys and attended with the window mask (the
  // mask then counts positions, whatever row of the ring a key came from); only then are the
  // chunk's last min(c, W) keys written into the ring, so a chunk longer than the window
  // overwrites rows only after every query has read them.
  void AttendThroughRing(int64_t l, const PartRows& p, float* q, float* out) {
    KvCache& ring = *p.part.cache;
    const int64_t kv_dim = config.KvDim();
    const int64_t window = config.sliding_window + (fault == BatchFault::kWindowPlusOne    ? 1
                                                    : fault == BatchFault::kWindowMinusOne ? -1
                                                                                           : 0);
    // (Under kWindowPlusOne the ring's extra row holds the key one position further back.)
    const int64_t first = std::max({int64_t{0}, p.past - (window - 1), ring.Oldest()});
    const int64_t held = p.past - first;
    // Sized for a whole window (and the fault's one more) at once, not for the keys in view
    // now: those grow by one at every decode until the ring is full, which would allocate.
    const int64_t most = (config.sliding_window + 1 + p.size) * kv_dim;
    if (static_cast<int64_t>(ws.window_keys.size()) < most) {
      ws.window_keys.resize(most);
      ws.window_values.resize(most);
    }
    float* keys = ws.window_keys.data();  // (held + p.size, kv_dim): positions first..P+c-1
    float* values = ws.window_values.data();
    for (int64_t i = 0; i < held; ++i) {
      // (Under the test fault the ring's rows are read in row order, as if linear.)
      const int64_t row =
          fault == BatchFault::kRingSlicedByLogicalLength ? i : ring.SlotOf(first + i);
      std::copy_n(ring.KeyRow(l, row), kv_dim, keys + i * kv_dim);
      std::copy_n(ring.ValueRow(l, row), kv_dim, values + i * kv_dim);
    }
    float* new_keys = keys + held * kv_dim;
    std::copy_n(ws.k.data() + p.first_row * kv_dim, p.size * kv_dim, new_keys);
    std::copy_n(ws.v.data() + p.first_row * kv_dim, p.size * kv_dim, values + held * kv_dim);
    for (int64_t r = 0; r < p.size; ++r) {
      const float* cos = rope.Cos(p.part.index_pos + r);
      const float* sin = rope.Sin(p.part.index_pos + r);
      ApplyRope(q + r * config.QDim(), config.num_attention_heads, rope.half, cos, sin);
      ApplyRope(new_keys + r * kv_dim, config.num_key_value_heads, rope.half, cos, sin);
    }
    Attention(pool, q, p.size, held, keys, values, config.num_attention_heads,
              config.num_key_value_heads, config.head_dim, out, ws.scores, window);
    for (int64_t pos = std::max(p.past, p.past + p.size - ring.Rows()); pos < p.past + p.size;
         ++pos) {
      std::copy_n(keys + (pos - first) * kv_dim, kv_dim, ring.KeyRow(l, ring.SlotOf(pos)));
      std::copy_n(values + (pos - first) * kv_dim, kv_dim, ring.ValueRow(l, ring.SlotOf(pos)));
    }
  }

  // TEST-ONLY (BatchFault::kSeesOtherSequence): the part's attention with `other`'s first cached
  // key and value in view before its own, as a cell of another sequence left visible would be.
  void AttendWithAForeignCell(int64_t l, const PartRows& p, const KvCache& other, float* q,
                              float* out) {
    const int64_t kv_dim = config.KvDim(), own = p.past + p.size;
    std::vector<float> keys((own + 1) * kv_dim), values((own + 1) * kv_dim);
    std::copy_n(other.KeyRow(l, 0), kv_dim, keys.data());
    std::copy_n(other.ValueRow(l, 0), kv_dim, values.data());
    std::copy_n(p.part.cache->KeyRow(l, 0), own * kv_dim, keys.data() + kv_dim);
    std::copy_n(p.part.cache->ValueRow(l, 0), own * kv_dim, values.data() + kv_dim);
    Attention(pool, q, p.size, p.past + 1, keys.data(), values.data(), config.num_attention_heads,
              config.num_key_value_heads, config.head_dim, out, ws.scores);
  }

  // TEST-ONLY (BatchFault::kRowsMisMapped): the first returned rows of parts 0 and 1 trade
  // places, as when a call's outputs are mapped back to the wrong sequences.
  static void SwapFirstRowsOfParts0And1(const std::vector<PartRows>& parts,
                                        const std::vector<bool>& output, Logits& logits) {
    auto first_returned = [&](const PartRows& p) -> int64_t {
      int64_t returned_before = 0;
      for (int64_t r = 0; r < p.first_row + p.size; ++r) {
        const bool returned = output.empty() || output[r];
        if (returned && r >= p.first_row) return returned_before;
        returned_before += returned ? 1 : 0;
      }
      return -1;
    };
    const int64_t a = first_returned(parts[0]), b = first_returned(parts[1]);
    if (a >= 0 && b >= 0) logits.row(a).swap(logits.row(b));
  }

  // 5. SwiGLU MLP: reads ws.xn, leaves down_proj's output in ws.proj.
  void MlpBlock(int64_t l, int64_t s) {
    const LayerWeights& w = layers[l];
    const LinearOutput gate_up[] = {{w.gate, ws.gate.data()}, {w.up, ws.up.data()}};
    LinearMany(pool, ws.xn.data(), s, gate_up, 2);
    SwiGlu(pool, ws.gate.data(), ws.up.data(), s * config.intermediate_size, ws.act.data());
    Linear(pool, ws.act.data(), s, w.down, ws.proj.data());
  }

  static void Record(const std::vector<float>& x, int64_t s, int64_t hidden, RowMatrix& out) {
    out = Eigen::Map<const RowMatrix>(x.data(), s, hidden);
  }

  // The whole model for the rows of every part (s in all), given already-validated arguments
  // (see Model::Forward and Model::ForwardBatch); the logits of the rows flagged in `output`
  // (every row when it is empty), in row order.
  Logits Forward(const ForwardPart* forward_parts, size_t count, const std::vector<bool>& output,
                 ForwardTrace* trace) {
    std::lock_guard<std::mutex> lock(mutex);
    // Kept in the workspace (cleared, never shrunk): a decode step allocates only its logits.
    std::vector<PartRows>& parts = ws.parts;
    Tokens& tokens = ws.tokens;  // every part's, in order
    parts.clear();
    tokens.clear();
    int64_t max_keys = 0, positions = 0;
    for (size_t i = 0; i < count; ++i) {
      const ForwardPart& part = forward_parts[i];
      parts.push_back({part, static_cast<int64_t>(tokens.size()),
                       static_cast<int64_t>(part.tokens->size()), part.cache->Length()});
      tokens.insert(tokens.end(), part.tokens->begin(), part.tokens->end());
      max_keys = std::max(max_keys, part.cache->Capacity());
      positions = std::max(positions, part.index_pos + parts.back().size);
      if (fault == BatchFault::kSharedPositions)  // every part at part 0's positions
        positions = std::max(positions, forward_parts[0].index_pos + parts.back().size);
    }
    const int64_t s = static_cast<int64_t>(tokens.size());
    const int64_t hidden = config.hidden_size;
    const float eps = static_cast<float>(config.rms_norm_eps);
    // (A key more under the test fault that shows a part another sequence's cell.)
    ws.Reserve(config, s, pool.Size(),
               max_keys + (fault == BatchFault::kSeesOtherSequence ? 1 : 0));
    GrowRopeTable(config, positions, rope);
    if (trace) trace->layers.resize(config.num_hidden_layers);

    Embed(tokens, ws.x.data());
    for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
      // 6. h = x + Attn(RMSNorm(x)); out = h + MLP(RMSNorm(h)).
      RmsNorm(ws.x.data(), layers[l].input_norm, s, hidden, eps, ws.xn.data());
      AttentionBlock(l, parts, s);
      AddInPlace(ws.x.data(), ws.proj.data(), s * hidden);
      if (trace) Record(ws.x, s, hidden, trace->layers[l].after_attention);

      RmsNorm(ws.x.data(), layers[l].post_norm, s, hidden, eps, ws.xn.data());
      MlpBlock(l, s);
      AddInPlace(ws.x.data(), ws.proj.data(), s * hidden);
      if (trace) Record(ws.x, s, hidden, trace->layers[l].after_mlp);
    }
    for (const PartRows& p : parts) p.part.cache->SetLength(p.past + p.size);

    // 7. Final norm and the head, for the rows asked for (moved to the front, in order).
    int64_t rows = s;
    if (!output.empty()) {
      rows = 0;
      for (int64_t i = 0; i < s; ++i) {
        if (!output[i]) continue;
        if (rows != i) std::copy_n(ws.x.data() + i * hidden, hidden, ws.x.data() + rows * hidden);
        ++rows;
      }
    }
    RmsNorm(ws.x.data(), final_norm, rows, hidden, eps, ws.xn.data());
    Logits logits(rows, config.vocab_size);
    Linear(pool, ws.xn.data(), rows, lm_head, logits.data());
    if (fault == BatchFault::kRowsMisMapped && parts.size() > 1)
      SwapFirstRowsOfParts0And1(parts, output, logits);
    return logits;
  }
};

Model::Model(std::shared_ptr<const format::ModelWeights> weights, int threads,
             WeightStorage storage) {
  KVDIFF_CHECK(weights != nullptr, "Model: weights must not be null");
  KVDIFF_CHECK(threads >= 0, "Model: threads must be >= 0 (0 means every core), got {}", threads);
  state_ = std::make_unique<State>(std::move(weights), threads, storage);
}

Model Model::Load(const std::filesystem::path& dir, int threads, WeightStorage storage) {
  return Model(std::make_shared<const format::ModelWeights>(format::LoadModel(dir)), threads,
               storage);
}

Model::~Model() = default;
Model::Model(Model&&) noexcept = default;

const format::LlamaConfig& Model::config() const { return state_->config; }
int Model::Threads() const { return state_->pool.Size(); }
const char* Model::StorageName() const {
  switch (state_->dtype) {
    case WeightDtype::kBF16:
      return "bfloat16";
    case WeightDtype::kF16:
      return "float16";
    case WeightDtype::kF32:
      break;
  }
  return "float32";
}

void Model::CheckTokens(const Tokens& tokens) const {
  KVDIFF_CHECK(!tokens.empty(), "tokens is empty (expected at least one token)");
  const int64_t vocab = state_->config.vocab_size;
  for (size_t i = 0; i < tokens.size(); ++i) {
    KVDIFF_CHECK(tokens[i] >= 0 && tokens[i] < vocab,
                 "token id {} at index {} is out of range for vocab_size {}", tokens[i], i, vocab);
  }
}

Logits Model::ForwardFull(const Tokens& tokens, ForwardTrace* trace) const {
  CheckTokens(tokens);
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t max_pos = state_->config.max_position_embeddings;
  KVDIFF_CHECK(n <= max_pos, "ForwardFull: {} tokens is more than max_position_embeddings {}", n,
               max_pos);
  // The oracle keeps no cache: the keys and values of this call live in a scratch cache sized to
  // the call and dropped at the end, so every position attends within the call only.
  // With a sliding window the scratch is linear all the same (every position its own row): the
  // oracle applies the window by its mask alone, with no ring.
  KvCache scratch = KvCache::Linear(state_->config, n);
  const ForwardPart part{&tokens, 0, &scratch};
  return state_->Forward(&part, 1, {}, trace);
}

Logits Model::Forward(const Tokens& tokens, int64_t index_pos, KvCache& cache,
                      ForwardTrace* trace) const {
  const format::LlamaConfig& c = state_->config;
  const int64_t s = static_cast<int64_t>(tokens.size());
  const int64_t past = cache.Length();
  // Not candle's checks: these only keep memory safe (an id or a position must never index past a
  // table, K/V must never be written past the buffer). Positions are deliberately NOT compared.
  CheckTokens(tokens);
  KVDIFF_CHECK(index_pos >= 0 && index_pos + s <= c.max_position_embeddings,
               "index_pos {} with {} tokens runs past max_position_embeddings {} (the RoPE table)",
               index_pos, s, c.max_position_embeddings);
  KVDIFF_CHECK(cache.NumLayers() == c.num_hidden_layers && cache.KvDim() == c.KvDim(),
               "cache has {} layers of kv_dim {}, the model needs {} layers of kv_dim {}",
               cache.NumLayers(), cache.KvDim(), c.num_hidden_layers, c.KvDim());
  // candle builds the causal mask as (s, index_pos + s) and broadcasts it to the scores
  // (1, nh, s, past + s); with s == 1 it skips the mask. A mismatch is candle's broadcast error.
  // In candle that error is raised inside layer 0 after layer 0 has already appended its K/V
  // (Tensor::cat precedes the mask), leaving layer 0 one chunk longer than the others. Our cache
  // keeps a single length for all layers and cannot represent that torn state, so we raise the
  // same error before touching the cache: the cache is unchanged. The caller sees the same error
  // text; a candle program that carried on after it would be in undefined territory anyway.
  if (s > 1 && index_pos + s != past + s) {
    throw ShapeError(fmt::format("cannot broadcast [{}, {}] to [1, {}, {}, {}]", s, index_pos + s,
                                 c.num_attention_heads, s, past + s));
  }
  KVDIFF_CHECK(past + s <= cache.Capacity(),
               "cache holds {} positions of capacity {}: {} more tokens do not fit", past,
               cache.Capacity(), s);
  const ForwardPart part{&tokens, index_pos, &cache};
  return state_->Forward(&part, 1, {}, trace);
}

Logits Model::ForwardBatch(const std::vector<ForwardPart>& parts,
                           const std::vector<bool>& output) const {
  const format::LlamaConfig& c = state_->config;
  KVDIFF_CHECK(!parts.empty(), "ForwardBatch: no parts (expected at least one)");
  int64_t rows = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const ForwardPart& p = parts[i];
    KVDIFF_CHECK(p.tokens != nullptr && p.cache != nullptr, "ForwardBatch: part {} is empty", i);
    CheckTokens(*p.tokens);
    const int64_t s = static_cast<int64_t>(p.tokens->size());
    KVDIFF_CHECK(p.cache->NumLayers() == c.num_hidden_layers && p.cache->KvDim() == c.KvDim(),
                 "ForwardBatch: part {}'s cache does not fit this model", i);
    KVDIFF_CHECK(p.index_pos == p.cache->Length(),
                 "ForwardBatch: part {} starts at position {}, its cache holds {}", i, p.index_pos,
                 p.cache->Length());
    KVDIFF_CHECK(p.index_pos + s <= std::min(p.cache->Capacity(), c.max_position_embeddings),
                 "ForwardBatch: part {}: {} tokens at length {} need {} positions, beyond its "
                 "capacity {}",
                 i, s, p.index_pos, p.index_pos + s, p.cache->Capacity());
    for (size_t j = 0; j < i; ++j) {
      KVDIFF_CHECK(parts[j].cache != p.cache, "ForwardBatch: parts {} and {} share a cache", j, i);
    }
    rows += s;
  }
  KVDIFF_CHECK(output.empty() || static_cast<int64_t>(output.size()) == rows,
               "ForwardBatch: {} output flags for {} rows", output.size(), rows);
  return state_->Forward(parts.data(), parts.size(), output, nullptr);
}

void Model::InjectBatchFault(BatchFault fault) { state_->fault = fault; }
BatchFault Model::InjectedFault() const { return state_->fault; }

KvCache Model::NewCache(int64_t capacity) const { return KvCache(state_->config, capacity); }

Session Model::NewSession(int64_t capacity) const { return Session(*this, capacity); }

}  // namespace kvdiff::impl
