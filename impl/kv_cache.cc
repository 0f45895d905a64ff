#include "impl/kv_cache.h"

#include <fmt/format.h>

#include <algorithm>

#include "format/error.h"
#include "impl/kernels.h"

namespace kvdiff::impl {

KvCache::KvCache(const format::LlamaConfig& config, int64_t capacity)
    : KvCache(config.num_hidden_layers, config.KvDim(),
              capacity == 0 ? config.max_position_embeddings : capacity, config.sliding_window) {
  KVDIFF_CHECK(capacity >= 0,
               "KvCache: capacity must be >= 0 (0 means max_position_embeddings {}), got {}",
               config.max_position_embeddings, capacity);
}

KvCache KvCache::Linear(const format::LlamaConfig& config, int64_t capacity) {
  return KvCache(config.num_hidden_layers, config.KvDim(), capacity, 0);
}

KvCache::KvCache(int64_t num_layers, int64_t kv_dim, int64_t capacity, int64_t window)
    : kv_dim_(kv_dim),
      capacity_(std::max<int64_t>(capacity, 0)),
      ring_(window > 0),
      rows_(window > 0 ? std::min(window, capacity_) : capacity_),
      window_(window) {
  keys_.reserve(num_layers);
  values_.reserve(num_layers);
  for (int64_t l = 0; l < num_layers; ++l) {
    keys_.emplace_back(rows_, kv_dim_);
    values_.emplace_back(rows_, kv_dim_);
  }
}

void KvCache::CheckTruncate(int64_t length) const {
  KVDIFF_CHECK(length >= 0 && length <= length_,
               "Truncate: length {} is outside 0..{} (the session length)", length, length_);
  if (oldest_ == 0 || length >= oldest_ + window_ - 1) return;
  throw InputError(fmt::format(
      "Truncate: length {} is not possible on this sliding-window cache (window {}): the next "
      "query, at position {}, sees positions {}..{}, but positions 0..{} have left the window "
      "(it holds {}..{}); once the window has dropped positions, a truncate goes back at most to "
      "{} (one less than the furthest length reached, {})",
      length, window_, length, std::max<int64_t>(0, length - window_ + 1), length, oldest_ - 1,
      oldest_, length_ - 1, oldest_ + window_ - 1, oldest_ + window_));
}

void KvCache::SetLength(int64_t length) {
  KVDIFF_CHECK(length >= 0 && length <= capacity_,
               "KvCache::SetLength: length {} is outside 0..{} (the capacity)", length, capacity_);
  // A ring drops what an append pushed out of its rows; a truncate drops nothing back in.
  if (ring_) oldest_ = std::max(oldest_, length - rows_);
  length_ = length;
  // A truncated position's pending delta must not rotate the key written there next.
  if (static_cast<int64_t>(pending_.size()) > length_) pending_.resize(length_);
}

void KvCache::Shift(int64_t keep, int64_t discard, ShiftBookkeeping bookkeeping) {
  KVDIFF_CHECK(!ring_,
               "KvCache::Shift: a sliding-window cache (window {}) does not shift its positions",
               window_);
  KVDIFF_CHECK(keep >= 0 && discard >= 0 && keep <= length_ && discard <= length_ - keep,
               "KvCache::Shift: keep {} and discard {} must be >= 0 with keep + discard <= {} (the "
               "length)",
               keep, discard, length_);
  if (discard == 0) return;  // nothing moves: bit-identical afterwards
  pending_.resize(length_, 0);
  for (int64_t p = keep + discard; p < length_; ++p) {
    for (int64_t l = 0; l < NumLayers(); ++l) {
      std::copy(KeyRow(l, p), KeyRow(l, p) + kv_dim_, KeyRow(l, p - discard));
      std::copy(ValueRow(l, p), ValueRow(l, p) + kv_dim_, ValueRow(l, p - discard));
    }
    pending_[p - discard] =
        bookkeeping == ShiftBookkeeping::kOverwriteDelta ? -discard : pending_[p] - discard;
  }
  const bool moved = keep + discard < length_;
  length_ -= discard;
  pending_.resize(length_);
  shift_pending_ =
      bookkeeping == ShiftBookkeeping::kFlagFromThisShift ? moved : shift_pending_ || moved;
}

void KvCache::RotateKey(int64_t pos, int64_t half, const float* cos, const float* sin) {
  const int64_t heads = kv_dim_ / (2 * half);
  for (int64_t l = 0; l < NumLayers(); ++l) ApplyRope(KeyRow(l, pos), heads, half, cos, sin);
}

KvCache KvCache::Fork() const {
  KvCache copy(NumLayers(), kv_dim_, capacity_, window_);
  // A ring's rows in use may be any of them: copy them all (W rows, a window's worth).
  const int64_t used = (ring_ ? rows_ : length_) * kv_dim_;
  for (int64_t l = 0; l < NumLayers(); ++l) {
    std::copy(keys_[l].data(), keys_[l].data() + used, copy.keys_[l].data());
    std::copy(values_[l].data(), values_[l].data() + used, copy.values_[l].data());
  }
  copy.length_ = length_;
  copy.oldest_ = oldest_;
  copy.pending_ = pending_;
  copy.shift_pending_ = shift_pending_;
  return copy;
}

}  // namespace kvdiff::impl
