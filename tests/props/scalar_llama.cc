#include "tests/props/scalar_llama.h"

#include <algorithm>
#include <cmath>

#include "format/error.h"

namespace kvdiff::props {
namespace {

// y = x · Wᵀ for W (out, in): accumulated in double so this model's own rounding is negligible
// next to the 1e-4 gate.
std::vector<float> Linear(const float* w, int64_t out, int64_t in, const float* x) {
  std::vector<float> y(static_cast<size_t>(out));
  for (int64_t o = 0; o < out; ++o) {
    double sum = 0;
    for (int64_t i = 0; i < in; ++i) sum += static_cast<double>(w[o * in + i]) * x[i];
    y[o] = static_cast<float>(sum);
  }
  return y;
}

}  // namespace

std::string FaultName(Fault fault) {
  switch (fault) {
    case Fault::kNone:
      return "none";
    case Fault::kMaskSeesNextKey:
      return "mask-sees-next-key";
    case Fault::kMaskHidesLastCached:
      return "mask-hides-last-cached";
    case Fault::kRopeAtCacheLength:
      return "rope-at-cache-length";
    case Fault::kDoubleAppend:
      return "kv-appended-twice";
    case Fault::kKvHeadModulo:
      return "kv-head-h%nkv";
    case Fault::kDecodeDropsKeysPastP:
      return "decode-drops-keys-past-P";
    case Fault::kMaskSecondTile:
      return "mask-second-tile";
    case Fault::kRopeWrapsAtP:
      return "rope-wraps-at-P";
    case Fault::kReallocLosesRows:
      return "realloc-loses-rows";
    case Fault::kSoftmaxWithoutMax:
      return "softmax-without-max";
    case Fault::kNaiveFloat32RmsNorm:
      return "naive-float32-rmsnorm";
    case Fault::kBatchMaskOfItemZero:
      return "batch-mask-of-item-0";
    case Fault::kBatchSharedPositions:
      return "batch-shared-positions";
    case Fault::kBatchRowsAfterSplit:
      return "batch-rows-after-split";
    case Fault::kBatchSeesOtherSequence:
      return "batch-sees-other-sequence";
  }
  return "?";
}

// The default P of each fault past a size (see Fault).
int64_t DefaultAt(Fault fault) {
  switch (fault) {
    case Fault::kDecodeDropsKeysPastP:
      return 240;
    case Fault::kMaskSecondTile:
      return 128;
    case Fault::kRopeWrapsAtP:
      return 160;
    case Fault::kReallocLosesRows:
      return 96;
    default:
      return 0;
  }
}

ScalarLlama::ScalarLlama(std::shared_ptr<const format::ModelWeights> weights, Fault fault,
                         int64_t at)
    : weights_(std::move(weights)), fault_(fault), at_(at > 0 ? at : DefaultAt(fault)) {
  const auto& c = config();
  const auto get = [this](const std::string& name) { return weights_->Get(name).data.data(); };
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    layers_.push_back({get(p + "input_layernorm.weight"), get(p + "self_attn.q_proj.weight"),
                       get(p + "self_attn.k_proj.weight"), get(p + "self_attn.v_proj.weight"),
                       get(p + "self_attn.o_proj.weight"),
                       get(p + "post_attention_layernorm.weight"), get(p + "mlp.gate_proj.weight"),
                       get(p + "mlp.up_proj.weight"), get(p + "mlp.down_proj.weight")});
  }
  embed_ = get("model.embed_tokens.weight");
  final_norm_ = get("model.norm.weight");
  lm_head_ = weights_->LmHead().data.data();

