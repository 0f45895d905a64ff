// The KV cache: preallocated, per layer, post-RoPE keys and values of the KV heads (not repeated).
#pragma once

#include <cstdint>
#include <vector>

#include "harness/format/config.h"
#include "harness/format/tensor.h"

namespace kvdiff::impl {

class KvCache {
 public:
  // Capacity in positions; 0 means max_position_embeddings.
  KvCache(const format::LlamaConfig& config, int64_t capacity = 0);

  int64_t Length() const { return length_; }
  int64_t Capacity() const { return capacity_; }
  int64_t NumLayers() const { return static_cast<int64_t>(keys_.size()); }

  // Row p of layer l: the kv_dim = nkv * head_dim values of position p, head-major
  // ([kv_head][head_dim]). keys_[l] is (capacity, kv_dim), row-major.
  float* KeyRow(int64_t layer, int64_t pos) { return keys_[layer].data() + pos * kv_dim_; }
  float* ValueRow(int64_t layer, int64_t pos) { return values_[layer].data() + pos * kv_dim_; }
  const float* KeyRow(int64_t layer, int64_t pos) const { return keys_[layer].data() + pos * kv_dim_; }
  const float* ValueRow(int64_t layer, int64_t pos) const {
    return values_[layer].data() + pos * kv_dim_;
  }

  // Only the forward pass and Session move the length; data past Length() is garbage.
  void SetLength(int64_t length);
  void Clear() { length_ = 0; }

  KvCache Fork() const { return *this; }  // explicit deep copy (the copy constructor is private)

 private:
  KvCache(const KvCache&) = default;
  int64_t kv_dim_;
  int64_t capacity_;
  int64_t length_ = 0;
  std::vector<RowMatrix> keys_;    // per layer: (capacity, kv_dim)
  std::vector<RowMatrix> values_;  // per layer: (capacity, kv_dim)
 public:
  KvCache(KvCache&&) noexcept = default;
  KvCache& operator=(KvCache&&) noexcept = default;
};

}  // namespace kvdiff::impl
