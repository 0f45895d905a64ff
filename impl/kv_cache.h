// The KV cache: preallocated, per layer, post-RoPE keys and values of the KV heads (not repeated).
#pragma once

#include <cstdint>
#include <vector>

#include "format/config.h"
#include "format/tensor.h"

namespace kvdiff::impl {

// Layout: for each layer, keys and values are (capacity, kv_dim) row-major matrices, one row per
// position, each row head-major ([kv_head][head_dim]). The rows of a chunk of new tokens are
// therefore contiguous, so the K/V projections write straight into the cache, and attention reads
// one KV head of all positions as a strided (positions, head_dim) matrix. Rows past Length() are
// garbage (never read). The memory is allocated once and not touched until written, so a cache
// sized to max_position_embeddings costs resident memory only for the positions used.
class KvCache {
 public:
  // Capacity in positions; 0 means max_position_embeddings. Throws InputError when negative.
  KvCache(const format::LlamaConfig& config, int64_t capacity = 0);

  int64_t Length() const { return length_; }
  int64_t Capacity() const { return capacity_; }
  int64_t NumLayers() const { return static_cast<int64_t>(keys_.size()); }
  int64_t KvDim() const { return kv_dim_; }

  // Row p of layer l: the kv_dim = nkv * head_dim values of position p, head-major
  // ([kv_head][head_dim]). keys_[l] is (capacity, kv_dim), row-major.
  float* KeyRow(int64_t layer, int64_t pos) { return keys_[layer].data() + pos * kv_dim_; }
  float* ValueRow(int64_t layer, int64_t pos) { return values_[layer].data() + pos * kv_dim_; }
  const float* KeyRow(int64_t layer, int64_t pos) const {
    return keys_[layer].data() + pos * kv_dim_;
  }
  const float* ValueRow(int64_t layer, int64_t pos) const {
    return values_[layer].data() + pos * kv_dim_;
  }

  // Only the forward pass and Session move the length; data past Length() is garbage.
  // Throws InputError unless 0 <= length <= Capacity().
  void SetLength(int64_t length);
  void Clear() { length_ = 0; }

  // A context shift: positions [keep, keep + discard) are dropped and the rows after them move
  // down by `discard`. Each moved key row is rotated by `cos`/`sin` (half = head_dim / 2 values
  // each: the RoPE of the position delta -discard, so R(p - discard) = R(-discard)·R(p)), in the
  // rotate-half layout of ApplyRope; values move unchanged. Null cos/sin move keys unrotated
  // (the TEST-ONLY fault shift-not-rerotated). Throws InputError unless 0 <= keep, 0 <= discard
  // and keep + discard <= Length(); then nothing changes.
  void Shift(int64_t keep, int64_t discard, int64_t half, const float* cos, const float* sin);

  // Explicit deep copy (no copy constructor, so the cost shows): same capacity, and only the
  // Length() rows in use are copied.
  KvCache Fork() const;

  KvCache(KvCache&&) noexcept = default;
  KvCache& operator=(KvCache&&) noexcept = default;

 private:
  KvCache(int64_t num_layers, int64_t kv_dim, int64_t capacity);
  int64_t kv_dim_;
  int64_t capacity_;
  int64_t length_ = 0;
  std::vector<RowMatrix> keys_;    // per layer: (capacity, kv_dim)
  std::vector<RowMatrix> values_;  // per layer: (capacity, kv_dim)
};

}  // namespace kvdiff::impl
