// tokenizer.json with tiny hand-written files: each component on a case small enough to work out by
// hand, and the strict errors. The real Llama 2/3 files are checked against transformers.js in
// tokenizer_oracle_test.cc.
#include "format/tokenizer_json.h"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "format/error.h"
#include "format/tokenizer.h"
#include "tests/format/tokenizer_fixtures.h"

namespace kvdiff::format {
namespace {

using kvdiff::testing::ByteFallbackFile;
using nlohmann::json;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// GPT-2's bytes_to_unicode, written out again here as the test's own oracle.
std::string ByteChar(int b) {
  int cp = b;
  const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
  if (!printable) {
    int n = 0;
    for (int k = 0; k < b; ++k) {
      if (!((k >= 33 && k <= 126) || (k >= 161 && k <= 172) || k >= 174)) ++n;
    }
    cp = 256 + n;
  }
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

// Byte-level BPE: ids 0..255 are the bytes; merges build "Ġthere" and "hi"; "<|end|>" is special.
json ByteLevelFile(bool pair_merges = false) {
  json vocab;
  for (int b = 0; b < 256; ++b) vocab[ByteChar(b)] = b;
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"Ġ", "t"}, {"h", "e"}, {"Ġt", "he"}, {"r", "e"}, {"Ġthe", "re"}, {"h", "i"}};
  json merge_list = json::array();
  int id = 256;
  for (const auto& [a, b] : merges) {
    vocab[a + b] = id++;
    merge_list.push_back(pair_merges ? json::array({a, b}) : json(a + " " + b));
  }
  return {
      {"version", "1.0"},
      {"added_tokens",
       {{{"id", 262}, {"content", "<|end|>"}, {"special", true}, {"normalized", false}}}},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"post_processor", {{"type", "ByteLevel"}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merge_list}}}};
}

HfTokenizer Make(const json& j) { return HfTokenizer::Parse(j.dump()); }

TEST(TokenizerJson, ByteLevelMergesByRank) {
  const HfTokenizer t = Make(ByteLevelFile());
  // "hi" -> [hi]; " there": Ġ t h e r e -> Ġt (rank 0), he (1), Ġthe (2), re (3), Ġthere (4).
  EXPECT_THAT(t.Encode("hi there", true), ElementsAre(261, 260));
  EXPECT_THAT(t.Encode("hit", true), ElementsAre(261, 't'));
  EXPECT_EQ(t.Decode({261, 260}, false), "hi there");
  EXPECT_EQ(t.VocabSize(), 263);
}

TEST(TokenizerJson, PairMergesEqualStringMerges) {
  const HfTokenizer a = Make(ByteLevelFile(false));
  const HfTokenizer b = Make(ByteLevelFile(true));
  for (const char* text : {"hi there", "there hi", "the rethere"}) {
    EXPECT_EQ(a.Encode(text, true), b.Encode(text, true)) << text;
  }
}

TEST(TokenizerJson, ByteLevelMapsEveryByte) {
  const HfTokenizer t = Make(ByteLevelFile());
  // é is C3 A9; a newline is byte 10 (Ċ), each its own id because no merge joins them.
  EXPECT_THAT(t.Encode("é\n", true), ElementsAre(0xC3, 0xA9, 10));
  EXPECT_EQ(t.Decode({0xC3, 0xA9, 10}, false), "é\n");
  // A token that ends inside a character decodes to the partial bytes (streaming prints them).
  EXPECT_EQ(t.DecodeNext(0xC3, -1), "\xC3");
}

TEST(TokenizerJson, AddedTokensAreMatchedBeforeTheModel) {
  const HfTokenizer t = Make(ByteLevelFile());
  EXPECT_THAT(t.Encode("hi<|end|>hi", true), ElementsAre(261, 262, 261));
  EXPECT_EQ(t.Decode({261, 262}, false), "hi<|end|>");
  EXPECT_EQ(t.Decode({261, 262}, true), "hi");
  EXPECT_TRUE(t.IsSpecial(262));
}

TEST(TokenizerJson, ByteFallbackWithPrependReplaceAndTemplate) {
  const HfTokenizer t = Make(ByteFallbackFile());
  // "hi é" -> "▁hi▁é"; é is not in the vocabulary, so its bytes C3 A9 are <0xC3> <0xA9>.
  EXPECT_THAT(t.Encode("hi é", true), ElementsAre(1, 263, 259, 3 + 0xC3, 3 + 0xA9));
  EXPECT_THAT(t.Encode("hi é", false), ElementsAre(263, 259, 3 + 0xC3, 3 + 0xA9));
  EXPECT_EQ(t.Decode({1, 263, 259, 3 + 0xC3, 3 + 0xA9}, true), "hi é");
  EXPECT_EQ(t.Decode({1, 263}, false), "<s> hi");  // Strip acts on the fused text's first char
  EXPECT_THAT(t.PrefixIds(), ElementsAre(1));
  // Streaming: the leading space is dropped after BOS, kept after a word.
  EXPECT_EQ(t.DecodeNext(263, 1), "hi");
  EXPECT_EQ(t.DecodeNext(263, 263), " hi");
  // The empty text gets BOS alone (Prepend does not act on an empty text).
  EXPECT_THAT(t.Encode("", true), ElementsAre(1));
  // Special tokens in the text: split out first, never normalized.
  EXPECT_THAT(t.Encode("<s>hi", false), ElementsAre(1, 263));
}

