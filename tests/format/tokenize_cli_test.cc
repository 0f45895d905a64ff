// `kvdiff tokenize` through the built binary on a hand-written tokenizer.json
// (tokenizer_fixtures.h): ids, --decode, --json, --chat, and exit code 2 with a message for bad
// files.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>

#include "tests/format/tokenizer_fixtures.h"
#include "tests/test_support.h"

namespace kvdiff::format {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

using Result = testing::CommandResult;

class TokenizeCli : public ::testing::Test {
 protected:
  void SetUp() override {
    std::ofstream(dir_ / "tokenizer.json") << testing::ByteFallbackFile().dump();
    std::ofstream(dir_ / "tokenizer_config.json")
        << json({{"bos_token", "<s>"},
                 {"eos_token", "</s>"},
                 {"chat_template",
                  "{% for m in messages %}{{ bos_token + m['role'] + ' ' + m['content'] }}"
                  "{% endfor %}{% if add_generation_prompt %}{{ ' hi' }}{% endif %}"}})
               .dump();
  }
  Result Run(const std::string& args) {
    return testing::RunKvdiff(
        "tokenize --model " + testing::ShellQuote(dir_.path().string()) + " " + args, dir_.path());
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
  EXPECT_THAT(r.err, HasSubstr("tokenizer.json: tokenizer.json: invalid JSON"));

  json t = testing::ByteFallbackFile();
  t["pre_tokenizer"] = {{"type", "BertPreTokenizer"}};
  std::ofstream(dir_ / "tokenizer.json") << t.dump();
  r = Run("--text hi");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("pre_tokenizer: type \"BertPreTokenizer\" is not implemented"));

  std::ofstream(dir_ / "tokenizer.json") << testing::ByteFallbackFile().dump();
  std::ofstream(dir_ / "tokenizer_config.json")
      << json({{"chat_template", "{% macro x %}"}}).dump();
  std::ofstream(dir_ / "chat.txt") << "user: hi\n";
  r = Run("--chat '" + (dir_ / "chat.txt").string() + "'");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("{% macro %} is not implemented"));
}

// GPT-2's byte map for one byte (the test's own copy), as UTF-8.
std::string ByteChar(int b) {
  auto printable = [](int k) {
    return (k >= 33 && k <= 126) || (k >= 161 && k <= 172) || k >= 174;
  };
  int cp = b;
  if (!printable(b)) {
    cp = 256;
    for (int k = 0; k < b; ++k) cp += printable(k) ? 0 : 1;
  }
  std::string s;
  if (cp < 0x80) return std::string(1, static_cast<char>(cp));
  s += static_cast<char>(0xC0 | (cp >> 6));
  s += static_cast<char>(0x80 | (cp & 0x3F));
  return s;
}

// A random tiny model (vocab 256) with a byte-level tokenizer.json of exactly 256 ids (SmolLM2's
// pipeline: Digits, then ByteLevel with the GPT-2 regex) and a chat template: every command that
// takes text must go through it.
TEST_F(TokenizeCli, GenerateInfoAndScenarioTextUseTokenizerJson) {
  const std::string model = (dir_ / "m").string();
  const std::string make = std::string("'") + KVDIFF_BINARY +
                           "' make-model --preset tiny --seed 3 --out '" + model + "' >/dev/null";
  ASSERT_EQ(std::system(make.c_str()), 0);
  json vocab;
  for (int b = 0; b < 256; ++b) vocab[ByteChar(b)] = b;
  const json bytes = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  std::ofstream(dir_ / "m" / "tokenizer.json")
      << json({{"added_tokens", json::array()},
               {"pre_tokenizer",
                {{"type", "Sequence"},
                 {"pretokenizers", {{{"type", "Digits"}, {"individual_digits", true}}, bytes}}}},
               {"post_processor", {{"type", "ByteLevel"}}},
               {"decoder", {{"type", "ByteLevel"}}},
               {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}}}})
             .dump();
  std::ofstream(dir_ / "m" / "tokenizer_config.json")
      << json(
             {{"chat_template",
               "{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '\\n' }}{% endfor %}"}})
             .dump();
  std::ofstream(dir_ / "chat.txt") << "user: Hi\n";
  std::ofstream(dir_ / "scenario.json")
      << json({{"model", {{"path", model}}},
               {"steps",
                {{{"op", "prefill"}, {"text", "Hi 12"}, {"chunks", {2, 3}}},
                 {{"op", "decode"}, {"n", 2}}}}})
             .dump();
  auto run = [&](const std::string& args) {
    const auto out = dir_ / "out.txt";
    const std::string command =
        std::string("'") + KVDIFF_BINARY + "' " + args + " >'" + out.string() + "' 2>&1";
    const int status = std::system(command.c_str());
    return std::make_pair(WIFEXITED(status) ? WEXITSTATUS(status) : -1, testing::ReadFile(out));
  };
  auto [code, out] = run("generate --model '" + model + "' --prompt 'Hi 12' -n 2 --ids");
  EXPECT_EQ(code, 0) << out;
  std::tie(code, out) = run("generate --model '" + model + "' --chat '" +
                            (dir_ / "chat.txt").string() + "' -n 2 --ids");
  EXPECT_EQ(code, 0) << out;
  std::tie(code, out) = run("info --model '" + model + "'");
  EXPECT_EQ(code, 0) << out;
  EXPECT_THAT(out, HasSubstr("tokenizer     tokenizer.json: BPE, 256 ids"));
  EXPECT_THAT(out, HasSubstr("pre_tokenizer Sequence Digits ByteLevel"));
  EXPECT_THAT(out, HasSubstr("chat template tokenizer_config.json (parsed)"));
  // "Hi 12": "Hi", " ", "1", "2" (Digits isolates each digit) = 5 byte tokens, split 2+3.
  std::tie(code, out) = run("run '" + (dir_ / "scenario.json").string() + "'");
  EXPECT_EQ(code, 0) << out;
  EXPECT_THAT(out, HasSubstr("prefill(main,n=5,chunks=2+3)"));
  std::tie(code, out) = run("tokenize --model '" + model + "' --text 'Hi 12'");
  EXPECT_EQ(out, "72 105 32 49 50\n");
}

}  // namespace
}  // namespace kvdiff::format
