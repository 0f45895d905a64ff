// The repro experiments as a library, on the tiny preset: the fixes (ok, fresh, fresh1) give the
// correct output, the bugs (pos0, reuse, reuse1) depart from it the way the source document says,
// and the correct output is the uncached greedy one, computed here independently.
#include "harness/repro/repro.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "format/error.h"
#include "harness/backend/registry.h"
#include "harness/scenario/scenario.h"
#include "impl/model.h"
#include "tests/harness/harness_test_util.h"
#include "tests/repro/repro_test_util.h"
#include "tests/test_support.h"

namespace kvdiff::testing {
namespace {

using harness::Experiment;
using harness::ExperimentResult;
using harness::Repro;
using harness::ReproInput;
using harness::ReproPrompts;
using ::testing::HasSubstr;

// Greedy with no cache: each step a ForwardFull over the whole history, the first maximum.
Tokens UncachedGreedy(const impl::Model& model, Tokens history, int64_t n) {
  Tokens out;
  for (int64_t k = 0; k < n; ++k) {
    const Logits logits = model.ForwardFull(history);
    const int64_t last = logits.rows() - 1;
    Token best = 0;
    for (int64_t j = 1; j < logits.cols(); ++j)
      if (logits(last, j) > logits(last, best)) best = static_cast<Token>(j);
    out.push_back(best);
    history.push_back(best);
  }
  return out;
}

ReproPrompts Prompts(const format::LlamaConfig& config, ReproInput in = {}) {
  return harness::MakeReproPrompts(in, config, nullptr);
}

class ReproTiny : public ::testing::Test {
 protected:
  std::shared_ptr<const format::ModelWeights> weights_ = TinyWeights();
  Repro repro_ = Repro::OnModel(weights_, Prompts(weights_->config), "impl", {/*threads=*/1});
};

TEST_F(ReproTiny, DefaultPromptsHaveTheSourceDocumentsLengths) {
  const ReproPrompts& p = repro_.prompts();
  EXPECT_EQ(p.first.size(), 5u);
  EXPECT_EQ(p.second.size(), 5u);
  ASSERT_EQ(p.second1.size(), 1u);
  EXPECT_EQ(p.second1[0], p.second[0]) << "the one-token prompt is the second prompt's first token";
  EXPECT_EQ(p.n, 20);
}

TEST_F(ReproTiny, CorrectLinesAreTheUncachedGreedyOutput) {
  impl::Model model(weights_, 1);
  const ReproPrompts& p = repro_.prompts();
  EXPECT_EQ(repro_.Correct("ok"), UncachedGreedy(model, p.first, p.n));
  EXPECT_EQ(repro_.Correct("fresh"), UncachedGreedy(model, p.second, p.n));
  EXPECT_EQ(repro_.Correct("fresh1"), UncachedGreedy(model, p.second1, p.n));
  EXPECT_THROW(repro_.Correct("pos0"), InputError);
}

TEST_F(ReproTiny, OkFreshAndFresh1EqualTheCorrectOutput) {
  for (Experiment e : {Experiment::kOk, Experiment::kFresh, Experiment::kFresh1}) {
    SCOPED_TRACE(harness::ExperimentName(e));
    const ExperimentResult r = repro_.Run(e);
    ASSERT_EQ(r.lines.size(), 2u);
    EXPECT_TRUE(r.as_documented) << r.observed;
    EXPECT_EQ(r.lines[0].generated, repro_.Correct("ok"));
    const std::string second = e == Experiment::kFresh1 ? "fresh1" : "fresh";
    EXPECT_EQ(r.lines[1].baseline, second);
    EXPECT_EQ(r.lines[1].generated, repro_.Correct(second));
    for (const auto& line : r.lines) {
      EXPECT_EQ(line.departs_at, 0);
      EXPECT_EQ(line.error, "");
      EXPECT_EQ(line.generated.size(), 20u);
    }
  }
}

TEST_F(ReproTiny, Pos0IsSilentAndDepartsFromOkAfterTheFirstToken) {
  const ExperimentResult r = repro_.Run(Experiment::kPos0);
  ASSERT_EQ(r.lines.size(), 2u);
  const auto& first = r.lines[0];
  const Tokens& ok = repro_.Correct("ok");
  EXPECT_EQ(first.error, "");
  ASSERT_EQ(first.generated.size(), ok.size());
  EXPECT_EQ(first.generated[0], ok[0]) << "the prefill at index_pos 0 is right";
  EXPECT_NE(first.generated, ok);
  EXPECT_GE(first.departs_at, 2);
  EXPECT_NE(first.generated[first.departs_at - 1], ok[first.departs_at - 1]);
  for (int64_t k = 0; k + 1 < first.departs_at; ++k) EXPECT_EQ(first.generated[k], ok[k]);
  EXPECT_TRUE(r.as_documented) << r.observed;
  EXPECT_THAT(r.observed, HasSubstr("departs from ok at token"));
}

TEST_F(ReproTiny, ReuseRaisesCandlesBroadcastErrorAndLeavesTheFirstConversationCorrect) {
  const ExperimentResult r = repro_.Run(Experiment::kReuse);
  ASSERT_EQ(r.lines.size(), 2u);
  EXPECT_EQ(r.lines[0].departs_at, 0);
  EXPECT_EQ(r.lines[0].generated, repro_.Correct("ok"));
  // tiny has 4 heads; 5 + 20 - 1 = 24 cached positions plus the 5 new ones.
  EXPECT_EQ(r.lines[1].error, "cannot broadcast [5, 5] to [1, 4, 5, 29]");
  EXPECT_EQ(repro_.ExpectedReuseError(), r.lines[1].error);
  EXPECT_TRUE(r.lines[1].generated.empty());
  EXPECT_TRUE(r.as_documented) << r.observed;
}

TEST(ReproShapes, TheReuseErrorFollowsTheCacheLengthAndThePromptLength) {
  auto weights = TinyWeights();
  ReproInput in;
  in.tokens = Tokens{5, 17, 3, 99, 42, 7};
  in.second_tokens = Tokens{8, 17, 3};
  in.n = 7;
  Repro repro = Repro::OnModel(weights, Prompts(weights->config, in), "impl", {1});
  const ExperimentResult r = repro.Run(Experiment::kReuse);
  // 6 + 7 - 1 = 12 cached, plus 3.
  EXPECT_EQ(r.lines.at(1).error, "cannot broadcast [3, 3] to [1, 4, 3, 15]");
  EXPECT_TRUE(r.as_documented);
}

TEST_F(ReproTiny, Reuse1IsSilentAndDepartsFromFresh1) {
  const ExperimentResult r = repro_.Run(Experiment::kReuse1);
  ASSERT_EQ(r.lines.size(), 2u);
  EXPECT_EQ(r.lines[0].generated, repro_.Correct("ok"));
  const auto& second = r.lines[1];
  EXPECT_EQ(second.error, "");
  EXPECT_EQ(second.prompt, repro_.prompts().second1);
  EXPECT_EQ(second.generated.size(), 20u);
  EXPECT_NE(second.generated, repro_.Correct("fresh1"));
  EXPECT_GE(second.departs_at, 1);
  EXPECT_TRUE(r.as_documented) << r.observed;
}

TEST(ReproBlind, APositionBlindModelDoesNotReproducePos0) {
  // With zero queries and keys the wrong index_pos has no effect: pos0 equals ok, which is not
  // what the document says, so the experiment must say NO and the exit code must be 1.
  auto weights = std::make_shared<const format::ModelWeights>(PositionBlindTiny());
  Repro repro = Repro::OnModel(weights, Prompts(weights->config), "impl", {1});
  const ExperimentResult r = repro.Run(Experiment::kPos0);
  EXPECT_EQ(r.lines.at(0).departs_at, 0);
  EXPECT_FALSE(r.as_documented);
  EXPECT_EQ(harness::ReproExitCode({r}), 1);
  EXPECT_THAT(harness::FormatExperiment(r, nullptr), HasSubstr("as documented:   NO"));
  // The broadcast error does not depend on the weights.
  EXPECT_TRUE(repro.Run(Experiment::kReuse).as_documented);
}

TEST(ReproExit, SkippedExperimentsDoNotCountAndOneDepartureFails) {
  ExperimentResult yes, no, skipped;
  yes.as_documented = true;
  skipped.skipped = "no LibTorch";
  EXPECT_EQ(harness::ReproExitCode({yes, skipped}), 0);
  EXPECT_EQ(harness::ReproExitCode({yes, no, skipped}), 1);
}

TEST(ReproNames, RoundTripAndRefuseUnknownNames) {
  for (Experiment e : harness::AllExperiments()) {
    EXPECT_EQ(harness::ParseExperimentName(harness::ExperimentName(e)), e);
  }
  try {
    harness::ParseExperimentName("reuse2");
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(), HasSubstr("experiment \"reuse2\": expected one of ok, pos0, reuse, "
                                    "reuse1, fresh, fresh1, quantized, stale-position, "
                                    "reference-reuse, all"));
  }
}

std::string PromptError(ReproInput in, const format::Tokenizer* tokenizer = nullptr) {
  try {
    harness::MakeReproPrompts(in, format::PresetConfig("tiny"), tokenizer);
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(ReproPromptsTest, RefusesWhatCannotReproduceTheExperiments) {
  ReproInput text;
  text.prompt = "Once upon a time";
  EXPECT_THAT(PromptError(text), HasSubstr("text prompts need a tokenizer"));
  ReproInput one;
  one.second_tokens = Tokens{8};
  EXPECT_THAT(PromptError(one), HasSubstr("the second prompt has 1 token; reuse needs at least 2"));
  ReproInput vocab;
  vocab.tokens = Tokens{5, 256};
  EXPECT_THAT(PromptError(vocab),
              HasSubstr("--tokens: token id 256 (index 1) outside the vocabulary [0, 256)"));
  ReproInput single;
  single.second1_token = -1;
  EXPECT_THAT(PromptError(single), HasSubstr("--second1-token: token id -1"));
  ReproInput n;
  n.n = 1;
  EXPECT_THAT(PromptError(n), HasSubstr("-n: expected at least 2 generated tokens"));
  ReproInput empty;
  empty.tokens = Tokens{};
  EXPECT_THAT(PromptError(empty), HasSubstr("--tokens: expected at least one token id"));
  // tiny has 512 positions: two conversations of 5 + 299 positions each do not fit in one cache.
  ReproInput big;
  big.n = 300;
  EXPECT_THAT(PromptError(big),
              HasSubstr("the two conversations need 304 + 304 = 608 positions in one cache"));
  big.n = 254;  // 258 + 258 = 516
  EXPECT_THAT(PromptError(big), HasSubstr("max_position_embeddings 512"));
  big.n = 252;  // 256 + 256 = 512 fits
  EXPECT_EQ(PromptError(big), "(no error)");
}

TEST(ReproPromptsTest, TheOneTokenPromptSkipsABosAndCanBeGiven) {
  const auto config = format::PresetConfig("tiny");
  ReproInput in;
  in.second_tokens = Tokens{static_cast<Token>(config.bos_token_id), 40, 41};
  EXPECT_EQ(harness::MakeReproPrompts(in, config, nullptr).second1, Tokens{40});
  in.second1_token = 77;
  EXPECT_EQ(harness::MakeReproPrompts(in, config, nullptr).second1, Tokens{77});
}

TEST(ReproScenario, EachExperimentBecomesAScenarioThatParsesBack) {
  const auto config = format::PresetConfig("tiny");
  const ReproPrompts p = Prompts(config);
  const harness::ModelSpec model = testing::TinyModel(3);
  for (Experiment e : harness::AllExperiments()) {
    SCOPED_TRACE(harness::ExperimentName(e));
    // reference-reuse runs on a backend with transformers' semantics, which needs LibTorch.
    if (e == Experiment::kReferenceReuse &&
        harness::BackendRegistry::Global()
            .FirstWithRawCall(harness::RawCall::kPositionFromCache)
            .empty()) {
      continue;
    }
    const harness::Scenario sc = harness::ExperimentScenario(e, p, model, config, "impl");
    const harness::Scenario back = harness::ParseScenario(sc.ToText());
    EXPECT_EQ(back.driver, sc.driver);
    EXPECT_EQ(back.backends, sc.backends);
    ASSERT_EQ(back.steps.size(), 5u);
    EXPECT_EQ(back.steps[0].tokens, p.first);
    EXPECT_EQ(back.steps[1].n, 19) << "the 20th token is chosen by the last row, never fed";
    const bool one = e == Experiment::kReuse1 || e == Experiment::kFresh1;
    EXPECT_EQ(back.steps[3].tokens, one ? p.second1 : p.second);
    EXPECT_EQ(back.steps[3].conversation, "second");
    EXPECT_EQ(*back.model.preset, "tiny");
    EXPECT_EQ(back.model.seed, 3u);
  }
  EXPECT_EQ(harness::ExperimentScenario(Experiment::kPos0, p, model, config, "impl").driver,
            harness::DriverKind::kPos0);
  EXPECT_EQ(harness::ExperimentScenario(Experiment::kReuse1, p, model, config, "impl").driver,
            harness::DriverKind::kReuse);
  // The document's fix is on the raw call: the caller tracks index_pos.
  EXPECT_EQ(harness::ExperimentScenario(Experiment::kFresh, p, model, config, "impl").driver,
            harness::DriverKind::kRaw);
  EXPECT_THAT(harness::ExperimentScenario(Experiment::kReuse, p, model, config, "impl").description,
              HasSubstr("step 3 raises cannot broadcast [5, 5] to [1, 4, 5, 29]"));
}

TEST_F(ReproTiny, TheTableShowsEachExperimentsLineAndVerdict) {
  std::vector<ExperimentResult> results;
  for (Experiment e : harness::AllExperiments()) results.push_back(repro_.Run(e));
  const std::string table = harness::FormatReproTable(results, nullptr);
  for (Experiment e : harness::AllExperiments()) {
    EXPECT_THAT(table, HasSubstr("\n" + harness::ExperimentName(e) + " "));
  }
  EXPECT_THAT(table, HasSubstr("Error: cannot broadcast [5, 5] to [1, 4, 5, 29]"));
  EXPECT_THAT(table, HasSubstr("departs from fresh1 at token"));
  // stale-position: the second prompt in a fresh cache at index_pos 24 (5 + 19).
  EXPECT_THAT(table, HasSubstr("Error: cannot broadcast [5, 29] to [1, 4, 5, 5]"));
  EXPECT_EQ(repro_.ExpectedStalePositionError(), "cannot broadcast [5, 29] to [1, 4, 5, 5]");
  EXPECT_THAT(table, ::testing::Not(HasSubstr(" NO\n")));
  EXPECT_EQ(harness::ReproExitCode(results), 0);
}

}  // namespace
}  // namespace kvdiff::testing
