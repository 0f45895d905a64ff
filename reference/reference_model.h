// The LibTorch reference: a twin of HuggingFace transformers' LlamaForCausalLM (eager attention).
// This header is torch-free on purpose (pimpl): only reference/*.cc include LibTorch.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

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

  struct Impl;  // its tensors: reference/dynamic_cache_impl.h, seen by reference/ only

 private:
  friend class ReferenceModel;
  std::unique_ptr<Impl> impl_;
};

// One conversation's part of a batched forward (ReferenceModel::ForwardBatch): the tokens appended
// to its cache, and which of their logits rows come back.
struct BatchPart {
  DynamicCache* cache = nullptr;
  const Tokens* tokens = nullptr;
  std::vector<bool> output;  // one flag per token; empty: every row
};

// Where a batched forward's position_ids come from.
enum class BatchPositions {
  // attention_mask.cumsum(-1) - 1, as generate() passes them: each row at its own positions.
  kFromAttentionMask,
  // None passed, a user bug: LlamaModel falls back to cache_position, the padded batch's columns
  // P..P+S-1, for every row (transformers#18478, unsloth#3699). A row's new tokens then sit
  // (P - P_b) + (S - S_b) positions past their own: harmless for RoPE's relative angles within
  // the call, wrong against the row's cached keys, and every later call sees the shifted keys.
  kCachePosition,
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

  // Several conversations in ONE forward, as a transformers user batches them (padded_batch.h):
  // every part's cached K/V and new tokens left-padded to the longest, an attention mask over the
  // padding, per-row position_ids, one forward of the padded batch through the same layers; then
  // each part's new K/V appended to its own cache and its rows un-padded. Returns, per part, the
  // logits of the rows its `output` flags ask for [rows, vocab], in token order. Checked before
  // anything runs (InputError: no parts, an empty or out-of-range token, a cache named twice or
  // of another model, past max_position_embeddings, output flags of the wrong count); a call
  // that throws changes no cache.
  std::vector<Logits> ForwardBatch(
      const std::vector<BatchPart>& parts,
      BatchPositions positions = BatchPositions::kFromAttentionMask) const;

  // A context shift of `cache` (llama.cpp's n_keep/n_discard, StreamingLLM): positions
  // [keep, keep + discard) dropped, the later keys re-rotated by -discard positions with this
  // model's own rotary arithmetic (LlamaRotaryEmbedding at position_ids [[-discard]]: float32
  // angles in ref, float64 in ref64) and apply_rotary_pos_emb's formula; values moved unchanged.
  // InputError unless 0 <= keep, 0 <= discard and keep + discard <= the cache length; then the
  // cache is unchanged.
  void Shift(DynamicCache& cache, int64_t keep, int64_t discard) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvdiff::ref
