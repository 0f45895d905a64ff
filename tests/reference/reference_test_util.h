// Helpers shared by the reference/ tests: models, prompts, chunkings, and a logits comparison
// that looks for NaN/inf before it measures anything.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "format/model_files.h"
#include "format/tensor.h"

namespace kvdiff::testing {

// The tiny preset, with the head tied or not, and optionally llama3 RoPE scaling whose
// original context (256) puts the head_dim-16 frequencies in all three branches (kept, blended,
// divided by the factor).
inline format::LlamaConfig TinyConfig(bool tied, bool llama3 = false) {
  format::LlamaConfig config = format::PresetConfig("tiny");
  config.tie_word_embeddings = tied;
  if (llama3) {
    format::RopeScaling scaling;
    scaling.type = "llama3";
    scaling.factor = 8.0;
    scaling.low_freq_factor = 1.0;
    scaling.high_freq_factor = 4.0;
    scaling.original_max_position_embeddings = 256;
    config.rope_scaling = scaling;
  }
  return config;
}

inline std::shared_ptr<const format::ModelWeights> MakeWeights(const format::LlamaConfig& config,
                                                               uint64_t seed) {
  return std::make_shared<const format::ModelWeights>(format::MakeRandomModel(config, seed));
}

// Uniform token ids from a fixed seed (modulo, not std::uniform_int_distribution, so the prompt
// is the same with every standard library).
inline Tokens RandomTokens(int64_t n, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Tokens tokens(n);
  for (auto& t : tokens) t = static_cast<Token>(rng() % static_cast<uint64_t>(vocab));
  return tokens;
}

// Random chunk sizes in [1, max_chunk] summing to n, from a fixed seed.
inline std::vector<int64_t> RandomChunks(int64_t n, int64_t max_chunk, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int64_t> chunks;
  for (int64_t done = 0; done < n;) {
    const int64_t c = std::min<int64_t>(n - done, 1 + static_cast<int64_t>(rng() % max_chunk));
    chunks.push_back(c);
    done += c;
  }
  return chunks;
}

inline std::string ChunksString(const std::vector<int64_t>& chunks) {
  std::ostringstream out;
  for (size_t i = 0; i < chunks.size(); ++i) out << (i ? "+" : "") << chunks[i];
  return out.str();
}

inline Tokens Slice(const Tokens& tokens, int64_t begin, int64_t n) {
  return Tokens(tokens.begin() + begin, tokens.begin() + begin + n);
}

// Largest |a - b| over two equally shaped matrices; fails the test (and returns +inf) on a shape
// mismatch or any non-finite value, naming the first one.
inline double MaxAbsDiff(const RowMatrix& a, const RowMatrix& b, const std::string& what) {
  if (a.rows() != b.rows() || a.cols() != b.cols()) {
    ADD_FAILURE() << what << ": shapes differ [" << a.rows() << ", " << a.cols() << "] vs ["
                  << b.rows() << ", " << b.cols() << "]";
    return INFINITY;
  }
  double worst = 0;
  for (Eigen::Index r = 0; r < a.rows(); ++r) {
    for (Eigen::Index c = 0; c < a.cols(); ++c) {
      if (!std::isfinite(a(r, c)) || !std::isfinite(b(r, c))) {
        ADD_FAILURE() << what << ": non-finite value at row " << r << " col " << c << ": "
                      << a(r, c) << " vs " << b(r, c);
        return INFINITY;
      }
      worst = std::max(worst, std::abs(static_cast<double>(a(r, c)) - b(r, c)));
    }
  }
  return worst;
}

// Rows [begin, begin + n) of a logits matrix.
inline RowMatrix Rows(const RowMatrix& m, int64_t begin, int64_t n) {
  return m.middleRows(begin, n);
}

}  // namespace kvdiff::testing
