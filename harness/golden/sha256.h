// SHA-256 (FIPS 180-4), to record which model file a golden was made from. Written here instead of
// taking on a crypto library for one hash of a few files.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>

namespace kvdiff::harness {

class Sha256 {
 public:
  Sha256();
  void Update(const void* data, size_t size);
  void Update(const std::string& text) { Update(text.data(), text.size()); }
  // 64 lowercase hex digits. Finishes the hash: call once, then discard the object.
  std::string HexDigest();

 private:
  void Block(const uint8_t* block);  // one 64-byte block
  uint32_t state_[8];
  uint8_t buffer_[64];
  size_t buffered_ = 0;
  uint64_t total_bytes_ = 0;
};

std::string Sha256Hex(const std::string& bytes);
// Streams the file; InputError naming the path when it cannot be read.
std::string Sha256File(const std::filesystem::path& path);

}  // namespace kvdiff::harness
