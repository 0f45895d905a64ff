// Argument parsing shared by the subcommands.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "format/tensor.h"

namespace kvdiff::cli {

// "1,2,3" or "1 2 3" -> {1, 2, 3}. Every item must be a whole non-negative integer: "1,x,3",
// "1,,3", "1.5" are refused (InputError) naming the flag and the offending item.
std::vector<int64_t> ParseIntList(const std::string& flag, const std::string& text);

// ParseIntList, then every id checked against the vocabulary when vocab_size >= 0.
Tokens ParseTokenIds(const std::string& flag, const std::string& text, int64_t vocab_size = -1);

}  // namespace kvdiff::cli
