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
  // Forgets positions >= length. Throws InputError when length > Length() or length < 0.
  void Truncate(int64_t length);
  // A context shift (llama.cpp's n_keep/n_discard): forgets positions [keep, keep + discard) and
  // moves the later ones down by `discard`, each cached key re-rotated by -discard positions
  // (the delta's angles computed as the RoPE table's are: in double, rounded once). Length()
  // drops by `discard`. Throws InputError unless 0 <= keep, 0 <= discard and
  // keep + discard <= Length(); the session is unchanged when it throws. Allocates (the delta's
  // cos/sin); a decode does not.
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
  const Model* model_;
  KvCache cache_;
};

}  // namespace kvdiff::impl
