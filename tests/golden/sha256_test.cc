// SHA-256 against the FIPS 180-2 example vectors, a file read in pieces, and a real model file.
#include "harness/golden/sha256.h"

#include <gtest/gtest.h>

#include <string>

#include "format/error.h"
#include "tests/test_support.h"

namespace kvdiff::harness {
namespace {

TEST(Sha256, FipsVectors) {
  EXPECT_EQ(Sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Sha256Hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(Sha256Hex("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnop"
                      "jklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu"),
            "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
  EXPECT_EQ(Sha256Hex(std::string(1000000, 'a')),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

// A file longer than the buffer Sha256File reads it with (64 KiB) hashes as its bytes do.
TEST(Sha256, AFileReadInPiecesHashesAsItsBytes) {
  testing::TempDir dir;
  std::string text;
  for (size_t i = 0; i < 200000; ++i) text += static_cast<char>('a' + (i * 7) % 26);
  testing::WriteFile(dir / "big.bin", text);
  EXPECT_EQ(Sha256File(dir / "big.bin"), Sha256Hex(text));
  EXPECT_NE(Sha256Hex(text), Sha256Hex(text.substr(1)));
}

TEST(Sha256, FileMatchesPublishedHash) {
  KVDIFF_REQUIRE_SHARED_DATA(data);
  // The hashes published in ../shared/data/stories260K/README.md.
  EXPECT_EQ(Sha256File(data / "stories260K" / "stories260K.bin"),
            "b0a507e7ad0f626624f17112325e66691f9076d622e1d3274d103d00299f2696");
  EXPECT_EQ(Sha256File(data / "stories260K" / "tok512.bin"),
            "037cb335abb25d1fa9e8ecae30ed2a3a8ace9302862ebcdc05d51a6bbb10c312");
}

TEST(Sha256, MissingFileNamesThePath) {
  try {
    Sha256File("/nonexistent/kvdiff/model.safetensors");
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/kvdiff/model.safetensors"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace kvdiff::harness
