// The llama.cpp engine's context shift (engine.h ABI 3), as llama.cpp's server makes one when a
// conversation reaches the end of its context (n_keep, n_discard): llama_memory_seq_rm of the
// dropped positions, then llama_memory_seq_add of -discard to the later ones, whose keys
// llama.cpp re-rotates by the accumulated delta (its K-shift) at the next llama_decode.
#pragma once

#include <cstdint>

#include "engines/llama_cpp/engine_state.h"

namespace kvdiff::llama_cpp {

// InputError (nothing changed) unless 0 <= keep, 0 <= discard, keep + discard <= the length, or
// when the model's memory cannot shift; discard 0 changes nothing. A session that may share cells
// with a fork gets cells of its own first (shift.cc says why).
void Shift(kvdiff_session* s, int64_t keep, int64_t discard);

}  // namespace kvdiff::llama_cpp
