// An obviously-correct Llama forward in plain double loops, written from
// ../shared/spec/llama-forward.md and nothing else: the yardstick the yardstick is checked against.
// Slow (no cache, no BLAS); meant for the tiny preset only.
#pragma once

#include <Eigen/Core>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "format/model_files.h"
#include "format/tensor.h"

namespace kvdiff::testing {

using Vec = std::vector<double>;

// y = W x for W stored (out, in) row-major.
inline Vec MatVec(const format::Tensor& w, const Vec& x) {
  const int64_t out = w.shape[0], in = w.shape[1];
  Vec y(out, 0.0);
  for (int64_t o = 0; o < out; ++o) {
    double sum = 0;
    for (int64_t i = 0; i < in; ++i) sum += static_cast<double>(w.data[o * in + i]) * x[i];
    y[o] = sum;
  }
  return y;
}

inline Vec NaiveRmsNorm(const Vec& x, const format::Tensor& w, double eps) {
  double mean_sq = 0;
  for (double v : x) mean_sq += v * v;
  mean_sq /= static_cast<double>(x.size());
  const double scale = 1.0 / std::sqrt(mean_sq + eps);
  Vec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * scale * w.data[i];
  return y;
}

// inv_freq with the spec's llama3 rule when rope_scaling is set.
inline Vec NaiveInvFreq(const format::LlamaConfig& c) {
  const int64_t d = c.head_dim;
  Vec f(d / 2);
  for (int64_t i = 0; i < d / 2; ++i) {
    f[i] = 1.0 / std::pow(c.rope_theta, static_cast<double>(2 * i) / static_cast<double>(d));
    if (!c.rope_scaling) continue;
    const auto& s = *c.rope_scaling;
    const double orig = static_cast<double>(s.original_max_position_embeddings);
    const double wavelen = 2 * 3.141592653589793 / f[i];
    if (wavelen < orig / s.high_freq_factor) continue;
    if (wavelen > orig / s.low_freq_factor) {
      f[i] /= s.factor;
    } else {
      const double smooth =
          (orig / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      f[i] = (1 - smooth) * f[i] / s.factor + smooth * f[i];
    }
  }
  return f;
}

// Rotate-half RoPE on each head of x (heads * d values) at position p.
inline void NaiveRope(Vec& x, int64_t heads, int64_t d, int64_t p, const Vec& inv_freq) {
  for (int64_t h = 0; h < heads; ++h) {
    double* v = x.data() + h * d;
    for (int64_t j = 0; j < d / 2; ++j) {
      const double angle = static_cast<double>(p) * inv_freq[j];
      const double a = v[j], b = v[j + d / 2];
      v[j] = a * std::cos(angle) - b * std::sin(angle);
      v[j + d / 2] = b * std::cos(angle) + a * std::sin(angle);
    }
  }
}

// Logits [n, vocab] for tokens at positions 0..n-1.
inline Eigen::MatrixXd NaiveForward(const format::ModelWeights& w, const Tokens& tokens) {
  const format::LlamaConfig& c = w.config;
  const int64_t n = static_cast<int64_t>(tokens.size()), hidden = c.hidden_size, d = c.head_dim;
  const int64_t nh = c.num_attention_heads, nkv = c.num_key_value_heads, n_rep = nh / nkv;
  const Vec inv_freq = NaiveInvFreq(c);
  const format::Tensor& embed = w.Get("model.embed_tokens.weight");

  std::vector<Vec> x(n, Vec(hidden));  // (n, hidden) residual stream
  for (int64_t t = 0; t < n; ++t)
    for (int64_t i = 0; i < hidden; ++i) x[t][i] = embed.data[tokens[t] * hidden + i];

  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    auto get = [&](const std::string& name) -> const format::Tensor& {
      return w.Get("model.layers." + std::to_string(l) + "." + name);
    };
    std::vector<Vec> q(n), k(n), v(n);  // (n, nh*d), (n, nkv*d), (n, nkv*d)
    for (int64_t t = 0; t < n; ++t) {
      const Vec xn = NaiveRmsNorm(x[t], get("input_layernorm.weight"), c.rms_norm_eps);
      q[t] = MatVec(get("self_attn.q_proj.weight"), xn);
      k[t] = MatVec(get("self_attn.k_proj.weight"), xn);
      v[t] = MatVec(get("self_attn.v_proj.weight"), xn);
      NaiveRope(q[t], nh, d, t, inv_freq);
      NaiveRope(k[t], nkv, d, t, inv_freq);
    }
    for (int64_t t = 0; t < n; ++t) {
      Vec attn(nh * d, 0.0);
      for (int64_t h = 0; h < nh; ++h) {
        const int64_t g = h / n_rep;
        Vec scores(t + 1);
        double top = -INFINITY;
        for (int64_t j = 0; j <= t; ++j) {
          double dot = 0;
          for (int64_t e = 0; e < d; ++e) dot += q[t][h * d + e] * k[j][g * d + e];
          scores[j] = dot / std::sqrt(static_cast<double>(d));
          top = std::max(top, scores[j]);
        }
        double total = 0;
        for (double& s : scores) total += (s = std::exp(s - top));
        for (int64_t j = 0; j <= t; ++j)
          for (int64_t e = 0; e < d; ++e) attn[h * d + e] += scores[j] / total * v[j][g * d + e];
      }
      const Vec o = MatVec(get("self_attn.o_proj.weight"), attn);
      for (int64_t i = 0; i < hidden; ++i) x[t][i] += o[i];
      const Vec xn = NaiveRmsNorm(x[t], get("post_attention_layernorm.weight"), c.rms_norm_eps);
      const Vec gate = MatVec(get("mlp.gate_proj.weight"), xn);
      Vec up = MatVec(get("mlp.up_proj.weight"), xn);
      for (size_t i = 0; i < up.size(); ++i) up[i] *= gate[i] / (1 + std::exp(-gate[i]));
      const Vec down = MatVec(get("mlp.down_proj.weight"), up);
      for (int64_t i = 0; i < hidden; ++i) x[t][i] += down[i];
    }
  }
  Eigen::MatrixXd logits(n, c.vocab_size);
  for (int64_t t = 0; t < n; ++t) {
    const Vec row =
        MatVec(w.LmHead(), NaiveRmsNorm(x[t], w.Get("model.norm.weight"), c.rms_norm_eps));
    for (int64_t j = 0; j < c.vocab_size; ++j) logits(t, j) = row[j];
  }
  return logits;
}

}  // namespace kvdiff::testing
