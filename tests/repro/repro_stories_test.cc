// The experiments in words, on stories260K (a real trained model, converted here into a temporary
// directory): the fixes equal the correct output, the bugs depart from it, `kvdiff repro all`
// agrees with `kvdiff generate`, the stories scenario files replay (reading the checkpoint they
// name, or a directory given with --model), and --save writes them. Skips without ../shared/data.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "format/tokenizer.h"
#include "harness/repro/repro.h"
#include "tests/repro/repro_test_util.h"
#include "tests/test_support.h"

namespace kvdiff::testing {
namespace {

using harness::Experiment;
using harness::ExperimentResult;
using ::testing::HasSubstr;

class ReproStories : public ::testing::Test {
 protected:
  void SetUp() override {
    KVDIFF_REQUIRE_SHARED_DATA(data);
    data_ = data;
    model_dir_ = dir_ / "stories260K";
    ConvertStories(data, model_dir_);
    weights_ = std::make_shared<const format::ModelWeights>(format::LoadModel(model_dir_));
    tokenizer_ = format::Tokenizer::LoadFromModelDir(model_dir_);
    ASSERT_TRUE(tokenizer_);
  }
  harness::ReproPrompts Prompts() {
    return harness::MakeReproPrompts({}, weights_->config, &*tokenizer_);
  }
  TempDir dir_;
  std::filesystem::path data_;
  std::filesystem::path model_dir_;
  std::shared_ptr<const format::ModelWeights> weights_;
  std::optional<format::Tokenizer> tokenizer_;
};

TEST_F(ReproStories, DefaultPromptsAreTheIssuesTextWithBos) {
  const auto p = Prompts();
  EXPECT_EQ(p.first, tokenizer_->Encode("Once upon a time, Lily", true));
  EXPECT_EQ(p.second, tokenizer_->Encode("The dog", true));
  EXPECT_EQ(p.first[0], tokenizer_->BosId());
  // The one-token prompt: the second prompt's first word, " The", without BOS.
  ASSERT_EQ(p.second1.size(), 1u);
  EXPECT_EQ(p.second1[0], p.second[1]);
  EXPECT_EQ(tokenizer_->Decode(p.second1[0], -1), " The");
}

TEST_F(ReproStories, FixesEqualTheCorrectOutputAndBugsDepartFromIt) {
  harness::Repro repro = harness::Repro::OnModel(weights_, Prompts(), "impl", {1});
  for (Experiment e : {Experiment::kOk, Experiment::kFresh, Experiment::kFresh1}) {
    SCOPED_TRACE(harness::ExperimentName(e));
    const ExperimentResult r = repro.Run(e);
    EXPECT_TRUE(r.as_documented) << r.observed;
    EXPECT_EQ(r.lines.at(0).departs_at, 0);
    EXPECT_EQ(r.lines.at(1).departs_at, 0);
  }
  const ExperimentResult pos0 = repro.Run(Experiment::kPos0);
  EXPECT_TRUE(pos0.as_documented) << pos0.observed;
  EXPECT_NE(pos0.lines.at(0).generated, repro.Correct("ok"));
  EXPECT_EQ(pos0.lines.at(0).generated.at(0), repro.Correct("ok").at(0));

  const ExperimentResult reuse1 = repro.Run(Experiment::kReuse1);
  EXPECT_TRUE(reuse1.as_documented) << reuse1.observed;
  EXPECT_EQ(reuse1.lines.at(1).error, "");
  EXPECT_NE(reuse1.lines.at(1).generated, repro.Correct("fresh1"));

  const ExperimentResult reuse = repro.Run(Experiment::kReuse);
  const auto& p = repro.prompts();
  const size_t s = p.second.size();
  EXPECT_EQ(reuse.lines.at(1).error, fmt::format("cannot broadcast [{0}, {0}] to [1, 8, {0}, {1}]",
                                                 s, p.first.size() + 19 + s));
  EXPECT_TRUE(reuse.as_documented);
}

// kvdiff generate's cached Session output for the same prompt.
Tokens GenerateIds(const std::filesystem::path& dir, const std::string& model,
                   const std::string& prompt) {
  const auto r = RunKvdiff("generate --model " + model + " --prompt '" + prompt +
                               "' -n 20 --ids --ignore-eos --threads 1",
                           dir);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  std::istringstream in(r.out);
  Tokens ids;
  for (Token t; in >> t;) ids.push_back(t);
  return ids;
}

TEST_F(ReproStories, OkAndFreshAreWhatGenerateWrites) {
  harness::Repro repro = harness::Repro::OnModel(weights_, Prompts(), "impl", {1});
  EXPECT_EQ(repro.Run(Experiment::kOk).lines.at(0).generated,
            GenerateIds(dir_.path(), "stories260K", "Once upon a time, Lily"));
  EXPECT_EQ(repro.Run(Experiment::kFresh).lines.at(1).generated,
            GenerateIds(dir_.path(), "stories260K", "The dog"));
}

TEST_F(ReproStories, AllPrintsTheLinesInWordsAndExitsZero) {
  const auto r = RunKvdiff("repro all --model stories260K --threads 1", dir_.path());
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("first prompt:            \"Once upon a time, Lily\" = [1 "));
  EXPECT_THAT(r.out, HasSubstr("one-token second prompt: [" + std::to_string(Prompts().second1[0]) +
                               "] = \" The\" (1 token)"));
  // The ok line is the decoded text of the correct tokens.
  harness::Repro repro = harness::Repro::OnModel(weights_, Prompts(), "impl", {1});
  const Tokens& ok = repro.Correct("ok");
  const std::string ok_text = tokenizer_->DecodeAll(ok, Prompts().first.back());
  EXPECT_THAT(r.out, HasSubstr("\nok               first         \"" + ok_text + "\""));
  EXPECT_THAT(r.out, HasSubstr("= fresh1"));
  EXPECT_THAT(r.out, ::testing::Not(HasSubstr(" NO\n")));
}

// The outcome each shipped stories file documents in its description.
struct StoriesCase {
  const char* file;
  int exit_code;
  const char* output;
};
const StoriesCase kStoriesCases[] = {
    {"fresh1-stories.json", 0, "PASS: 0 of 5 steps failed"},
    {"pos0-stories.json", 1, "first divergence: step 1 decode(main,n=19)"},
    {"reuse-stories.json", 1, "on impl: cannot broadcast [4, 4] to [1, 8, 4, 30]"},
    {"reuse1-stories.json", 1, "first divergence: step 3 prefill(second,n=1)"},
};
const std::string kReproFolder = KVDIFF_SOURCE_DIR "/examples/repro/";

TEST_F(ReproStories, StoriesFilesReplayAsTheyStandWithTheirDocumentedOutcome) {
  // The files name ../../../shared/data (the shared data beside the clone); KVDIFF_DATA_DIR may
  // point elsewhere, where they cannot find it.
  if (!std::filesystem::exists(KVDIFF_SOURCE_DIR "/../shared/data/stories260K/stories260K.bin")) {
    GTEST_SKIP() << "the stories files read " KVDIFF_SOURCE_DIR
                    "/../shared/data/stories260K/, which is absent";
  }
  for (const StoriesCase& c : kStoriesCases) {
    const auto r =
        RunKvdiff("run " + kReproFolder + c.file + " --backends impl --threads 1", dir_.path());
    EXPECT_EQ(r.exit_code, c.exit_code) << c.file << "\n" << r.out << r.err;
    EXPECT_THAT(r.out, HasSubstr(c.output)) << c.file;
    EXPECT_THAT(r.out, HasSubstr("model: llama2c ")) << c.file;
  }
}

TEST_F(ReproStories, ModelDirectoryOverridesTheStoriesFilesCheckpoint) {
  for (const StoriesCase& c : kStoriesCases) {
    const auto r = RunKvdiff(
        "run " + kReproFolder + c.file + " --model stories260K --backends impl --threads 1",
        dir_.path());
    EXPECT_EQ(r.exit_code, c.exit_code) << c.file << "\n" << r.out << r.err;
    EXPECT_THAT(r.out, HasSubstr(c.output)) << c.file;
    EXPECT_THAT(r.out, HasSubstr("model: path stories260K")) << c.file;
  }
}

// `kvdiff repro --save` writes what is shipped: the steps of each stories file, and the model the
// way it was given (a directory stays a path, a checkpoint a llama2c kind), relative to the file.
TEST_F(ReproStories, SaveWritesTheModelAsGivenRelativeToTheFile) {
  std::filesystem::create_directories(dir_ / "saved");
  auto r =
      RunKvdiff("repro pos0 --model stories260K --save saved/dir.json --threads 1", dir_.path());
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto dir_json = nlohmann::json::parse(ReadFile(dir_ / "saved" / "dir.json"));
  EXPECT_EQ(dir_json.at("model"), nlohmann::json({{"path", "../stories260K"}}));
  r = RunKvdiff("run saved/dir.json --threads 1", dir_.path());
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("first divergence: step 1 decode(main,n=19)"));

