// The llama.cpp engine's appends (decode.h). One path for both: check the items, lay them out in
// one llama_batch, decode, read each flagged row back by its batch index, advance the sessions.
#include "engines/llama_cpp/decode.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "format/error.h"

namespace kvdiff::llama_cpp {
namespace {

bool Outputs(const kvdiff_batch_item& item, int64_t row) {
  return item.output == nullptr || item.output[row] != 0;
}

int64_t OutputRows(const kvdiff_batch_item& item) {
  int64_t rows = 0;
  for (int64_t j = 0; j < item.n; ++j) rows += Outputs(item, j) ? 1 : 0;
  return rows;
}

// One item on its own: a session of this engine, tokens in the vocabulary, room in the session.
// `where` prefixes the messages ("" for append, "batch item 2: " for append_batch).
void CheckItem(const kvdiff_engine* e, const kvdiff_batch_item& item, const std::string& where) {
  if (!item.session || item.session->engine != e)
    throw InputError(fmt::format("{}the session is not a session of this engine", where));
  if (item.n < 1 || !item.tokens)
    throw InputError(fmt::format("{}tokens is empty (expected at least one token)", where));
  for (int64_t j = 0; j < item.n; ++j) {
    if (item.tokens[j] < 0 || item.tokens[j] >= e->vocab) {
      throw InputError(fmt::format("{}token id {} at index {} is out of range for vocab_size {}",
                                   where, item.tokens[j], j, e->vocab));
    }
  }
  const kvdiff_session& s = *item.session;
  if (s.length + item.n > e->max_length) {
    throw InputError(
        fmt::format("{}session holds {} positions of max_length {}: {} more tokens do not fit",
                    where, s.length, e->max_length, item.n));
  }
}

// The whole batched call, before anything runs. Free cells need no check of their own: every
// session stays within max_length and the context has max_length x sessions cells (forks share
// theirs), and every item already owns its sequence id.
void CheckBatch(const kvdiff_engine* e, const kvdiff_batch_item* items, int64_t n_items,
                const float* logits, int64_t capacity) {
  if (!items || n_items < 1)
    throw InputError(fmt::format("append_batch of {} items (expected at least one)", n_items));
  int64_t tokens = 0, rows = 0;
  for (int64_t i = 0; i < n_items; ++i) {
    CheckItem(e, items[i], fmt::format("batch item {}: ", i));
    for (int64_t j = 0; j < i; ++j) {
      if (items[j].session == items[i].session) {
        throw InputError(fmt::format("batch items {} and {} name the same session", j, i));
      }
    }
    tokens += items[i].n;
    rows += OutputRows(items[i]);
  }
  // llama.cpp aborts the process on a batch above n_batch: refuse it here instead.
  const int64_t n_batch = llama_n_batch(e->ctx);
  if (tokens > n_batch) {
    throw InputError(fmt::format(
        "append_batch of {} tokens in {} items: more than n_batch {}, the most tokens one call "
        "takes (option batch=N)",
        tokens, n_items, n_batch));
  }
  if (rows > 0 && (!logits || capacity < rows * e->vocab)) {
    throw InputError(
        fmt::format("logits buffer holds {} floats, {} flagged rows x vocab {} need {}", capacity,
                    rows, e->vocab, rows * e->vocab));
  }
}

// llama_batch_init's batch, freed on every way out.
class OwnedBatch {
 public:
  explicit OwnedBatch(int64_t n_tokens)
      : batch_(llama_batch_init(static_cast<int32_t>(n_tokens), 0, 1)) {}
  ~OwnedBatch() { llama_batch_free(batch_); }
  OwnedBatch(const OwnedBatch&) = delete;
  OwnedBatch& operator=(const OwnedBatch&) = delete;
  llama_batch& get() { return batch_; }

