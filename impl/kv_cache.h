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
//
// A sliding-window model (config.sliding_window = W) gets a RING instead: W rows per layer
// (fewer when the capacity is smaller), position p in row SlotOf(p) = p mod W, holding the
// positions Oldest()..Length()-1 (at most W of them). The query at position L sees the keys
// L-W+1..L, so W - 1 held positions are what the next call needs; the ring keeps one more, which
// is what lets a truncate go back one position after the window dropped some (CheckTruncate).
// Capacity() stays the logical capacity (positions a conversation may reach).
class KvCache {
 public:
  // Capacity in positions; 0 means max_position_embeddings. Throws InputError when negative.
  // A ring when config.sliding_window > 0.
  KvCache(const format::LlamaConfig& config, int64_t capacity = 0);
  // Every position in its own row whatever the window: the uncached forward's scratch, which
  // holds a whole call and applies the window by its mask.
  static KvCache Linear(const format::LlamaConfig& config, int64_t capacity);

  int64_t Length() const { return length_; }
  int64_t Capacity() const { return capacity_; }
  bool Ring() const { return ring_; }
  int64_t Rows() const { return rows_; }  // rows per layer: Capacity(), or the ring's size
  // The first position still held: 0 until a ring drops its first position.
  int64_t Oldest() const { return oldest_; }
  // The row of position pos (Oldest() <= pos < Length(), or a position being written).
  int64_t SlotOf(int64_t pos) const { return ring_ ? pos % rows_ : pos; }
  // Throws InputError, naming the positions, when truncating to `length` would leave the next
  // query without a key its window needs: on a ring whose window dropped positions, a truncate
  // to L needs L-W+1..L-1 still held, so only L >= Oldest() + W - 1 (the furthest length reached
  // minus one) is possible. Also when length is outside 0..Length().
  void CheckTruncate(int64_t length) const;
  int64_t NumLayers() const { return static_cast<int64_t>(keys_.size()); }
  int64_t KvDim() const { return kv_dim_; }

  // Row p of layer l: the kv_dim = nkv * head_dim values of the position in row p (position p
  // but in a ring, see SlotOf), head-major ([kv_head][head_dim]). keys_[l] is (rows, kv_dim).
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
  void Clear() {
    length_ = 0;
    oldest_ = 0;
    SpendPendingShift();
  }

  // How a shift records the re-rotation it leaves pending. kAccumulate is right; the other two
  // are TEST-ONLY faults (impl/batch_fault.h) modelled on llama.cpp before #3835: a cell's delta
  // set to the latest shift's instead of added to (#3825), and the pending flag set from whether
  // the latest shift moved anything instead of or-ed, so a shift that moves nothing cancels the
  // re-rotation an earlier one left pending.
  enum class ShiftBookkeeping { kAccumulate, kOverwriteDelta, kFlagFromThisShift };

  // A context shift, as llama.cpp's cache makes it: positions [keep, keep + discard) are dropped
  // and the rows after them move down by `discard` now; each moved key's re-rotation is left
  // pending (its delta -discard, added to what is pending for it already) for the next append to
  // apply (PendingDelta, RotateKey, SpendPendingShift). Values move unchanged. Throws InputError
  // unless 0 <= keep, 0 <= discard and keep + discard <= Length(), or on a ring (a window's
  // cache does not shift); then nothing changes.
  void Shift(int64_t keep, int64_t discard,
             ShiftBookkeeping bookkeeping = ShiftBookkeeping::kAccumulate);
  // Whether a shift left a re-rotation pending (llama.cpp's has_shift), and the position delta
  // the key at `pos` has not been rotated by yet (0 when none).
  bool ShiftPending() const { return shift_pending_; }
  int64_t PendingDelta(int64_t pos) const {
    return pos < static_cast<int64_t>(pending_.size()) ? pending_[pos] : 0;
  }
  // Rotates the key of `pos` in every layer by cos/sin (half = head_dim / 2 values each, the
  // rotate-half layout of ApplyRope).
  void RotateKey(int64_t pos, int64_t half, const float* cos, const float* sin);
  // Forgets every pending delta and the flag (once applied, or when they are not to be).
  void SpendPendingShift() {
    pending_.clear();
    shift_pending_ = false;
  }

  // Explicit deep copy (no copy constructor, so the cost shows): same capacity, and only the
  // Length() rows in use are copied.
  KvCache Fork() const;

  KvCache(KvCache&&) noexcept = default;
  KvCache& operator=(KvCache&&) noexcept = default;

 private:
  KvCache(int64_t num_layers, int64_t kv_dim, int64_t capacity, int64_t window);
  int64_t kv_dim_;
  int64_t capacity_;
  bool ring_;
  int64_t rows_;  // capacity_, or a ring's min(window, capacity_)
  int64_t window_;
  int64_t length_ = 0;
  int64_t oldest_ = 0;
  std::vector<RowMatrix> keys_;    // per layer: (rows, kv_dim)
  std::vector<RowMatrix> values_;  // per layer: (rows, kv_dim)
  // (<= length): per position, the delta its key still has to be rotated by; positions past the
  // end have none. Empty when no shift is pending.
  std::vector<int64_t> pending_;
  bool shift_pending_ = false;
};

}  // namespace kvdiff::impl
