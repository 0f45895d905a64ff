// The LibTorch reference: a twin of HuggingFace transformers' LlamaForCausalLM (eager attention).
// This header is torch-free on purpose (pimpl): only reference/*.cc include LibTorch.
#pragma once

#include <cstdint>
#include <memory>

#include "format/model_files.h"
#include "format/tensor.h"

namespace kvdiff::ref {

enum class Precision {
  kFloat32,  // "ref": transformers' float32 path and casts
  kFloat64,  // "ref64": double throughout, RoPE tables and softmax included; the arbiter
};

class ReferenceModel;

// transformers' DynamicCache: per-layer K/V concatenated on the sequence dimension. Positions come
// from GetSeqLength(), so reusing a cache for a new prompt silently continues the old conversation.
class DynamicCache {
 public:
  DynamicCache();
  ~DynamicCache();
  DynamicCache(DynamicCache&&) noexcept;
  DynamicCache& operator=(DynamicCache&&) noexcept;

  int64_t GetSeqLength() const;
  void Crop(int64_t length);  // throws InputError when length > GetSeqLength() or < 0
  void Reset();               // empties it
  DynamicCache Fork() const;  // explicit deep copy

 private:
  friend class ReferenceModel;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class ReferenceModel {
 public:
  ReferenceModel(std::shared_ptr<const format::ModelWeights> weights, Precision precision,
                 int threads = 0);
  ~ReferenceModel();
  ReferenceModel(ReferenceModel&&) noexcept;

  const format::LlamaConfig& config() const;
  Precision precision() const;

  // No cache; logits [n, vocab] (ref64 results converted to float at the end).
  Logits ForwardFull(const Tokens& tokens, ForwardTrace* trace = nullptr) const;
  // model(input_ids, past_key_values=cache, use_cache=True): positions from the cache length.
  Logits Forward(const Tokens& tokens, DynamicCache& cache, ForwardTrace* trace = nullptr) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvdiff::ref
