// What an opened llama.cpp engine and its sessions hold, shared by the engine's files
// (llama_cpp_engine.cc: open, sessions and the ABI table; decode.cc: both appends; shift.cc: the
// context shift).
#pragma once

#include <llama.h>

#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "engines/llama_cpp/options.h"
#include "format/error.h"
#include "kvdiff/engine.h"

// engine.h's opaque types. One llama_context per engine; each session is one sequence id of its
// unified KV memory.
struct kvdiff_engine {
  llama_model* model = nullptr;
  llama_context* ctx = nullptr;
  kvdiff::llama_cpp::Options options;
  int64_t vocab = 0;
  int64_t max_length = 0;
  int64_t n_batch = 0;         // the most tokens one call takes (all items of a batch together)
  std::vector<bool> seq_used;  // [sessions]: whether a live session owns the sequence id
  int64_t decodes = 0;         // successful llama_decode calls: each applies pending K-shifts
  std::vector<kvdiff_size> sizes;
  std::string cache_dtype;
  std::string error;
  ~kvdiff_engine() {
    if (ctx) llama_free(ctx);
    if (model) llama_model_free(model);
  }
};

struct kvdiff_session {
  kvdiff_engine* engine = nullptr;
  llama_seq_id seq = -1;
  int64_t length = 0;  // positions 0..length-1 of `seq` are in the engine's memory
  // A fork shares its parent's cells (llama_memory_seq_cp); llama_memory_seq_add would move a
  // shared cell for every sequence in it, so a shift first gives the session cells of its own.
  bool may_share = false;
  // e->decodes when a shift (this session's, or its parent's before a fork) left its cells with a
  // K-shift that llama.cpp applies at the next llama_decode; -1: none.
  int64_t shifted_at = -1;
  std::string error;
};

namespace kvdiff::llama_cpp {

// The error lines llama.cpp logged since ForgetLogErrors(), as " (line; line)", or "" when there
// are none: llama.cpp says why a call failed only through its log. One log for every engine of
// the process, as llama.cpp's callback is global.
void ForgetLogErrors();
std::string LastLogError();

inline llama_memory_t Memory(const kvdiff_engine* e) { return llama_get_memory(e->ctx); }

// Runs f; turns an exception into a status and the object's error string.
template <typename F>
kvdiff_status Guard(std::string& error, F&& f) {
  try {
    f();
    return KVDIFF_OK;
  } catch (const kvdiff::InputError& e) {
    error = e.what();
    return KVDIFF_INVALID_INPUT;
  } catch (const std::exception& e) {
    error = e.what();
    return KVDIFF_ENGINE_FAILURE;
  }
}

}  // namespace kvdiff::llama_cpp
