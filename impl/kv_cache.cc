#include "impl/kv_cache.h"

#include <algorithm>

#include "format/error.h"
#include "impl/kernels.h"

namespace kvdiff::impl {

KvCache::KvCache(const format::LlamaConfig& config, int64_t capacity)
    : KvCache(config.num_hidden_layers, config.KvDim(),
              capacity == 0 ? config.max_position_embeddings : capacity) {
  KVDIFF_CHECK(capacity >= 0,
               "KvCache: capacity must be >= 0 (0 means max_position_embeddings {}), got {}",
               config.max_position_embeddings, capacity);
}

KvCache::KvCache(int64_t num_layers, int64_t kv_dim, int64_t capacity)
    : kv_dim_(kv_dim), capacity_(std::max<int64_t>(capacity, 0)) {
  keys_.reserve(num_layers);
  values_.reserve(num_layers);
  for (int64_t l = 0; l < num_layers; ++l) {
    keys_.emplace_back(capacity_, kv_dim_);
    values_.emplace_back(capacity_, kv_dim_);
  }
}

void KvCache::SetLength(int64_t length) {
  KVDIFF_CHECK(length >= 0 && length <= capacity_,
               "KvCache::SetLength: length {} is outside 0..{} (the capacity)", length, capacity_);
  length_ = length;
}

void KvCache::Shift(int64_t keep, int64_t discard, int64_t half, const float* cos,
                    const float* sin) {
  KVDIFF_CHECK(keep >= 0 && discard >= 0 && keep <= length_ && discard <= length_ - keep,
               "KvCache::Shift: keep {} and discard {} must be >= 0 with keep + discard <= {} (the "
               "length)",
               keep, discard, length_);
  if (discard == 0) return;  // nothing moves: bit-identical afterwards
  const int64_t heads = kv_dim_ / (2 * half);
  for (int64_t l = 0; l < NumLayers(); ++l) {
    for (int64_t p = keep + discard; p < length_; ++p) {
      float* key = KeyRow(l, p - discard);  // (kv_dim): [kv_head][head_dim]
      std::copy(KeyRow(l, p), KeyRow(l, p) + kv_dim_, key);
      std::copy(ValueRow(l, p), ValueRow(l, p) + kv_dim_, ValueRow(l, p - discard));
      if (cos != nullptr) ApplyRope(key, heads, half, cos, sin);
    }
  }
  length_ -= discard;
}

KvCache KvCache::Fork() const {
  KvCache copy(NumLayers(), kv_dim_, capacity_);
  const int64_t used = length_ * kv_dim_;
  for (int64_t l = 0; l < NumLayers(); ++l) {
    std::copy(keys_[l].data(), keys_[l].data() + used, copy.keys_[l].data());
    std::copy(values_[l].data(), values_[l].data() + used, copy.values_[l].data());
  }
  copy.length_ = length_;
  return copy;
}

}  // namespace kvdiff::impl