  // Spec §3: inv_freq[i] = 1 / theta^(2i/d), then the llama3 rescaling by wavelength.
  const int64_t d = c.head_dim;
  for (int64_t i = 0; i < d / 2; ++i) {
    double f = 1.0 / std::pow(c.rope_theta, static_cast<double>(2 * i) / d);
    if (c.rope_scaling) {
      const auto& s = *c.rope_scaling;
      const double orig = static_cast<double>(s.original_max_position_embeddings);
      const double wavelength = 2 * M_PI / f;
      if (wavelength > orig / s.low_freq_factor) {
        f = f / s.factor;
      } else if (wavelength >= orig / s.high_freq_factor) {
        const double smooth =
            (orig / wavelength - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        f = (1 - smooth) * f / s.factor + smooth * f;
      }
    }
    inv_freq_.push_back(f);
  }
}

ScalarCache ScalarLlama::NewCache() const {
  ScalarCache cache;
  cache.keys.resize(static_cast<size_t>(config().num_hidden_layers));
  cache.values.resize(static_cast<size_t>(config().num_hidden_layers));
  return cache;
}

ScalarLlama::Vec ScalarLlama::RmsNorm(const Vec& x, const float* weight) const {
  double sum_sq = 0;
  if (fault_ == Fault::kNaiveFloat32RmsNorm) {
    float sum = 0;
    for (float v : x) sum += v * v;
    sum_sq = sum;
  } else {
    for (float v : x) sum_sq += static_cast<double>(v) * v;
  }
  const double scale = 1.0 / std::sqrt(sum_sq / x.size() + config().rms_norm_eps);
  Vec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = static_cast<float>(x[i] * scale) * weight[i];
  return y;
}

void ScalarLlama::Rope(float* x, int64_t position) const {
  // Rotate-half layout: dimension j pairs with j + d/2.
  const int64_t half = config().head_dim / 2;
  for (int64_t j = 0; j < half; ++j) {
    const double angle = static_cast<double>(position) * inv_freq_[j];
    const double c = std::cos(angle), s = std::sin(angle);
    const double a = x[j], b = x[j + half];
    x[j] = static_cast<float>(a * c - b * s);
    x[j + half] = static_cast<float>(b * c + a * s);
  }
}

std::vector<ScalarLlama::Vec> ScalarLlama::Attention(const LayerWeights& w, int64_t layer,
                                                     const std::vector<Vec>& x, ScalarCache& cache,
                                                     const BatchContext* batch) const {
  const auto& c = config();
  const int64_t s = static_cast<int64_t>(x.size());
  const int64_t d = c.head_dim, nh = c.num_attention_heads, nkv = c.num_key_value_heads;
  const int64_t hidden = c.hidden_size, kv_dim = c.KvDim();
  const int64_t rows_before = cache.rows;  // P, as key rows
  auto& keys = cache.keys[layer];          // (rows, kv_dim)
  auto& values = cache.values[layer];      // (rows, kv_dim)

  std::vector<Vec> q(s);            // (s, nh*d)
  std::vector<int64_t> own_row(s);  // the key row of token i itself (the last one it may see)
  const bool refed_single = s == 1 && cache.position > 0;
  const bool later_item = batch != nullptr && batch->item > 0;
  for (int64_t i = 0; i < s; ++i) {
    int64_t position = fault_ == Fault::kRopeAtCacheLength ? cache.position : cache.position + i;
    if (fault_ == Fault::kRopeWrapsAtP) position %= at_;
    if (fault_ == Fault::kBatchSharedPositions && later_item) position = batch->first_position + i;
    q[i] = Linear(w.wq, nh * d, hidden, x[i].data());
    Vec k = Linear(w.wk, kv_dim, hidden, x[i].data());
    const Vec v = Linear(w.wv, kv_dim, hidden, x[i].data());
    for (int64_t h = 0; h < nh; ++h) Rope(q[i].data() + h * d, position);
    for (int64_t h = 0; h < nkv; ++h) Rope(k.data() + h * d, position);
    const int copies = (fault_ == Fault::kDoubleAppend && refed_single) ? 2 : 1;
    for (int n = 0; n < copies; ++n) {
      keys.insert(keys.end(), k.begin(), k.end());
      values.insert(values.end(), v.begin(), v.end());
    }
    own_row[i] = static_cast<int64_t>(keys.size()) / kv_dim - 1;
  }
  const int64_t total_rows = static_cast<int64_t>(keys.size()) / kv_dim;

  std::vector<Vec> out(s);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  for (int64_t i = 0; i < s; ++i) {
    Vec heads(static_cast<size_t>(nh * d), 0.0f);  // (nh*d): the concatenated head outputs
    for (int64_t h = 0; h < nh; ++h) {
      const int64_t kv_head = fault_ == Fault::kKvHeadModulo ? h % nkv : h / c.NumRep();
      const float* qh = q[i].data() + h * d;
      // Causal mask: key row j is visible to new row i iff j <= own_row[i].
      int64_t last_visible = own_row[i];
      if (fault_ == Fault::kMaskSeesNextKey)
        last_visible = std::min(own_row[i] + 1, total_rows - 1);
      if (fault_ == Fault::kMaskSecondTile && i >= at_) last_visible = own_row[i % at_];
      if (fault_ == Fault::kBatchMaskOfItemZero && later_item) {
        // Item 0's mask (s0 rows over its keys): row i gets item 0's row min(i, s0-1).
        last_visible =
            std::min(last_visible, batch->first_position + std::min(i, batch->first_size - 1));
      }
      std::vector<double> scores;
      std::vector<const float*> visible_values;
      // A key and value row from another sequence's cells, attended as if it were ours.
      if (fault_ == Fault::kBatchSeesOtherSequence && later_item && batch->previous->rows > 0) {
        const int64_t j = batch->previous->rows - 1;
        const float* kj = batch->previous->keys[layer].data() + j * kv_dim + kv_head * d;
        double dot = 0;
        for (int64_t e = 0; e < d; ++e) dot += static_cast<double>(qh[e]) * kj[e];
        scores.push_back(dot * scale);
        visible_values.push_back(batch->previous->values[layer].data() + j * kv_dim + kv_head * d);
      }
      for (int64_t j = 0; j <= last_visible; ++j) {
        if (fault_ == Fault::kMaskHidesLastCached && j == rows_before - 1) continue;
        if (fault_ == Fault::kDecodeDropsKeysPastP && refed_single && j >= at_ && j < own_row[i])
          continue;
        const float* kj = keys.data() + j * kv_dim + kv_head * d;
        double dot = 0;
        for (int64_t e = 0; e < d; ++e) dot += static_cast<double>(qh[e]) * kj[e];
        scores.push_back(dot * scale);
        visible_values.push_back(values.data() + j * kv_dim + kv_head * d);
      }
      const double max_score = *std::max_element(scores.begin(), scores.end());
      double denom = 0;
      if (fault_ == Fault::kSoftmaxWithoutMax) {
        float sum = 0;
        for (double& sc : scores) sum += static_cast<float>(sc = std::exp(static_cast<float>(sc)));
        denom = sum;
      } else {
        for (double& sc : scores) denom += (sc = std::exp(sc - max_score));
      }
      for (size_t n = 0; n < visible_values.size(); ++n) {
        const float* vj = visible_values[n];
        for (int64_t e = 0; e < d; ++e)
          heads[h * d + e] += static_cast<float>(scores[n] / denom * vj[e]);
      }
    }
    out[i] = Linear(w.wo, hidden, nh * d, heads.data());
  }
  return out;
}

void ScalarLlama::Grow(ScalarCache& cache, int64_t rows) const {
  if (cache.capacity == 0) cache.capacity = at_;
  const int64_t kv_dim = config().KvDim();
  while (cache.capacity < rows) {
    // The fault: the copy into the new buffer takes the first capacity's rows, not all of them.
    for (auto* layers : {&cache.keys, &cache.values})
      for (auto& rows_of : *layers)
        for (size_t e = static_cast<size_t>(at_ * kv_dim); e < rows_of.size(); ++e) rows_of[e] = 0;
    cache.capacity *= 2;
  }
}

ScalarLlama::Vec ScalarLlama::Mlp(const LayerWeights& w, const Vec& x) const {
  const auto& c = config();
  const int64_t ffn = c.intermediate_size, hidden = c.hidden_size;
  Vec gate = Linear(w.w_gate, ffn, hidden, x.data());
  const Vec up = Linear(w.w_up, ffn, hidden, x.data());
  for (int64_t i = 0; i < ffn; ++i) gate[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
  return Linear(w.w_down, hidden, ffn, gate.data());
}

Logits ScalarLlama::Forward(const Tokens& tokens, ScalarCache& cache,
                            const BatchContext* batch) const {
  const auto& c = config();
  const int64_t s = static_cast<int64_t>(tokens.size()), hidden = c.hidden_size;
  if (fault_ == Fault::kReallocLosesRows) Grow(cache, cache.rows + s);
  std::vector<Vec> x(s);  // (s, hidden): the residual stream
  for (int64_t i = 0; i < s; ++i) {
    x[i].assign(embed_ + tokens[i] * hidden, embed_ + (tokens[i] + 1) * hidden);
  }
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const LayerWeights& w = layers_[l];
    std::vector<Vec> normed(s);
    for (int64_t i = 0; i < s; ++i) normed[i] = RmsNorm(x[i], w.input_norm);
    const std::vector<Vec> attn = Attention(w, l, normed, cache, batch);
    for (int64_t i = 0; i < s; ++i) {
      for (int64_t e = 0; e < hidden; ++e) x[i][e] += attn[i][e];
      const Vec mlp = Mlp(w, RmsNorm(x[i], w.post_norm));
      for (int64_t e = 0; e < hidden; ++e) x[i][e] += mlp[e];
    }
  }
  cache.rows = static_cast<int64_t>(cache.keys[0].size()) / c.KvDim();
  cache.position += s;

  Logits logits(s, c.vocab_size);  // (s, vocab)
  for (int64_t i = 0; i < s; ++i) {
    const Vec normed = RmsNorm(x[i], final_norm_);
    const Vec row = Linear(lm_head_, c.vocab_size, hidden, normed.data());
    for (int64_t v = 0; v < c.vocab_size; ++v) logits(i, v) = row[v];
  }
  return logits;
}

namespace {

class ScalarSession : public harness::BackendSession {
 public:
  explicit ScalarSession(const ScalarLlama* model) : model_(model), cache_(model->NewCache()) {}

