// The llama.cpp engine's options (engine.h's "key=value" text): parsed and checked before llama.cpp
// sees any of them, so a bad value is refused with its name and what is accepted.
#pragma once

#include <cstdint>
#include <string>

#include "format/safetensors.h"

namespace kvdiff::llama_cpp {

// Test-only bugs in append_batch (option fault=NAME), each one a way a serving engine's batching
// goes wrong, so tests can show kvdiff's batch checks catch them. Single appends never see them.
enum class BatchFault {
  kNone,
  kSharedPositions,  // batch-shared-positions: positions filled once, for item 0, read by all
  kRowsSwapped,      // batch-rows-swapped: items 0 and 1 get each other's first output row
  kOneSeq,           // batch-one-seq: every token under item 0's sequence id
};

struct Options {
  std::string kv = "f32";
  bool flash_attn = false;
  int threads = 1;
  int64_t max_length = 0;  // 0: from the model
  int64_t sessions = 8;
  int64_t ubatch = 0;  // 0: min(max_length, 512)
  int64_t batch = 0;   // 0: max_length x sessions
  BatchFault fault = BatchFault::kNone;
  format::DType weights = format::DType::kF32;
};

// Whether a kv= type packs rows in quantized blocks of 32 (q8_0, q4_0): llama.cpp then needs
// flash attention and a head_dim the block divides.
bool IsQuantized(const std::string& kv);

// Options from engine.h's text (NULL or "" for defaults); InputError naming a bad key or value.
Options ParseOptions(const char* text);

}  // namespace kvdiff::llama_cpp
