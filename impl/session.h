// The checked API: a session owns its cache and its position. There is no position argument
// anywhere, so a caller cannot pass a wrong one.
#pragma once

#include <cstdint>
#include <vector>

#include "format/tensor.h"
#include "impl/kv_cache.h"

namespace kvdiff::impl {

class Model;

class Session {
 public:
  // capacity in positions; 0 means max_position_embeddings. The model must outlive the session.
  Session(const Model& model, int64_t capacity = 0);

  // Appends tokens at positions Length()..Length()+n-1; returns their logits [n, vocab].
  // Throws InputError on an empty input, a token id out of range, or a length beyond capacity,
  // naming both numbers; the session is unchanged when it throws.
  Logits Append(const Tokens& tokens, ForwardTrace* trace = nullptr);
  int64_t Length() const { return cache_.Length(); }
  int64_t Capacity() const { return cache_.Capacity(); }
  // Forgets positions >= length. Throws InputError when length > Length() or length < 0, or,
  // with a sliding window W, when the window has dropped positions the next query would see:
  // then only a truncate to the furthest length reached minus one (or more) is possible
  // (KvCache::CheckTruncate). The session is unchanged when it throws.
  void Truncate(int64_t length);
  // A context shift (llama.cpp's n_keep/n_discard): forgets positions [keep, keep + discard) and
  // moves the later ones down by `discard`; Length() drops by `discard`. As in llama.cpp, the
  // moved keys are re-rotated by the next append (ApplyPendingShift), each once by the sum of the
  // deltas of the shifts since (the angles computed as the RoPE table's: in double, rounded
  // once). Throws InputError unless 0 <= keep, 0 <= discard and keep + discard <= Length(); the
  // session is unchanged when it throws; also on a sliding-window model, which does not shift.
  // Allocates (the pending deltas; the next append, the
  // delta's cos/sin); a decode with no shift pending does not.
  void Shift(int64_t keep, int64_t discard);
  Session Fork() const;  // explicit deep copy: the fork evolves independently
  void Reset();          // a new conversation: empty cache, position 0

  // A serving engine's call: every session appends its own tokens in ONE forward of their model
  // (Model::ForwardBatch). Returns the logits of the rows flagged in `output` (one flag per token
  // of all items, in order; empty: every row). Throws InputError on a session named twice, of
  // another model, an empty item, a token out of range or a capacity exceeded, naming the item;
  // then no session has changed.
  struct BatchAppend {
    Session* session = nullptr;
    const Tokens* tokens = nullptr;
  };
  static Logits AppendBatch(const std::vector<BatchAppend>& items, const std::vector<bool>& output);

  Session(Session&&) noexcept = default;
  Session& operator=(Session&&) noexcept = default;

 private:
  Session(const Model* model, KvCache cache);
  // Re-rotates each key a shift moved by its pending delta (KvCache::PendingDelta), before an
  // append reads them: llama.cpp's K-shift at the next decode.
  void ApplyPendingShift();
  const Model* model_;
  KvCache cache_;
};

}  // namespace kvdiff::impl
