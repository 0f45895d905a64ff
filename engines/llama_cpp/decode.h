// The llama.cpp engine's two appends (engine.h's append and append_batch), both ONE llama_decode of
// ONE llama_batch over the engine's context: each item's tokens under its session's sequence id at
// the session's next positions, logits asked for the flagged rows only. So a batched call is what
// llama.cpp's server does with its slots, and llama.cpp's own cell allocation, attention masks and
// micro-batch (n_ubatch) split are what kvdiff holds to each conversation's uncached forward.
#pragma once

#include <cstdint>

#include "engines/llama_cpp/engine_state.h"
#include "kvdiff/engine.h"

namespace kvdiff::llama_cpp {

// engine.h's append: positions length..length+n-1 of one session, logits for every row.
void Append(kvdiff_session* s, const int32_t* tokens, int64_t n, float* logits, int64_t capacity);

// engine.h's append_batch: every item in one decode, flagged rows written item by item. Checks
// everything before llama.cpp runs (a refusal is InputError and changes nothing); a failure after
// that restores every item's session and throws EngineError. The engine's test-only fault, if any,
// applies here.
void AppendBatch(kvdiff_engine* e, const kvdiff_batch_item* items, int64_t n_items, float* logits,
                 int64_t capacity);

}  // namespace kvdiff::llama_cpp