  const std::string checkpoint = (data_ / "stories260K" / "stories260K.bin").string();
  const std::string tokenizer = (data_ / "stories260K" / "tok512.bin").string();
  r = RunKvdiff("repro pos0 --llama2c '" + checkpoint + "' --tokenizer '" + tokenizer +
                    "' --save saved/ck.json --threads 1",
                dir_.path());
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto ck_json = nlohmann::json::parse(ReadFile(dir_ / "saved" / "ck.json"));
  const auto relative = [&](const std::string& f) {
    return std::filesystem::proximate(std::filesystem::absolute(f), dir_ / "saved").string();
  };
  EXPECT_EQ(ck_json.at("model"), nlohmann::json({{"llama2c",
                                                  {{"checkpoint", relative(checkpoint)},
                                                   {"tokenizer", relative(tokenizer)}}}}));
  const auto shipped = nlohmann::json::parse(ReadFile(kReproFolder + "pos0-stories.json"));
  for (const char* key : {"driver", "backends", "tolerance", "steps"})
    EXPECT_EQ(ck_json.at(key), shipped.at(key)) << key;
  r = RunKvdiff("run saved/ck.json --threads 1", dir_.path());
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("first divergence: step 1 decode(main,n=19)"));
}

}  // namespace
}  // namespace kvdiff::testing
