// Shrinking a failing scenario (harness/campaign/shrink.h): to the smallest one its predicate
// still fails on, skipping candidates the scenario rules refuse, within its budget; and a real
// batched-forward bug (impl?fault=) shrunk to one batch step of one token per item.
#include "harness/campaign/shrink.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>

#include "harness/backend/registry.h"
#include "harness/run/differential_run.h"
#include "harness/run/model_for.h"
#include "harness/scenario/conversations.h"
#include "harness/scenario/scenario.h"
#include "tests/harness/harness_test_util.h"
#include "tests/test_support.h"

namespace kvdiff::harness {
namespace {

format::LlamaConfig TinyConfig() { return LoadModelFor(testing::TinyModel())->config; }

Scenario LongScenario() {
  Scenario sc;
  sc.model = testing::TinyModel();
  sc.steps = {Step::Prefill("main", {1, 2, 3, 4, 5, 6, 7, 8}, {5, 3}),
              Step::NewConversation("c2"),
              Step::Prefill("c2", {9, 10, 11, 12}),
              Step::Decode("main", 6),
              Step::Fork("main", "c3"),
              Step::Decode("c2", 5),
              Step::Batch({{"main", {20, 21, 22, 23}, false, BatchLogits::kAll},
                           {"c2", {}, true, BatchLogits::kAll},
                           {"c3", {30, 31}, false, BatchLogits::kLast}}),
              Step::Truncate("main", 3),
              Step::Prefill("main", {40, 41})};
  return sc;
}

// "Fails" when some step decodes c2 by at least 3 tokens: the shrink must keep c2's creation and
// one prompt token (a decode needs a previous row) and halve the decode down to 3.
TEST(Shrink, EndsAtTheSmallestScenarioThePredicateStillFails) {
  const format::LlamaConfig config = TinyConfig();
  ValidateScenario(LongScenario(), config);
  auto fails = [](const Scenario& sc) {
    return std::any_of(sc.steps.begin(), sc.steps.end(), [](const Step& s) {
      return s.op == Op::kDecode && s.conversation == "c2" && s.n >= 3;
    });
  };
  const Shrink shrink = ShrinkScenario(LongScenario(), config, fails);
  ASSERT_EQ(shrink.scenario.steps.size(), 3u) << shrink.scenario.ToText();
  EXPECT_EQ(shrink.scenario.steps[0].op, Op::kNewConversation);
  EXPECT_EQ(shrink.scenario.steps[1].tokens, Tokens({9}));
  EXPECT_EQ(shrink.scenario.steps[2].n, 3);
  EXPECT_FALSE(shrink.exhausted);
  EXPECT_GT(shrink.runs, 0);
  ValidateScenario(shrink.scenario, config);  // what it writes replays
}

// "Fails" when main is appended to after a truncate. Before truncates could shrink, the prompt
// had to keep the 3 tokens the truncate cut back to; a truncate that shrinks too lets it go.
TEST(Shrink, ShortensATruncateSoThatWhatCameBeforeItCanShrink) {
  const format::LlamaConfig config = TinyConfig();
  auto fails = [](const Scenario& sc) {
    bool truncated = false;
    for (const Step& s : sc.steps) {
      if (s.conversation != "main") continue;
      if (s.op == Op::kTruncate) truncated = true;
      if (s.op == Op::kPrefill && truncated) return true;
    }
    return false;
  };
  const Shrink shrink = ShrinkScenario(LongScenario(), config, fails);
  // The truncate goes down to 0, which an empty main allows: the prompt before it goes too.
  ASSERT_EQ(shrink.scenario.steps.size(), 2u) << shrink.scenario.ToText();
  EXPECT_EQ(shrink.scenario.steps[0].op, Op::kTruncate);
  EXPECT_EQ(shrink.scenario.steps[0].length, 0);
  EXPECT_EQ(shrink.scenario.steps[1].tokens, Tokens({40})) << shrink.scenario.ToText();
  ValidateScenario(shrink.scenario, config);
}

TEST(Shrink, RemovesBatchItemsAndTokensAndKeepsTheItemThatMatters) {
  const format::LlamaConfig config = TinyConfig();
  auto fails = [](const Scenario& sc) {
    for (const Step& s : sc.steps) {
      if (s.op != Op::kBatch) continue;
      for (const BatchEntry& item : s.items)
        if (item.conversation == "c3" && !item.tokens.empty()) return true;
    }
    return false;
  };
  const Shrink shrink = ShrinkScenario(LongScenario(), config, fails);
  const Step& batch = shrink.scenario.steps.back();
  ASSERT_EQ(batch.op, Op::kBatch) << shrink.scenario.ToText();
  ASSERT_EQ(batch.items.size(), 1u);
  EXPECT_EQ(batch.items[0].tokens, Tokens({30}));
  // c3 is a fork of main (which may be empty): the fork and the batch.
  EXPECT_EQ(shrink.scenario.steps.size(), 2u) << shrink.scenario.ToText();
}

TEST(Shrink, StopsWhenTheBudgetIsSpentAndSaysSo) {
  const format::LlamaConfig config = TinyConfig();
  ShrinkBudget budget;
  budget.max_runs = 2;
  const Shrink shrink = ShrinkScenario(
      LongScenario(), config, [](const Scenario&) { return true; }, budget);
  EXPECT_TRUE(shrink.exhausted);
  EXPECT_EQ(shrink.runs, 2);
  EXPECT_LT(shrink.scenario.steps.size(), LongScenario().steps.size());
}

TEST(Shrink, AScenarioNothingCanBeRemovedFromStaysAsItIs) {
  const format::LlamaConfig config = TinyConfig();
  Scenario one;
  one.model = testing::TinyModel();
  one.steps = {Step::Prefill("main", {4})};
  const Shrink shrink = ShrinkScenario(one, config, [](const Scenario&) { return true; });
  EXPECT_EQ(shrink.scenario.steps.size(), 1u);
  EXPECT_EQ(shrink.scenario.steps[0].tokens, Tokens({4}));
  EXPECT_FALSE(shrink.exhausted);
}

// impl's batched forward with one position vector for every item (impl/batch_fault.h): a batch
// of a conversation with history beside another shrinks to those two items and what they need.
TEST(Shrink, ARealBatchBugShrinksToABatchOfTwoItems) {
  const auto weights = LoadModelFor(testing::TinyModel());
  const auto faulty = MakeBackend("impl?fault=batch-shared-positions", weights, 1);
  const std::vector<const Backend*> backends = {faulty.get()};
  Scenario sc = LongScenario();
  sc.backends = {faulty->Name()};
  auto fails = [&](const Scenario& candidate) {
    return !RunScenario(candidate, backends, {}).Passed();
  };
  ValidateScenario(sc, weights->config);
  ASSERT_TRUE(fails(sc));
  const Shrink shrink = ShrinkScenario(sc, weights->config, fails);
  const Scenario& small = shrink.scenario;
  ASSERT_EQ(small.steps.back().op, Op::kBatch) << small.ToText();
  EXPECT_EQ(small.steps.back().items.size(), 2u) << small.ToText();
  EXPECT_LE(small.steps.size(), 4u) << small.ToText();
  EXPECT_TRUE(fails(small));
  std::cout << "figure: shrunk from " << sc.steps.size() << " steps in " << shrink.runs
            << " replays to:\n"
            << small.ToText();
}

// A failure that needs a shift moving keys, then one leaving nothing after keep, then an append
// (impl?fault=shift-skipped-when-empty's shape): keep and discard shrink, and the prompts before
// them shrink too, each shift refitted to the shorter history so that the last still leaves
// nothing after keep.
TEST(Shrink, ShiftsShrinkTheirKeepAndDiscardAndKeepTheirShape) {
  const format::LlamaConfig config = TinyConfig();
  Scenario sc;
  sc.model = testing::TinyModel();
  sc.steps = {Step::Prefill("main", Tokens(20, 7), {8, 12}),
              Step::Decode("main", 6),
              Step::Prefill("main", Tokens(10, 9)),
              Step::Shift("main", 4, 6),
              Step::Shift("main", 10, 20),
              Step::Prefill("main", {1, 2, 3})};
  auto fails = [](const Scenario& candidate) {
    Conversations convs;
    bool moved = false, lost = false;
    for (const Step& s : candidate.steps) {
      const int64_t length = convs.Exists(s.conversation) ? convs.At(s.conversation).length : 0;
      if (s.op == Op::kShift && s.discard > 0) {
        lost = moved && s.keep + s.discard == length;
        moved = s.keep + s.discard < length;
      } else if (s.op == Op::kPrefill || s.op == Op::kDecode) {
        if (lost) return true;
        moved = false;
      } else {
        moved = lost = false;
      }
      convs.Apply(s);
    }
    return false;
  };
  ValidateScenario(sc, config);
  ASSERT_TRUE(fails(sc));
  const Shrink shrink = ShrinkScenario(sc, config, fails);
  const Scenario& small = shrink.scenario;
  EXPECT_NO_THROW(ValidateScenario(small, config));
  EXPECT_TRUE(fails(small));
  ASSERT_EQ(small.steps.size(), 4u) << small.ToText();
  EXPECT_EQ(small.steps[0].op, Op::kPrefill);
  EXPECT_LE(small.steps[0].tokens.size(), 3u) << small.ToText();
  EXPECT_EQ(small.steps[1].ParamString(), "shift(main,keep=0,discard=1)") << small.ToText();
  EXPECT_EQ(small.steps[2].op, Op::kShift);
  EXPECT_EQ(small.steps[2].discard, 1) << small.ToText();
  EXPECT_EQ(small.steps[3].tokens.size(), 1u) << small.ToText();
}

}  // namespace
}  // namespace kvdiff::harness