 private:
  llama_batch batch_;
};

// Batch row r is item i's token j for r = first_row[i] + j: at the session's position length + j,
// under the session's sequence id, its logits asked for when flagged. Returns first_row.
std::vector<int32_t> Fill(llama_batch& b, const kvdiff_batch_item* items, int64_t n_items) {
  std::vector<int32_t> first_row(n_items);
  int32_t r = 0;
  for (int64_t i = 0; i < n_items; ++i) {
    const kvdiff_batch_item& item = items[i];
    first_row[i] = r;
    for (int64_t j = 0; j < item.n; ++j, ++r) {
      b.token[r] = item.tokens[j];
      b.pos[r] = static_cast<llama_pos>(item.session->length + j);
      b.n_seq_id[r] = 1;
      b.seq_id[r][0] = item.session->seq;
      b.logits[r] = Outputs(item, j) ? 1 : 0;
    }
  }
  b.n_tokens = r;
  return first_row;
}

// ---- test-only faults (option fault=NAME): each edits one column of the laid-out batch, or the
// map from output rows to batch rows, the way a serving engine's batching bug would ----

// batch-shared-positions: the positions are filled once, for item 0, and every item reads them:
// item i's token j sits at item 0's position j (its last one past its end). An item longer than
// item 0 stacks its last tokens on one position, where they see each other. llama.cpp refuses the
// batch when a non-empty session's length differs from item 0's (its positions would not follow
// its last one). The plainer bug, every item starting at item 0's position, never gets as far as
// wrong logits here: llama.cpp refuses it for a non-empty session, and on an empty one RoPE's
// relative positions hide the shift (measured 3.3e-6).
void ShareItem0Positions(llama_batch& b, const kvdiff_batch_item* items, int64_t n_items,
                         const std::vector<int32_t>& first_row) {
  for (int64_t i = 1; i < n_items; ++i) {
    for (int64_t j = 0; j < items[i].n; ++j)
      b.pos[first_row[i] + j] = b.pos[std::min<int64_t>(j, items[0].n - 1)];
  }
}

// batch-one-seq: every token under item 0's sequence id, so each item attends to item 0's history
// and to the other items' tokens. llama.cpp's own batch checks refuse most such batches (positions
// that skip or run backwards within a sequence); a decode step of conversations of equal length,
// one token each, passes them and runs with wrong logits.
void PutAllUnderItem0Seq(llama_batch& b) {
  for (int32_t r = 1; r < b.n_tokens; ++r) b.seq_id[r][0] = b.seq_id[0][0];
}

// batch-rows-swapped: items 0 and 1 read each other's first flagged row (output rows mis-mapped).
// `sources` is the batch row behind each output row, items in order.
void SwapFirstRowsOfItems0And1(const kvdiff_batch_item* items, int64_t n_items,
                               std::vector<int32_t>& sources) {
  const int64_t rows0 = OutputRows(items[0]);
  if (n_items >= 2 && rows0 > 0 && OutputRows(items[1]) > 0) std::swap(sources[0], sources[rows0]);
}

// ---- the one decode ----

// Every item's sequence forgets the positions the call added (the sessions' lengths are still the
// old ones).
void Restore(kvdiff_engine* e, const kvdiff_batch_item* items, int64_t n_items) {
  for (int64_t i = 0; i < n_items; ++i) {
    const kvdiff_session& s = *items[i].session;
    llama_memory_seq_rm(Memory(e), s.seq, static_cast<llama_pos>(s.length), -1);
  }
}

// llama_decode of the laid-out batch. On failure the sessions are restored: llama.cpp restores its
// memory itself on some failures but leaves the processed micro-batches in it on others (llama.h,
// llama_decode).
void Decode(kvdiff_engine* e, llama_batch& b, const kvdiff_batch_item* items, int64_t n_items) {
  ForgetLogErrors();
  const int32_t status = llama_decode(e->ctx, b);
  if (status == 0) {
    ++e->decodes;
    return;
  }
  Restore(e, items, n_items);
  const std::string what =
      n_items == 1 ? fmt::format("{} tokens at position {}", b.n_tokens, items[0].session->length)
                   : fmt::format("{} tokens of {} items", b.n_tokens, n_items);
  throw EngineError(fmt::format("llama_decode of {} returned {}{}", what, status, LastLogError()));
}

// Writes the flagged rows item by item into `logits`. Each is read by its batch row:
// llama_get_logits_ith maps the row to wherever llama.cpp stored its output, so nothing here
// assumes llama.cpp's output order.
void CopyOutputs(const kvdiff_engine* e, const kvdiff_batch_item* items, int64_t n_items,
                 const std::vector<int32_t>& first_row, BatchFault fault, float* logits) {
  std::vector<int32_t> sources;  // [output rows]: the batch row behind each
  for (int64_t i = 0; i < n_items; ++i) {
    for (int64_t j = 0; j < items[i].n; ++j)
      if (Outputs(items[i], j)) sources.push_back(first_row[i] + static_cast<int32_t>(j));
  }
  if (fault == BatchFault::kRowsSwapped) SwapFirstRowsOfItems0And1(items, n_items, sources);
  for (size_t k = 0; k < sources.size(); ++k) {
    const float* row = llama_get_logits_ith(e->ctx, sources[k]);
    if (!row) {
      throw EngineError(fmt::format("llama.cpp returned no logits for batch row {}{}", sources[k],
                                    LastLogError()));
    }
    std::memcpy(logits + k * e->vocab, row, static_cast<size_t>(e->vocab) * sizeof(float));
  }
}

// Lays out, decodes and reads back checked items; advances every session only when all of it
// worked, and otherwise restores them.
void Run(kvdiff_engine* e, const kvdiff_batch_item* items, int64_t n_items, float* logits,
         BatchFault fault) {
  int64_t n_tokens = 0;
  for (int64_t i = 0; i < n_items; ++i) n_tokens += items[i].n;
  OwnedBatch batch(n_tokens);
  const std::vector<int32_t> first_row = Fill(batch.get(), items, n_items);
  if (fault == BatchFault::kSharedPositions)
    ShareItem0Positions(batch.get(), items, n_items, first_row);
  if (fault == BatchFault::kOneSeq) PutAllUnderItem0Seq(batch.get());
  Decode(e, batch.get(), items, n_items);
  try {
    CopyOutputs(e, items, n_items, first_row, fault, logits);
  } catch (...) {
    Restore(e, items, n_items);
    throw;
  }
  for (int64_t i = 0; i < n_items; ++i) items[i].session->length += items[i].n;
}

}  // namespace

void Append(kvdiff_session* s, const int32_t* tokens, int64_t n, float* logits, int64_t capacity) {
  const kvdiff_batch_item item = {s, tokens, n, nullptr};
  CheckItem(s->engine, item, "");
  if (!logits || capacity < n * s->engine->vocab) {
    throw InputError(fmt::format("logits buffer holds {} floats, {} tokens x vocab {} need {}",
                                 capacity, n, s->engine->vocab, n * s->engine->vocab));
  }
  Run(s->engine, &item, 1, logits, BatchFault::kNone);
}

void AppendBatch(kvdiff_engine* e, const kvdiff_batch_item* items, int64_t n_items, float* logits,
                 int64_t capacity) {
  CheckBatch(e, items, n_items, logits, capacity);
  Run(e, items, n_items, logits, e->options.fault);
}

}  // namespace kvdiff::llama_cpp