TEST(TokenizerJson, UnknownWithoutByteFallbackIsFusedUnk) {
  json j = ByteFallbackFile();
  j["model"]["byte_fallback"] = false;
  const HfTokenizer t = Make(j);
  EXPECT_THAT(t.Encode("hi éé", false), ElementsAre(263, 259, 0));
}

TEST(TokenizerJson, SplitIsolatedRemovedInverted) {
  json j = ByteLevelFile();
  j["model"]["vocab"]["b1"] = 263;
  j["model"]["merges"].push_back("b 1");
  j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}};
  EXPECT_THAT(Make(j).Encode("ab12", true), ElementsAre('a', 263, '2'));  // no split: b1 merges
  json split = {{"type", "Split"},
                {"pattern", {{"Regex", "[0-9]+"}}},
                {"behavior", "Isolated"},
                {"invert", false}};
  j["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", {split, j["pre_tokenizer"]}}};
  EXPECT_THAT(Make(j).Encode("ab12", true), ElementsAre('a', 'b', '1', '2'));
  j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed";
  EXPECT_THAT(Make(j).Encode("ab12cd", true), ElementsAre('a', 'b', 'c', 'd'));
  j["pre_tokenizer"]["pretokenizers"][0]["invert"] = true;
  EXPECT_THAT(Make(j).Encode("ab12cd", true), ElementsAre('1', '2'));
}

TEST(TokenizerJson, DigitsIndividualOrRuns) {
  json j = ByteLevelFile();
  j["model"]["vocab"]["12"] = 263;
  j["model"]["merges"].push_back("1 2");
  const json bytes = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}};
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers", {{{"type", "Digits"}, {"individual_digits", true}}, bytes}}};
  EXPECT_THAT(Make(j).Encode("x12", true), ElementsAre('x', '1', '2'));
  j["pre_tokenizer"]["pretokenizers"][0]["individual_digits"] = false;
  EXPECT_THAT(Make(j).Encode("x12", true), ElementsAre('x', 263));
}

TEST(TokenizerJson, NfcComposesBeforeTheModel) {
  json j = ByteLevelFile();
  EXPECT_THAT(Make(j).Encode("e\u0301", true), ElementsAre('e', 0xCC, 0x81));
  j["normalizer"] = {{"type", "NFC"}};
  EXPECT_THAT(Make(j).Encode("e\u0301", true), ElementsAre(0xC3, 0xA9));
}

TEST(TokenizerJson, MetaspacePreTokenizerSplitsBeforeEachReplacement) {
  json j = ByteFallbackFile();
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {
      {"type", "Metaspace"}, {"replacement", "▁"}, {"prepend_scheme", "always"}, {"split", true}};
  j["decoder"] = {{"type", "Metaspace"}, {"replacement", "▁"}, {"prepend_scheme", "always"}};
  const HfTokenizer t = Make(j);
  EXPECT_THAT(t.Encode("hi hi", false), ElementsAre(263, 263));
  EXPECT_EQ(t.Decode({263, 263}, false), "hi hi");
}

TEST(TokenizerJson, RefusesTextThatIsNotUtf8) {
  const HfTokenizer t = Make(ByteLevelFile());
  try {
    t.Encode("ok\xFFno", true);
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(), HasSubstr("not valid UTF-8 at byte 2"));
  }
}

// Each malformed or unsupported file -> InputError naming the place.
void ExpectRefused(const json& j, const std::string& message) {
  try {
    Make(j);
    FAIL() << "expected InputError containing: " << message;
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(), HasSubstr(message));
  }
}

TEST(TokenizerJson, RefusesUnknownComponentsByName) {
  json j = ByteLevelFile();
  j["model"]["type"] = "WordPiece";
  ExpectRefused(j, "model: type \"WordPiece\" is not implemented");
  j = ByteLevelFile();
  j["normalizer"] = {{"type", "Lowercase"}};
  ExpectRefused(j, "normalizer: type \"Lowercase\" is not implemented");
  j = ByteLevelFile();
  j["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", {{{"type", "Whitespace"}}}}};
  ExpectRefused(j, "pre_tokenizer.pretokenizers[0]: type \"Whitespace\" is not implemented");
  j = ByteLevelFile();
  j["decoder"] = {{"type", "CTC"}};
  ExpectRefused(j, "decoder: type \"CTC\"");
  j = ByteLevelFile();
  j["post_processor"] = {{"type", "RobertaProcessing"}};
  ExpectRefused(j, "post_processor: type \"RobertaProcessing\"");
  j = ByteLevelFile();
  j["pre_tokenizer"] = {
      {"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", "Contiguous"}};
  ExpectRefused(j, "behavior: \"Contiguous\" is not implemented");
  j = ByteLevelFile();
  j["added_tokens"][0]["lstrip"] = true;
  ExpectRefused(j, "added_tokens[0] (\"<|end|>\"): \"lstrip\": true is not implemented");
  j = ByteLevelFile();
  j["model"]["dropout"] = 0.1;
  ExpectRefused(j, "model.dropout");
}

