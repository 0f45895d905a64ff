// The real-model anchor, end to end through the command line: `kvdiff convert llama2c` on
// stories260K, then `kvdiff generate` greedy from BOS on every backend this build has, cached and
// uncached. All paths must produce the same tokens, and the text must begin with the story the
// data README documents. Also the commands' refusals (exit code 2 and the message).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/test_support.h"

namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// `kvdiff ARGS...` in dir, each argument one shell word.
kvdiff::testing::CommandResult Kvdiff(const std::vector<std::string>& args,
                                      const kvdiff::testing::TempDir& dir) {
  std::string line;
  for (const std::string& a : args) line += " " + kvdiff::testing::ShellQuote(a);
  return kvdiff::testing::RunKvdiff(line, dir.path());
}

// Built twice: without KVDIFF_ANCHOR_REF the anchor runs impl (and the refusal tests run); with it
// (a "torch"-labelled target) the anchor runs impl and ref and compares them.
#ifdef KVDIFF_ANCHOR_REF
#define KVDIFF_ANCHOR_SUITE Llama2cGenerateRefTest
std::vector<std::string> Backends() { return {"impl", "ref"}; }
#else
#define KVDIFF_ANCHOR_SUITE Llama2cGenerateTest
std::vector<std::string> Backends() { return {"impl"}; }
#endif

constexpr const char* kAnchor =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park.";

TEST(KVDIFF_ANCHOR_SUITE, Stories260KGreedyFromBosOnEveryPath) {
  KVDIFF_REQUIRE_SHARED_DATA(data);
  kvdiff::testing::TempDir dir;
  const auto model = dir / "stories260K";
  kvdiff::testing::CommandResult convert = Kvdiff(
      {"convert", "llama2c", "--checkpoint", (data / "stories260K" / "stories260K.bin").string(),
       "--tokenizer", (data / "stories260K" / "tok512.bin").string(), "--out", model.string()},
      dir);
  ASSERT_EQ(convert.exit_code, 0) << convert.err;
  EXPECT_THAT(convert.out, HasSubstr("tokenizer.kvdiff.json"));

  // 40 tokens reach past "park." (about 25 tokens) with room to spare.
  const std::string n = "40";
  std::string first_ids;
  for (const std::string& backend : Backends()) {
    for (const std::string mode : {"--cached", "--uncached"}) {
      const std::string path = backend + " " + mode;
      kvdiff::testing::CommandResult ids =
          Kvdiff({"generate", "--model", model.string(), "--prompt", "", "-n", n, "--backend",
                  backend, mode, "--ids"},
                 dir);
      ASSERT_EQ(ids.exit_code, 0) << path << ": " << ids.err;
      if (first_ids.empty()) {
        first_ids = ids.out;
      } else {
        EXPECT_EQ(ids.out, first_ids) << path << " departs from " << Backends()[0] << " --cached";
      }
      kvdiff::testing::CommandResult text =
          Kvdiff({"generate", "--model", model.string(), "--prompt", "", "-n", n, "--backend",
                  backend, mode},
                 dir);
      ASSERT_EQ(text.exit_code, 0) << path << ": " << text.err;
      EXPECT_THAT(text.out, StartsWith(kAnchor)) << path;
    }
  }
  // The ids line holds 40 space-separated ids in range (no early stop at BOS/EOS this soon).
  std::stringstream ss(first_ids);
  int id, count = 0;
  while (ss >> id) {
    EXPECT_GE(id, 0);
    EXPECT_LT(id, 512);
    ++count;
  }
  EXPECT_EQ(count, 40);

  // --tokens 1 is the same start as --prompt "" (which encodes to BOS alone).
  kvdiff::testing::CommandResult from_ids =
      Kvdiff({"generate", "--model", model.string(), "--tokens", "1", "-n", n, "--ids"}, dir);
  ASSERT_EQ(from_ids.exit_code, 0) << from_ids.err;
  EXPECT_EQ(from_ids.out, first_ids);

  // A text prompt is echoed, then continued.
  kvdiff::testing::CommandResult prompted = Kvdiff(
      {"generate", "--model", model.string(), "--prompt", "Once upon a time, Lily", "-n", "10"},
      dir);
  ASSERT_EQ(prompted.exit_code, 0) << prompted.err;
  EXPECT_THAT(prompted.out, StartsWith("Once upon a time, Lily"));
  EXPECT_GT(prompted.out.size(), std::string("Once upon a time, Lily").size() + 10);
}

#ifndef KVDIFF_ANCHOR_REF
TEST(Llama2cGenerateTest, CommandsRefuseBadInput) {
  KVDIFF_REQUIRE_SHARED_DATA(data);
  kvdiff::testing::TempDir dir;
  // A truncated checkpoint: exit 2, expected vs actual bytes, nothing written.
  {
    std::ifstream in(data / "stories260K" / "stories260K.bin", std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream out(dir / "cut.bin", std::ios::binary);
    out << bytes.substr(0, 1000000);
  }
  kvdiff::testing::CommandResult cut =
      Kvdiff({"convert", "llama2c", "--checkpoint", (dir / "cut.bin").string(), "--out",
              (dir / "cut").string()},
             dir);
  EXPECT_EQ(cut.exit_code, 2);
  EXPECT_THAT(cut.err,
              HasSubstr("implies 1056540 bytes (tied classifier), the file has 1000000 bytes"));
  EXPECT_FALSE(std::filesystem::exists(dir / "cut"));

  // A model converted without a tokenizer: --prompt is refused, --tokens --ids works.
  const auto model = dir / "notok";
  ASSERT_EQ(Kvdiff({"convert", "llama2c", "--checkpoint",
                    (data / "stories260K" / "stories260K.bin").string(), "--out", model.string()},
                   dir)
                .exit_code,
            0);
  kvdiff::testing::CommandResult no_tok =
      Kvdiff({"generate", "--model", model.string(), "--prompt", "Hi", "-n", "3"}, dir);
  EXPECT_EQ(no_tok.exit_code, 2);
  EXPECT_THAT(no_tok.err, HasSubstr("has no tokenizer.kvdiff.json"));
  kvdiff::testing::CommandResult ids =
      Kvdiff({"generate", "--model", model.string(), "--tokens", "1,403", "-n", "3", "--ids"}, dir);
  EXPECT_EQ(ids.exit_code, 0) << ids.err;
  kvdiff::testing::CommandResult bad_id =
      Kvdiff({"generate", "--model", model.string(), "--tokens", "1,512", "-n", "3", "--ids"}, dir);
  EXPECT_EQ(bad_id.exit_code, 2);
  EXPECT_THAT(bad_id.err,
              HasSubstr("--tokens: token id 512 at index 1 is out of range for vocab_size 512"));
  kvdiff::testing::CommandResult both = Kvdiff(
      {"generate", "--model", model.string(), "--tokens", "1", "--ids", "--cached", "--uncached"},
      dir);
  EXPECT_EQ(both.exit_code, 2);
}
#endif

}  // namespace
