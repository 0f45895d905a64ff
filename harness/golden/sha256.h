// SHA-256 of the files a golden was made from (its scenario, rows and model files), computed by
// OpenSSL's libcrypto (Debian's libssl-dev).
#pragma once

#include <filesystem>
#include <string>

namespace kvdiff::harness {

// 64 lowercase hex digits.
std::string Sha256Hex(const std::string& bytes);
// Streams the file; InputError naming the path when it cannot be read.
std::string Sha256File(const std::filesystem::path& path);

}  // namespace kvdiff::harness
