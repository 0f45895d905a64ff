// The one gate every input file passes before kvdiff reads it: it must be a regular file (not a
// directory, /dev/zero, a FIFO or a socket) and, for files read whole into memory, no larger than
// a documented bound. Each refusal is an InputError naming the file and what it should have been.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

namespace kvdiff::format {

// The largest text file kvdiff reads whole (scenarios, config.json, tokenizer.json, golden files,
// chat messages): 64 MiB. The largest real one kvdiff reads is a tokenizer.json of ~9 MB (Llama 3).
inline constexpr uint64_t kMaxTextFileBytes = uint64_t{64} << 20;

// Checks that `path` is a regular file of at most `max_bytes` bytes and returns its size.
// `what` names the kind of file for the message: "cannot read scenario DIR: it is a directory,
// expected a file".
uint64_t CheckInputFile(const std::filesystem::path& path, const std::string& what,
                        uint64_t max_bytes = UINT64_MAX);

// CheckInputFile, then the whole file. Reads at most max_bytes even if the file grows meanwhile.
std::string ReadInputFile(const std::filesystem::path& path, const std::string& what,
                          uint64_t max_bytes = kMaxTextFileBytes);

}  // namespace kvdiff::format