  Logits Append(const Tokens& tokens, ForwardTrace* /*trace*/) override {
    return AppendInBatch(tokens, nullptr);
  }
  // One item of a batched call (batch: how it sees the call), or a single append (nullptr).
  Logits AppendInBatch(const Tokens& tokens, const BatchContext* batch) {
    const auto& c = model_->config();
    KVDIFF_CHECK(!tokens.empty(), "Append: tokens must not be empty");
    for (Token t : tokens) {
      KVDIFF_CHECK(t >= 0 && t < c.vocab_size, "Append: token {} out of range [0, {})", t,
                   c.vocab_size);
    }
    const int64_t end = cache_.position + static_cast<int64_t>(tokens.size());
    KVDIFF_CHECK(end <= c.max_position_embeddings, "Append: length {} would exceed the capacity {}",
                 end, c.max_position_embeddings);
    return model_->Forward(tokens, cache_, batch);
  }
  const ScalarCache& cache() const { return cache_; }
  int64_t Length() const override { return cache_.position; }
  void Truncate(int64_t length) override {
    KVDIFF_CHECK(length >= 0 && length <= cache_.position, "Truncate: length {} outside [0, {}]",
                 length, cache_.position);
    const int64_t kv_dim = model_->config().KvDim();
    // Under kDoubleAppend rows and positions part; cutting at `length` rows is good enough
    // for a faulty model (the properties only need it to be wrong, not wrong in one way).
    for (auto& k : cache_.keys)
      k.resize(static_cast<size_t>(std::min(length, cache_.rows) * kv_dim));
    for (auto& v : cache_.values)
      v.resize(static_cast<size_t>(std::min(length, cache_.rows) * kv_dim));
    cache_.rows = std::min(length, cache_.rows);
    cache_.position = length;
  }
  std::unique_ptr<harness::BackendSession> Fork() const override {
    return std::make_unique<ScalarSession>(*this);
  }
  void Reset() override { cache_ = model_->NewCache(); }

