// The GGUF a llama.cpp engine loads: a .gguf path as it is, or an HF directory converted by
// kvdiff's own writer (format/gguf.h) into a cache keyed by a hash of its files.
#pragma once

#include <filesystem>

#include "format/safetensors.h"

namespace kvdiff::llama_cpp {

// model itself when it is a .gguf file; otherwise its GGUF conversion with weights in `dtype`, made
// once into $KVDIFF_GGUF_CACHE (default ~/.cache/kvdiff/gguf) under a name hashed from its files.
std::filesystem::path GgufFor(const std::filesystem::path& model, format::DType dtype);

// A conversion cache entry is used only when its bytes still hash to what was recorded when it was
// written: llama.cpp aborts the process on some edits (a layer count of 0), and reads others as
// different weights. InputError naming both hashes otherwise.
void CheckCacheEntry(const std::filesystem::path& gguf);

}  // namespace kvdiff::llama_cpp