TEST(TokenizerJson, RefusesMalformedFiles) {
  try {
    HfTokenizer::Parse("{\"model\": ");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(), HasSubstr("tokenizer.json: invalid JSON"));
  }
  json j = ByteLevelFile();
  j["model"]["merges"].push_back("q zz");
  ExpectRefused(j, "model.merges[6]: \"q\" + \"zz\" -> \"qzz\": \"zz\" is not in model.vocab");
  j = ByteLevelFile();
  j["model"]["merges"].push_back("nospace");
  ExpectRefused(j, "model.merges[6]: expected \"left right\"");
  j = ByteLevelFile();
  j["pre_tokenizer"] = {
      {"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}};
  ExpectRefused(j, "does not compile");
  j = ByteLevelFile();
  j["model"].erase("vocab");
  ExpectRefused(j, "model: missing field \"vocab\"");
  j = ByteLevelFile();
  j["added_tokens"][0]["id"] = 5;  // 5 is already the byte token for byte 5
  ExpectRefused(j, "added_tokens[0]: id 5 is already the token");
}

// Ids index a dense table: one far beyond the number of entries is refused before anything is
// allocated for it (an id of 10^9 once asked for 48 GB), and none is cut to 32 bits.
TEST(TokenizerJson, RefusesIdsBeyondTheNumberOfEntries) {
  json j = ByteLevelFile();
  const size_t entries = j["model"]["vocab"].size() + j["added_tokens"].size();
  j["model"]["vocab"]["far"] = 1000000000;
  ExpectRefused(j, fmt::format("model.vocab[\"far\"]: id 1000000000 is out of range: expected an "
                               "id below {}, the number of entries in model.vocab and added_tokens",
                               entries + 1));
  j = ByteLevelFile();
  j["added_tokens"][0]["id"] = 4294967296;  // 2^32: would read as id 0 if cut to 32 bits
  ExpectRefused(j, "added_tokens[0].id: id 4294967296 is out of range");
  j = ByteLevelFile();
  j["added_tokens"][0]["id"] = -1;
  ExpectRefused(j, "added_tokens[0].id: id -1 is out of range");
  j = ByteLevelFile();
  j["model"]["vocab"]["h"] = "7";
  ExpectRefused(j, "model.vocab[\"h\"]: expected an integer id, got \"7\"");
}

TEST(TokenizerJson, ModelDirPrefersOurFileThenTokenizerJson) {
  const auto dir = std::filesystem::temp_directory_path() / "kvdiff_tokenizer_json_test_dir";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  EXPECT_FALSE(Tokenizer::LoadFromModelDir(dir));
  std::ofstream(dir / "tokenizer.json") << ByteFallbackFile().dump();
  std::ofstream(dir / "tokenizer_config.json")
      << json({{"bos_token", "<s>"}, {"eos_token", {{"content", "</s>"}}}}).dump();
  std::optional<Tokenizer> t = Tokenizer::LoadFromModelDir(dir);
  ASSERT_TRUE(t);
  ASSERT_NE(t->Hf(), nullptr);
  EXPECT_STREQ(t->FileName(), "tokenizer.json");
  EXPECT_EQ(t->BosId(), 1);
  EXPECT_EQ(t->EosId(), 2);
  EXPECT_THAT(t->Encode("hi", true), ElementsAre(1, 263));
  EXPECT_EQ(t->DecodeAll({1, 263, 263}, -1), "<s>hi hi");
  EXPECT_THROW(t->Save(dir / "x.json"), InputError);

  std::vector<Tokenizer::Entry> pieces = {{"<unk>", 0}, {"<s>", 0}, {"</s>", 0}};
  for (int byte = 0; byte < 256; ++byte) pieces.push_back({fmt::format("<0x{:02X}>", byte), 0});
  pieces.push_back({" hi", 1});
  Tokenizer(pieces, 6).Save(dir / kTokenizerFileName);
  t = Tokenizer::LoadFromModelDir(dir);
  ASSERT_TRUE(t);
  EXPECT_EQ(t->Hf(), nullptr);
  EXPECT_STREQ(t->FileName(), kTokenizerFileName);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kvdiff::format