 private:
  const ScalarLlama* model_;
  ScalarCache cache_;
};

class ScalarBackend : public harness::Backend {
 public:
  ScalarBackend(std::shared_ptr<const format::ModelWeights> weights, Fault fault, int64_t at)
      : model_(std::move(weights), fault, at) {
    info_.name = fault == Fault::kNone ? "scalar" : "scalar:" + FaultName(fault);
    info_.description = "the plain scalar Llama of the tests";
    info_.dtype = "float32";
  }
  const harness::BackendInfo& Info() const override { return info_; }
  const format::LlamaConfig& config() const override { return model_.config(); }
  Logits ForwardFull(const Tokens& tokens, ForwardTrace* /*trace*/) const override {
    return model_.ForwardFull(tokens);
  }
  std::unique_ptr<harness::BackendSession> NewSession() const override {
    return std::make_unique<ScalarSession>(&model_);
  }
  // The items one after another, each told where it sits in the call, as a batched engine's
  // item would be: the batch faults strike here; without one it is the default's arithmetic.
  std::vector<Logits> AppendBatch(const std::vector<harness::BatchItem>& items) const override {
    std::vector<ScalarSession*> sessions;
    for (size_t i = 0; i < items.size(); ++i) {
      sessions.push_back(dynamic_cast<ScalarSession*>(items[i].session));
      KVDIFF_CHECK(sessions.back() != nullptr, "batch item {} is not a scalar session", i);
    }
    const int64_t first_position = sessions.front()->Length();
    const auto first_size = static_cast<int64_t>(items.front().tokens.size());
    std::vector<Logits> out;
    for (size_t i = 0; i < items.size(); ++i) {
      const BatchContext batch{static_cast<int64_t>(i), first_position, first_size,
                               i > 0 ? &sessions[i - 1]->cache() : nullptr};
      out.push_back(harness::KeepOutputRows(sessions[i]->AppendInBatch(items[i].tokens, &batch),
                                            items[i].output));
    }
    if (model_.fault() == Fault::kBatchRowsAfterSplit) SwapRowsAcrossSplit(items, out);
    return out;
  }

