// `kvdiff tokenize` through the built binary on a hand-written tokenizer.json: ids, --decode,
// --json, --chat, and exit code 2 with a message for bad files.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/test_support.h"

namespace kvdiff::format {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

struct Result {
  int exit_code;
  std::string out, err;
};

std::string Slurp(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// SentencePiece-style: <unk> <s> </s>, <0x00>..<0xFF> (ids 3..258), ▁ h i ▁h ▁hi (259..263).
json TinyTokenizer() {
  json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
  for (int b = 0; b < 256; ++b) vocab[fmt::format("<0x{:02X}>", b)] = 3 + b;
  vocab["▁"] = 259;
  vocab["h"] = 260;
  vocab["i"] = 261;
  vocab["▁h"] = 262;
  vocab["▁hi"] = 263;
  return {{"added_tokens",
           {{{"id", 1}, {"content", "<s>"}, {"special", true}},
            {{"id", 2}, {"content", "</s>"}, {"special", true}}}},
          {"normalizer",
           {{"type", "Sequence"},
            {"normalizers",
             {{{"type", "Prepend"}, {"prepend", "▁"}},
              {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "▁"}}}}}},
          {"pre_tokenizer", nullptr},
          {"post_processor",
           {{"type", "TemplateProcessing"},
            {"single",
             {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
              {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
            {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}}},
          {"decoder",
           {{"type", "Sequence"},
            {"decoders",
             {{{"type", "Replace"}, {"pattern", {{"String", "▁"}}}, {"content", " "}},
              {{"type", "ByteFallback"}},
              {{"type", "Fuse"}},
              {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}},
          {"model",
           {{"type", "BPE"},
            {"unk_token", "<unk>"},
            {"byte_fallback", true},
            {"vocab", vocab},
            {"merges", {"▁ h", "▁h i"}}}}};
}

class TokenizeCli : public ::testing::Test {
 protected:
  void SetUp() override {
    std::ofstream(dir_ / "tokenizer.json") << TinyTokenizer().dump();
    std::ofstream(dir_ / "tokenizer_config.json")
        << json({{"bos_token", "<s>"},
                 {"eos_token", "</s>"},
                 {"chat_template",
                  "{% for m in messages %}{{ bos_token + m['role'] + ' ' + m['content'] }}"
                  "{% endfor %}{% if add_generation_prompt %}{{ ' hi' }}{% endif %}"}})
               .dump();
  }
  Result Run(const std::string& args) {
    const auto out = dir_ / "stdout.txt", err = dir_ / "stderr.txt";
    const std::string command = std::string("'") + KVDIFF_BINARY + "' tokenize --model '" +
                                dir_.path().string() + "' " + args + " >'" + out.string() +
                                "' 2>'" + err.string() + "'";
    const int status = std::system(command.c_str());
    return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), Slurp(out),
            Slurp(err)};
  }
  testing::TempDir dir_;
};

TEST_F(TokenizeCli, TextGivesIdsWithBos) {
  Result r = Run("--text 'hi é'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "1 263 259 198 172\n");  // <s> ▁hi ▁ <0xC3> <0xA9>
  r = Run("--text 'hi é' --no-special");
  EXPECT_EQ(r.out, "263 259 198 172\n");
}

TEST_F(TokenizeCli, DecodeAndJson) {
  Result r = Run("--decode 263,259,198,172");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "hi é\n");
  r = Run("--text hi --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(json::parse(r.out), json({{"ids", {1, 263}}, {"text", "<s> hi"}}));
}

TEST_F(TokenizeCli, ChatRendersTheTemplateThenEncodesWithoutAddingBos) {
  std::ofstream(dir_ / "chat.txt") << "hi: hi\n";
  Result r = Run("--chat '" + (dir_ / "chat.txt").string() + "' --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json out = json::parse(r.out);
  EXPECT_EQ(out["prompt"], "<s>hi hi hi");
  EXPECT_EQ(out["ids"], json({1, 263, 263, 263}));  // <s>, then "▁hi▁hi▁hi" (no second BOS)
}

TEST_F(TokenizeCli, BadFilesExitTwoWithTheReason) {
  std::ofstream(dir_ / "tokenizer.json") << "{\"model\": [";
  Result r = Run("--text hi");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("tokenizer.json: tokenizer.json is not valid JSON"));

  json t = TinyTokenizer();
  t["pre_tokenizer"] = {{"type", "BertPreTokenizer"}};
  std::ofstream(dir_ / "tokenizer.json") << t.dump();
  r = Run("--text hi");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("pre_tokenizer: type \"BertPreTokenizer\" is not implemented"));

  std::ofstream(dir_ / "tokenizer.json") << TinyTokenizer().dump();
  std::ofstream(dir_ / "tokenizer_config.json") << json({{"chat_template", "{% macro x %}"}}).dump();
  std::ofstream(dir_ / "chat.txt") << "user: hi\n";
  r = Run("--chat '" + (dir_ / "chat.txt").string() + "'");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("{% macro %} is not implemented"));
}

}  // namespace
}  // namespace kvdiff::format
