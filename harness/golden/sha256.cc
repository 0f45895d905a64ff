#include "harness/golden/sha256.h"

#include <fmt/format.h>
#include <openssl/evp.h>

#include <fstream>
#include <memory>
#include <vector>

#include "format/error.h"

namespace kvdiff::harness {
namespace {

// One SHA-256 computation: Update as often as needed, then HexDigest once.
class Digest {
 public:
  Digest() : context_(EVP_MD_CTX_new(), EVP_MD_CTX_free) {
    KVDIFF_CHECK(context_ && EVP_DigestInit_ex(context_.get(), EVP_sha256(), nullptr) == 1,
                 "OpenSSL could not start a SHA-256 digest");
  }
  void Update(const void* data, size_t size) {
    KVDIFF_CHECK(EVP_DigestUpdate(context_.get(), data, size) == 1,
                 "OpenSSL's SHA-256 refused {} bytes", size);
  }
  std::string HexDigest() {
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int size = 0;
    KVDIFF_CHECK(EVP_DigestFinal_ex(context_.get(), digest, &size) == 1,
                 "OpenSSL could not finish a SHA-256 digest");
    std::string hex;
    for (unsigned int i = 0; i < size; ++i) hex += fmt::format("{:02x}", digest[i]);
    return hex;
  }

 private:
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> context_;
};

}  // namespace

std::string Sha256Hex(const std::string& bytes) {
  Digest digest;
  digest.Update(bytes.data(), bytes.size());
  return digest.HexDigest();
}

std::string Sha256File(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  KVDIFF_CHECK(in.good(), "cannot read {} to hash it", path.string());
  Digest digest;
  std::vector<char> buffer(1 << 16);
  while (in) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    digest.Update(buffer.data(), static_cast<size_t>(in.gcount()));
  }
  KVDIFF_CHECK(in.eof(), "cannot read {} to hash it", path.string());
  return digest.HexDigest();
}

}  // namespace kvdiff::harness