 private:
  // kBatchRowsAfterSplit: the last row returned from the first micro-batch of kUbatch tokens and
  // the first returned after it change places.
  static void SwapRowsAcrossSplit(const std::vector<harness::BatchItem>& items,
                                  std::vector<Logits>& out) {
    constexpr int64_t kUbatch = 4;
    std::pair<size_t, int64_t> before{0, -1}, after{0, -1};  // (item, row in its output)
    int64_t token = 0;
    for (size_t i = 0; i < items.size(); ++i) {
      int64_t row = 0;
      for (size_t t = 0; t < items[i].tokens.size(); ++t, ++token) {
        if (!items[i].Outputs(t)) continue;
        if (token < kUbatch) before = {i, row};
        if (token >= kUbatch && after.second < 0) after = {i, row};
        ++row;
      }
    }
    if (before.second < 0 || after.second < 0) return;
    Eigen::RowVectorXf kept = out[before.first].row(before.second);
    out[before.first].row(before.second) = out[after.first].row(after.second);
    out[after.first].row(after.second) = kept;
  }

  ScalarLlama model_;
  harness::BackendInfo info_;
};

}  // namespace

std::unique_ptr<harness::Backend> MakeScalarBackend(
    std::shared_ptr<const format::ModelWeights> weights, Fault fault, int64_t at) {
  return std::make_unique<ScalarBackend>(std::move(weights), fault, at);
}

}  // namespace kvdiff::props
