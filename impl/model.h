// The Eigen Llama: the model of record. Float32, GQA, tied or untied head, llama3 RoPE scaling.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>

#include "harness/format/model_files.h"
#include "harness/format/tensor.h"
#include "impl/kv_cache.h"

namespace kvdiff::impl {

class Session;

class Model {
 public:
  // threads: 0 means every core of the machine.
  explicit Model(std::shared_ptr<const format::ModelWeights> weights, int threads = 0);
  static Model Load(const std::filesystem::path& dir, int threads = 0);
  ~Model();
  Model(Model&&) noexcept;

  const format::LlamaConfig& config() const;

  // No cache: logits [n, vocab] for every position of tokens (positions 0..n-1).
  Logits ForwardFull(const Tokens& tokens, ForwardTrace* trace = nullptr) const;

  // The raw candle llama.rs call, UNCHECKED ON PURPOSE (it exists to reproduce porting bugs):
  // RoPE rows from index_pos, causal mask sized (s, index_pos + s) and skipped when s == 1, K/V
  // always appended to whatever the cache holds. When the mask does not fit the scores
  // (s, cache.Length() + s) it throws ShapeError with candle's message:
  // "cannot broadcast [s, s'] to [1, nh, s, P+s]". Use Session instead.
  Logits Forward(const Tokens& tokens, int64_t index_pos, KvCache& cache,
                 ForwardTrace* trace = nullptr) const;

  KvCache NewCache(int64_t capacity = 0) const;
  // A checked session owning its cache and position; capacity 0 means max_position_embeddings.
  Session NewSession(int64_t capacity = 0) const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace kvdiff::impl
