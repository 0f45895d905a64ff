// Text on a HuggingFace model directory: a random model whose vocabulary is Llama 3's, beside the
// real Llama 3 tokenizer.json and tokenizer_config.json (chat template), read from the npm cache
// ci/install-deps fills (they are test data, never committed; without them the tests skip, saying
// so). `kvdiff repro all --model DIR` runs the document's experiments on the default text prompts,
// and a scenario's "text" and "messages" prefills tokenize as transformers does.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "format/chat_template.h"
#include "format/model_files.h"
#include "format/tokenizer.h"
#include "harness/run/differential_run.h"
#include "harness/scenario/scenario.h"
#include "tests/repro/repro_test_util.h"
#include "tests/test_support.h"

namespace kvdiff::testing {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class HfTextModel : public ::testing::Test {
 protected:
  void SetUp() override {
    const fs::path files =
        NpmOracleDir() / "node_modules" / "@lenml" / "tokenizer-llama3" / "models";
    if (!fs::is_regular_file(files / "tokenizer.json")) {
      GTEST_SKIP() << "no Llama 3 tokenizer files in " << files << " (run ci/install-deps)";
    }
    model_ = dir_ / "llama3-random";
    fs::create_directories(model_);
    for (const char* name : {"tokenizer.json", "tokenizer_config.json"}) {
      fs::copy_file(files / name, model_ / name);
    }
    tokenizer_ = format::Tokenizer::LoadFromModelDir(model_);
    ASSERT_TRUE(tokenizer_);
    // The tiny shape with the tokenizer's vocabulary and special tokens.
    format::LlamaConfig config = format::PresetConfig("tiny");
    config.vocab_size = tokenizer_->VocabSize();
    config.bos_token_id = tokenizer_->BosId();
    config.eos_token_id = tokenizer_->EosId();
    format::SaveModel(model_, format::MakeRandomModel(config, 5), format::DType::kF32);
  }
  TempDir dir_;
  fs::path model_;
  std::optional<format::Tokenizer> tokenizer_;
};

TEST_F(HfTextModel, ReproAllRunsTheDocumentsExperimentsOnText) {
  ASSERT_EQ(tokenizer_->VocabSize(), 128256);
  const CommandResult r =
      RunKvdiff(fmt::format("repro all --model '{}' -n 6", model_.string()), dir_.path());
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  // The default prompts are text, encoded by the real tokenizer with its special tokens. This
  // file's post-processor is ByteLevel (as in Llama 3's first release), so no BOS is added: the
  // same ids transformers gives (tokenizer_oracle_test holds Encode to transformers.js).
  const kvdiff::Tokens first = tokenizer_->Encode("Once upon a time, Lily", true);
  EXPECT_EQ(first, tokenizer_->Encode("Once upon a time, Lily", false));
  EXPECT_NE(first.front(), tokenizer_->BosId());
  EXPECT_THAT(r.out, HasSubstr("Once upon a time, Lily"));
  for (const char* experiment : {"ok", "pos0", "reuse", "reuse1", "fresh", "fresh1"}) {
    EXPECT_THAT(r.out, HasSubstr(experiment));
  }
  EXPECT_THAT(r.out, HasSubstr("cannot broadcast"));
}

TEST_F(HfTextModel, ScenarioTextAndMessagesTokenizeAsTheTokenizerAndTemplateDo) {
  const std::string text = fmt::format(
      R"({{"model": {{"path": "{}"}}, "backends": ["impl"], "steps": [
           {{"op": "prefill", "text": "What is the capital of France?"}},
           {{"op": "decode", "n": 3}},
           {{"op": "new_conversation", "name": "chat"}},
           {{"op": "prefill", "conversation": "chat", "messages": [
             {{"role": "system", "content": "Be brief."}},
             {{"role": "user", "content": "What is the capital of France?"}}]}},
           {{"op": "decode", "conversation": "chat", "n": 3}}]}})",
      model_.string());
  harness::Scenario sc = harness::ParseScenario(text);
  ASSERT_TRUE(sc.steps[3].messages);
  const auto weights = harness::LoadModelFor(sc.model);
  harness::PrepareScenario(sc, *weights);

  EXPECT_EQ(sc.steps[0].tokens, tokenizer_->Encode("What is the capital of France?", true));
  std::string prompt;
  const kvdiff::Tokens chat = format::EncodeChat(
      model_, *tokenizer_, {{"system", "Be brief."}, {"user", "What is the capital of France?"}},
      true, &prompt);
  EXPECT_EQ(sc.steps[3].tokens, chat);
  EXPECT_THAT(prompt, HasSubstr("<|start_header_id|>assistant<|end_header_id|>\n\n"));
  EXPECT_EQ(sc.steps[3].tokens.front(), 128000);  // the template writes BOS, once
  EXPECT_NE(sc.steps[3].tokens[1], 128000);

  // The file kvdiff writes back keeps the messages, and replays.
  const harness::Scenario again = harness::ParseScenario(harness::ParseScenario(text).ToText());
  ASSERT_TRUE(again.steps[3].messages);
  EXPECT_EQ(again.steps[3].messages->at(1).content, "What is the capital of France?");
  const fs::path file = dir_ / "chat.json";
  std::ofstream(file) << text;
  const CommandResult run = RunKvdiff(fmt::format("run '{}'", file.string()), dir_.path());
  EXPECT_EQ(run.exit_code, 0) << run.out << run.err;
}

TEST_F(HfTextModel, MessagesOnAModelWithoutAChatTemplateAreRefused) {
  fs::remove(model_ / "tokenizer_config.json");
  const fs::path file = dir_ / "chat.json";
  std::ofstream(file) << fmt::format(
      R"({{"model": {{"path": "{}"}}, "steps": [{{"op": "prefill", "messages": [
           {{"role": "user", "content": "Hi"}}]}}]}})",
      model_.string());
  const CommandResult run = RunKvdiff(fmt::format("run '{}'", file.string()), dir_.path());
  EXPECT_EQ(run.exit_code, 2) << run.out << run.err;
  EXPECT_THAT(run.err, HasSubstr("chat"));
}

}  // namespace
}  // namespace kvdiff::testing
