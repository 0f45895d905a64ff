// The llama.cpp engine's context shift (shift.h).
//
// Why a fork complicates it: a fork is llama_memory_seq_cp, which adds the new sequence id to the
// parent's cells instead of copying them (kv_unified: one pool of cells, shared prefixes), and
// llama_memory_seq_add moves a cell's position for EVERY sequence it holds. Shifting a session
// that shares cells with a fork would move the fork's positions too (kvdiff measured it: the
// fork's next decode refused as "inconsistent sequence positions", its twin off by 2.2). So a
// session that may share cells is first given cells of its own: its state copied out
// (llama_state_seq_get_data), its sequence id taken off the shared cells, the state copied back
// into free cells. The copy writes each cell's position and raw keys, not a K-shift llama.cpp still
// holds back for the next decode, so such pending shifts are applied first.
#include "engines/llama_cpp/shift.h"

#include <fmt/format.h>

#include <cstdint>
#include <vector>

#include "format/error.h"

namespace kvdiff::llama_cpp {
namespace {

// Applies every K-shift llama.cpp holds back (llama_decode applies them before it runs anything):
// one token decoded into a free sequence id, then forgotten.
void ApplyPendingShifts(kvdiff_engine* e) {
  llama_seq_id spare = -1;
  for (size_t i = 0; i < e->seq_used.size() && spare < 0; ++i)
    if (!e->seq_used[i]) spare = static_cast<llama_seq_id>(i);
  if (spare < 0) {
    throw EngineError(fmt::format(
        "shift: a session that shares cells with a fork, shifted again before any decode, needs a "
        "free sequence to apply llama.cpp's pending K-shift, and all {} are in use; open the "
        "engine with a larger sessions=N",
        e->seq_used.size()));
  }
  llama_batch b = llama_batch_init(1, 0, 1);
  b.n_tokens = 1;
  b.token[0] = 0;
  b.pos[0] = 0;
  b.n_seq_id[0] = 1;
  b.seq_id[0][0] = spare;
  b.logits[0] = 0;
  ForgetLogErrors();
  const int32_t status = llama_decode(e->ctx, b);
  llama_batch_free(b);
  llama_memory_seq_rm(Memory(e), spare, -1, -1);
  if (status != 0) {
    throw EngineError(
        fmt::format("shift: llama_decode of one token to apply the pending K-shift "
                    "returned {}{}",
                    status, LastLogError()));
  }
  ++e->decodes;
}

// Gives `s` cells no other sequence holds (the file's comment says why).
void OwnCells(kvdiff_session* s) {
  kvdiff_engine* e = s->engine;
  if (s->shifted_at == e->decodes) ApplyPendingShifts(e);
  std::vector<uint8_t> state(llama_state_seq_get_size(e->ctx, s->seq));
  if (llama_state_seq_get_data(e->ctx, state.data(), state.size(), s->seq) != state.size()) {
    throw EngineError(fmt::format(
        "shift: llama_state_seq_get_data of sequence {} ({} bytes) failed", s->seq, state.size()));
  }
  llama_memory_seq_rm(Memory(e), s->seq, -1, -1);  // the shared cells stay with the others
  ForgetLogErrors();
  if (llama_state_seq_set_data(e->ctx, state.data(), state.size(), s->seq) != state.size()) {
    const int64_t length = s->length;
    s->length = 0;  // its cells are gone: say so rather than pretend
    throw EngineError(fmt::format(
        "shift: llama_state_seq_set_data could not give sequence {} cells of its own ({} "
        "positions){}; the session is now empty",
        s->seq, length, LastLogError()));
  }
  s->may_share = false;
  s->shifted_at = -1;
}

}  // namespace

void Shift(kvdiff_session* s, int64_t keep, int64_t discard) {
  if (keep < 0 || discard < 0 || keep > s->length || discard > s->length - keep) {
    throw InputError(
        fmt::format("shift(keep={}, discard={}): expected 0 <= keep, 0 <= discard and keep + "
                    "discard <= {} (the session's length)",
                    keep, discard, s->length));
  }
  if (discard == 0) return;
  llama_memory_t memory = Memory(s->engine);
  if (!llama_memory_can_shift(memory)) {
    throw InputError(
        "shift: this model's llama.cpp memory cannot shift positions (llama_memory_can_shift)");
  }
  if (s->may_share) OwnCells(s);
  const auto p0 = static_cast<llama_pos>(keep), p1 = static_cast<llama_pos>(keep + discard);
  if (!llama_memory_seq_rm(memory, s->seq, p0, p1)) {
    throw EngineError(fmt::format("llama_memory_seq_rm(seq {}, {}, {}) failed", s->seq, p0, p1));
  }
  llama_memory_seq_add(memory, s->seq, p1, -1, -static_cast<llama_pos>(discard));
  s->length -= discard;
  s->shifted_at = s->engine->decodes;
}

}  // namespace kvdiff::llama_cpp
