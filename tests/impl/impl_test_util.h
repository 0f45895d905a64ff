// Helpers for the impl tests: random models from the format presets, random prompts and vectors,
// row diffs.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "format/model_files.h"
#include "format/tensor.h"

namespace kvdiff::impl::testing {

inline std::shared_ptr<const format::ModelWeights> RandomModel(const format::LlamaConfig& config,
                                                               uint64_t seed) {
  return std::make_shared<const format::ModelWeights>(format::MakeRandomModel(config, seed));
}

inline std::shared_ptr<const format::ModelWeights> PresetModel(const std::string& preset,
                                                               uint64_t seed) {
  return RandomModel(format::PresetConfig(preset), seed);
}

inline Tokens RandomTokens(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int64_t> dist(0, vocab - 1);
  Tokens t(n);
  for (auto& x : t) x = static_cast<Token>(dist(rng));
  return t;
}

// max |a - b| over one row; NaN/inf anywhere is reported as infinity so it can never pass.
inline double RowDiff(const RowMatrix& a, int64_t ra, const RowMatrix& b, int64_t rb) {
  double m = 0;
  for (int64_t c = 0; c < a.cols(); ++c) {
    const double x = a(ra, c), y = b(rb, c);
    if (!std::isfinite(x) || !std::isfinite(y)) return INFINITY;
    m = std::max(m, std::abs(x - y));
  }
  return m;
}

// n values uniform in [-scale, scale], the same for a seed on every platform's libstdc++.
inline std::vector<float> RandomVector(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// max |a_i - b_i|: a kernel's float32 output against its double-precision loop.
inline double MaxAbsDiff(const std::vector<float>& a, const std::vector<double>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(static_cast<double>(a[i]) - b[i]));
  return m;
}

// Cached and uncached float32 forwards differ only by summation order (spec: ~1e-6 on small
// models); 1e-4 is the project's gate.
constexpr double kTolerance = 1e-4;

// A 9-head config (3 KV heads), small enough for unit tests, for candle's 9-head error message.
inline format::LlamaConfig NineHeadConfig() {
  format::LlamaConfig c = format::PresetConfig("tiny");
  c.num_attention_heads = 9;
  c.num_key_value_heads = 3;
  c.head_dim = 16;
  c.hidden_size = 144;
  return c;
}

}  // namespace kvdiff::impl::testing
