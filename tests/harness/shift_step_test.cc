// Shift steps (issue 34, "Positions that move"): the scenario op (parsed, written back,
// validated), BackendSession::Shift on impl, ref and ref64 held to the algebra of a context shift
// (tests/harness/shift_session_suite.h), impl against ref64 on random shift scenarios, and
// the proof of power: impl?fault=shift-not-rerotated, shift-delta-overwritten and
// shift-skipped-when-empty are caught by the comparison with ref64; and a truncate to a shift's
// keep or less gives the rows after it their uncached oracle back.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "format/error.h"
#include "harness/backend/backend.h"
#include "harness/backend/registry.h"
#include "harness/campaign/case_generator.h"
#include "harness/compare/tolerance_profile.h"
#include "harness/replay/replay.h"
#include "harness/run/differential_run.h"
#include "harness/run/model_for.h"
#include "harness/scenario/scenario.h"
#include "tests/harness/harness_test_util.h"
#include "tests/harness/shift_session_suite.h"

namespace kvdiff::harness {
namespace {

using ::testing::HasSubstr;

const char* const kPrefix = R"({"model": {"preset": "tiny", "seed": 3}, "steps": [)";

Scenario Parse(const std::string& steps) { return ParseScenario(kPrefix + steps + "]}"); }

std::string ValidationError(const std::string& steps) {
  try {
    Scenario sc = Parse(steps);
    ValidateScenario(sc, format::PresetConfig("tiny"));
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(ShiftStep, ParsesWritesBackAndNamesItself) {
  const Scenario sc = Parse(R"({"op": "prefill", "tokens": [1, 2, 3, 4, 5]},
                               {"op": "shift", "keep": 1, "discard": 2})");
  const Step& s = sc.steps[1];
  EXPECT_EQ(s.op, Op::kShift);
  EXPECT_EQ(s.conversation, "main");
  EXPECT_EQ(s.keep, 1);
  EXPECT_EQ(s.discard, 2);
  EXPECT_EQ(s.ParamString(), "shift(main,keep=1,discard=2)");
  const Step built = Step::Shift("main", 1, 2);
  EXPECT_EQ(built.ParamString(), s.ParamString());
  const Scenario back = ParseScenario(sc.ToJson().dump());
  EXPECT_EQ(back.ToJson(), sc.ToJson());
  EXPECT_EQ(back.steps[1].ParamString(), "shift(main,keep=1,discard=2)");
}

TEST(ShiftStep, RefusesWhatNoBackendCouldRun) {
  const std::string prefill = R"({"op": "prefill", "tokens": [1,2,3,4,5,6,7,8,9,10]},)";
  EXPECT_EQ(ValidationError(prefill + R"({"op": "shift", "keep": 2, "discard": 8})"), "");
  EXPECT_EQ(ValidationError(prefill + R"({"op": "shift", "keep": 4, "discard": 0})"), "");
  EXPECT_THAT(ValidationError(prefill + R"({"op": "shift", "keep": 4, "discard": 8})"),
              HasSubstr("steps[1].discard: keep + discard = 12 is beyond conversation main's "
                        "length 10"));
  EXPECT_THAT(ValidationError(prefill + R"({"op": "shift", "keep": 11, "discard": 0})"),
              HasSubstr("keep + discard = 11 is beyond"));
  EXPECT_THAT(ValidationError(prefill + R"({"op": "shift", "keep": -1, "discard": 2})"),
              HasSubstr("steps[1].keep: expected an integer >= 0, got -1"));
  EXPECT_THAT(ValidationError(prefill + R"({"op": "shift", "keep": 1, "discard": -2})"),
              HasSubstr("steps[1].discard: expected an integer >= 0, got -2"));
  EXPECT_THAT(
      ValidationError(prefill + R"({"op": "shift", "conversation": "x", "keep": 1, "discard": 1})"),
      HasSubstr("steps[1].conversation: no conversation named \"x\""));
  EXPECT_THAT(ValidationError(prefill + R"({"op": "shift", "keep": 1})"),
              HasSubstr("\"shift\" needs the field \"discard\""));
  EXPECT_THAT(ValidationError(prefill + R"({"op": "shift", "keep": 1, "discard": 1, "n": 2})"),
              HasSubstr("unknown field \"n\""));
  // Only the session driver moves cached positions (the raw drivers have no shift call).
  Scenario raw = Parse(prefill + R"({"op": "shift", "keep": 1, "discard": 2})");
  raw.driver = DriverKind::kPos0;
  EXPECT_THAT([&] { ValidateScenario(raw, format::PresetConfig("tiny")); },
              ::testing::ThrowsMessage<InputError>(
                  HasSubstr("steps[1]: a shift needs the session driver (driver \"pos0\"")));
  // Built in code, past the parser's checks: the validation still refuses it.
  Scenario sc = Parse(prefill.substr(0, prefill.size() - 1));
  sc.steps.push_back(Step::Shift("main", -3, 1));
  EXPECT_THAT([&] { ValidateScenario(sc, format::PresetConfig("tiny")); },
              ::testing::ThrowsMessage<InputError>(HasSubstr("steps[1].keep")));
}

TEST(ShiftStep, ADecodeNeedsTheLastRowToSurvive) {
  const std::string prefill = R"({"op": "prefill", "tokens": [1,2,3,4,5,6]},)";
  EXPECT_EQ(ValidationError(prefill + R"({"op": "shift", "keep": 1, "discard": 2},
                                         {"op": "decode", "n": 2})"),
            "");
  EXPECT_THAT(ValidationError(prefill + R"({"op": "shift", "keep": 2, "discard": 4},
                                           {"op": "decode", "n": 2})"),
              HasSubstr("no previous row"));
}

TEST(ShiftStep, ABackendThatCannotShiftIsRefusedByName) {
  const Scenario sc = Parse(R"({"op": "prefill", "tokens": [1, 2, 3]},
                               {"op": "shift", "keep": 1, "discard": 1})");
  BackendInfo plugin;
  plugin.name = "plugin:engine.so";
  EXPECT_THAT([&] { ValidateScenarioFor(sc, plugin); },
              ::testing::ThrowsMessage<InputError>(
                  HasSubstr("steps[1] shift(main,keep=1,discard=1): backend plugin:engine.so "
                            "does not shift a conversation's positions")));
  EXPECT_NO_THROW(ValidateScenarioFor(sc, BackendRegistry::Global().Info("impl")));
}

// ---- BackendSession::Shift, held to its algebra (tests/harness/shift_session_suite.h) ----

INSTANTIATE_TEST_SUITE_P(Backends, ShiftSessionTest,
                         ::testing::Values(ShiftSuiteBackend{"impl"}, ShiftSuiteBackend{"ref"},
                                           ShiftSuiteBackend{"ref64"}));

// ---- impl against ref64 after shifts, through the differential run ----

class ShiftAgainstRef64Test : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!BackendRegistry::Global().Has("ref64")) return;
    weights_ = new std::shared_ptr<const format::ModelWeights>(LoadModelFor(testing::TinyModel(3)));
    for (const char* name :
         {"impl", "ref64", "impl?fault=shift-not-rerotated", "impl?fault=shift-delta-overwritten",
          "impl?fault=shift-skipped-when-empty"})
      backends_.push_back(MakeBackend(name, *weights_, 1).release());
  }
  static void TearDownTestSuite() {
    for (auto* b : backends_) delete b;
    backends_.clear();
    delete weights_;
  }
  void SetUp() override {
    if (backends_.empty()) GTEST_SKIP() << "ref64 not built";
  }
  static RunReport Run(Scenario sc, const std::vector<const Backend*>& backends) {
    PrepareScenario(sc, **weights_);
    return RunScenario(sc, backends, RunOptions{});
  }
  static std::shared_ptr<const format::ModelWeights>* weights_;
  static std::vector<const Backend*> backends_;
};
std::shared_ptr<const format::ModelWeights>* ShiftAgainstRef64Test::weights_ = nullptr;
std::vector<const Backend*> ShiftAgainstRef64Test::backends_;

// The worst impl~ref64 difference over rows after a shift (figure in docs/scenarios.md): the
// cross rows of a step that impl's own oracle column did not judge.
TEST_F(ShiftAgainstRef64Test, ImplAgreesWithRef64AfterShifts) {
  double worst = 0, worst_before = 0;
  int64_t rows_after_shift = 0;
  const int kCases = 300;
  for (uint32_t seed = 0; seed < kCases; ++seed) {
    const RunReport r = Run(RandomShiftScenario(seed), {backends_[0], backends_[1]});
    ASSERT_TRUE(r.Passed()) << "seed " << seed << ": "
                            << (r.first_divergence ? r.first_divergence->params : "");
    for (const StepReport& s : r.steps) {
      ASSERT_EQ(s.outcomes.size(), 3u);  // impl, ref64, impl~ref64
      std::set<int64_t> judged;          // rows impl's uncached oracle judged
      for (const ComparedRow& row : s.outcomes[0].rows) judged.insert(row.row);
      for (const ComparedRow& row : s.outcomes[2].rows) {
        const bool after_shift = judged.count(row.row) == 0;
        rows_after_shift += after_shift ? 1 : 0;
        double& w = after_shift ? worst : worst_before;
        w = std::max(w, row.cmp.max_abs_diff);
      }
    }
  }
  EXPECT_GT(rows_after_shift, 1000);
  EXPECT_LE(worst, 1e-4);
  std::printf(
      "impl~ref64 on %d random shift scenarios: %lld rows after a shift, worst %.2e (rows with "
      "an oracle: worst %.2e)\n",
      kCases, static_cast<long long>(rows_after_shift), worst, worst_before);
}

// The same over the rows after a shift in the default campaign's cases (GenerateCase with
// shifts): the figure docs/campaign-cases.md gives.
TEST_F(ShiftAgainstRef64Test, ImplAgreesWithRef64AfterTheCampaignsShifts) {
  const format::LlamaConfig& config = backends_[0]->config();
  GenerationOptions options;
  options.shifts = true;
  options.boundaries =
      CampaignBoundaries({backends_[0], backends_[1]}, config.max_position_embeddings);
  double worst = 0;
  int64_t rows_after_shift = 0, cases_with_shifts = 0;
  const int kCases = 200;
  for (int64_t k = 0; k < kCases; ++k) {
    const Scenario sc = GenerateCase(config, testing::TinyModel(3), 0, k, options);
    const bool shifts = std::any_of(sc.steps.begin(), sc.steps.end(),
                                    [](const Step& s) { return s.op == Op::kShift; });
    if (!shifts) continue;
    ++cases_with_shifts;
    const RunReport r = Run(sc, {backends_[0], backends_[1]});
    ASSERT_TRUE(r.Passed()) << "case " << k << ": "
                            << (r.first_divergence ? r.first_divergence->params : "");
    for (const StepReport& s : r.steps) {
      std::set<int64_t> judged;  // rows impl's uncached oracle judged
      for (const ComparedRow& row : s.outcomes[0].rows) judged.insert(row.row);
      for (const ComparedRow& row : s.outcomes[2].rows) {
        if (judged.count(row.row) > 0) continue;
        ++rows_after_shift;
        worst = std::max(worst, row.cmp.max_abs_diff);
      }
    }
  }
  EXPECT_GT(cases_with_shifts, kCases / 3);
  EXPECT_GT(rows_after_shift, 1000);
  EXPECT_LE(worst, 1e-4);
  std::printf(
      "campaign cases 0..%d of seed 0: %lld with shifts, %lld rows after a shift, "
      "impl~ref64 worst %.2e\n",
      kCases - 1, static_cast<long long>(cases_with_shifts),
      static_cast<long long>(rows_after_shift), worst);
}

// llama3 rope_scaling: impl's delta uses the rescaled inv_freq of its RoPE table, ref64 its own
// LlamaRotaryEmbedding's; long shifts (150 positions) through every band of the scaling.
TEST_F(ShiftAgainstRef64Test, Llama3RopeScalingShiftsAgree) {
  format::LlamaConfig config = format::PresetConfig("tiny");
  config.rope_scaling = format::RopeScaling{};
  config.rope_scaling->factor = 8.0;
  config.rope_scaling->original_max_position_embeddings = 64;  // every band within 512 positions
  ModelSpec spec;
  spec.config = config;
  spec.seed = 5;
  const auto weights = LoadModelFor(spec);
  const auto impl = MakeBackend("impl", weights, 1);
  const auto ref64 = MakeBackend("ref64", weights, 1);
  Tokens prompt(220);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<Token>((i * 53 + 7) % 256);
  Scenario sc;
  sc.name = "llama3-shift";
  sc.model = spec;
  sc.steps = {Step::Prefill("main", prompt, {100, 120}), Step::Shift("main", 4, 150),
              Step::Decode("main", 8), Step::Shift("main", 0, 30), Step::Decode("main", 8)};
  PrepareScenario(sc, *weights);
  const RunReport r = RunScenario(sc, {impl.get(), ref64.get()}, RunOptions{});
  EXPECT_TRUE(r.Passed()) << (r.first_divergence ? r.first_divergence->params : "");
  ASSERT_EQ(r.steps[4].outcomes[2].rows.size(), 8u);
  std::printf("llama3 rope_scaling, shifts of 150 and 30: impl~ref64 worst %.2e\n",
              std::max(r.steps[2].outcomes[2].max_abs_diff, r.steps[4].outcomes[2].max_abs_diff));
}

TEST_F(ShiftAgainstRef64Test, RowsAfterAShiftSayTheyHaveNoOracle) {
  Scenario sc = Parse(R"({"op": "prefill", "tokens": [5, 17, 3, 99, 42, 8, 1, 2]},
                         {"op": "shift", "keep": 1, "discard": 3},
                         {"op": "decode", "n": 4})");
  const RunReport r = Run(sc, {backends_[0], backends_[1]});
  EXPECT_TRUE(r.Passed());
  EXPECT_EQ(r.steps[0].outcomes[0].status, PathStatus::kPass);  // before: the oracle holds
  EXPECT_EQ(r.steps[2].outcomes[0].status, PathStatus::kSkipped);
  EXPECT_EQ(r.steps[2].outcomes[0].message,
            "after shift: no uncached oracle, compared across backends");
  EXPECT_EQ(r.steps[2].outcomes[2].status, PathStatus::kPass);  // impl~ref64
  EXPECT_EQ(r.steps[2].outcomes[2].rows.size(), 4u);
  ASSERT_FALSE(r.notes.empty());
  EXPECT_THAT(r.notes.back(), HasSubstr("compared across backends only"));
}

TEST_F(ShiftAgainstRef64Test, AShiftThatForgetsToRerotateIsCaught) {
  // Two shifts before a decode; impl with the test-only fault moves keys without re-rotating.
  const std::string steps = R"({"op": "prefill", "tokens": [5, 17, 3, 99, 42, 8, 1, 2, 77, 12]},
                               {"op": "shift", "keep": 1, "discard": 2},
                               {"op": "shift", "keep": 1, "discard": 2},
                               {"op": "decode", "n": 3})";
  const RunReport good = Run(Parse(steps), {backends_[0], backends_[1]});
  EXPECT_TRUE(good.Passed());
  const RunReport bad = Run(Parse(steps), {backends_[2], backends_[1]});
  ASSERT_FALSE(bad.Passed());
  ASSERT_TRUE(bad.first_divergence.has_value());
  EXPECT_EQ(bad.first_divergence->step, 3);
  EXPECT_EQ(bad.first_divergence->kind, PathKind::kCross);
  EXPECT_GT(bad.first_divergence->row.cmp.max_abs_diff, 1e-2);
  std::printf("shift-not-rerotated against ref64: %s, max |a-b| %.2e\n",
              bad.first_divergence->params.c_str(), bad.first_divergence->row.cmp.max_abs_diff);
}

// llama.cpp#3825's bug: the second of two shifts before a decode sets the keys' pending delta to
// its own instead of adding to the first's. One shift alone is right.
TEST_F(ShiftAgainstRef64Test, ASecondShiftsDeltaOverwritingTheFirstsIsCaught) {
  const std::string prompt = R"({"op": "prefill", "tokens": [5, 17, 3, 99, 42, 8, 1, 2, 77, 12]},)";
  const RunReport one = Run(Parse(prompt + R"({"op": "shift", "keep": 1, "discard": 3},
                                               {"op": "decode", "n": 3})"),
                            {backends_[3], backends_[1]});
  EXPECT_TRUE(one.Passed());
  const std::string two = prompt + R"({"op": "shift", "keep": 1, "discard": 2},
                                      {"op": "shift", "keep": 1, "discard": 2},
                                      {"op": "decode", "n": 3})";
  EXPECT_TRUE(Run(Parse(two), {backends_[0], backends_[1]}).Passed());
  const RunReport bad = Run(Parse(two), {backends_[3], backends_[1]});
  ASSERT_TRUE(bad.first_divergence.has_value());
  EXPECT_EQ(bad.first_divergence->step, 3);
  EXPECT_GT(bad.first_divergence->row.cmp.max_abs_diff, 1e-2);
}

// A shift that moves keys, then one that leaves nothing after keep before the next append: with
// shift-skipped-when-empty the second cancels the re-rotation the first left pending.
TEST_F(ShiftAgainstRef64Test, APendingRerotationLostToAShiftThatMovesNothingIsCaught) {
  const std::string steps = R"({"op": "prefill", "tokens": [5, 17, 3, 99, 42, 8, 1, 2, 77, 12]},
                               {"op": "shift", "keep": 1, "discard": 2},
                               {"op": "shift", "keep": 5, "discard": 3},
                               {"op": "prefill", "tokens": [9, 4]})";
  EXPECT_TRUE(Run(Parse(steps), {backends_[0], backends_[1]}).Passed());
  const RunReport bad = Run(Parse(steps), {backends_[4], backends_[1]});
  ASSERT_TRUE(bad.first_divergence.has_value());
  EXPECT_EQ(bad.first_divergence->step, 3);
  EXPECT_GT(bad.first_divergence->row.cmp.max_abs_diff, 1e-2);
  // The shift that moves nothing, alone, has nothing pending to lose.
  EXPECT_TRUE(Run(Parse(R"({"op": "prefill", "tokens": [5, 17, 3, 99, 42, 8, 1, 2]},
                           {"op": "shift", "keep": 5, "discard": 3},
                           {"op": "prefill", "tokens": [9, 4]})"),
                  {backends_[4], backends_[1]})
                  .Passed());
}

// After shift(keep, discard), positions below keep are untouched and each saw only the ones
// before it: a truncate to keep or less leaves a conversation whose cache is the uncached forward
// of its history, so the rows after it are held to their oracle again (a truncate past keep is
// not enough; nor is a fork of a shifted conversation until it truncates so).
TEST_F(ShiftAgainstRef64Test, ATruncateToKeepOrLessGivesTheOracleBack) {
  const Scenario sc = Parse(R"({"op": "prefill", "tokens": [5, 17, 3, 99, 42, 8, 1, 2, 77, 12]},
                               {"op": "shift", "keep": 4, "discard": 3},
                               {"op": "shift", "keep": 6, "discard": 1},
                               {"op": "fork", "from": "main", "to": "b"},
                               {"op": "truncate", "length": 5},
                               {"op": "prefill", "tokens": [9, 4, 60]},
                               {"op": "truncate", "length": 4},
                               {"op": "prefill", "tokens": [9, 4, 60]},
                               {"op": "decode", "n": 2},
                               {"op": "prefill", "conversation": "b", "tokens": [7, 31]},
                               {"op": "truncate", "conversation": "b", "length": 2},
                               {"op": "prefill", "conversation": "b", "tokens": [7, 31]})");
  for (const Backend* b : {backends_[0], backends_[1]}) {
    const RunReport r = Run(sc, {b});
    EXPECT_TRUE(r.Passed()) << b->Name();
    EXPECT_EQ(r.steps[5].outcomes[0].status, PathStatus::kSkipped) << b->Name();  // 5 > keep 4
    for (int step : {7, 8, 11}) {
      EXPECT_EQ(r.steps[step].outcomes[0].status, PathStatus::kPass) << b->Name() << " " << step;
      EXPECT_FALSE(r.steps[step].outcomes[0].rows.empty()) << b->Name() << " " << step;
    }
    EXPECT_EQ(r.steps[9].outcomes[0].status, PathStatus::kSkipped) << b->Name();  // b: shifted
  }
  // And impl against ref64 where the oracle does not reach (a truncate past keep drops keys
  // whose re-rotation was pending; the next append must not rotate what it writes there).
  const RunReport both = Run(sc, {backends_[0], backends_[1]});
  EXPECT_TRUE(both.Passed());
  EXPECT_EQ(both.steps[5].outcomes[2].rows.size(), 3u);
  // A truncate to keep or less restores the oracle for a wrong shift too: the rows it judges
  // never saw a moved key.
  EXPECT_TRUE(Run(sc, {backends_[2]}).steps[7].outcomes[0].status == PathStatus::kPass);
}

// A float32-angle backend's error in a moved key is that of a key at its first position plus the
// discards it was turned back by: the rope-f32 allowance of the rows after a shift is taken there
// (RecordedRow::rope_reach), not at their own, smaller, positions. Found by `check --shapes random
// --backends ref,ref64`: a key moved from position 952 to 1 put ref 1.1e-4 off ref64 at position
// 1, past the 1e-4 + allowance x 1 it was held to.
TEST(ShiftStep, RowsAfterAShiftTakeTheRopeAllowanceWhereTheirMovedKeysWereTurned) {
  std::string prompt;
  for (int i = 0; i < 300; ++i) prompt += fmt::format("{}{}", i ? "," : "", (i * 37) % 256);
  Scenario sc = Parse(fmt::format(R"({{"op": "prefill", "tokens": [{}]}},
                                     {{"op": "shift", "keep": 1, "discard": 290}},
                                     {{"op": "prefill", "tokens": [3, 4]}},
                                     {{"op": "fork", "from": "main", "to": "b"}},
                                     {{"op": "shift", "keep": 0, "discard": 3}},
                                     {{"op": "prefill", "tokens": [5]}},
                                     {{"op": "truncate", "conversation": "b", "length": 1}},
                                     {{"op": "prefill", "conversation": "b", "tokens": [6]}})",
                                  prompt));
  const auto weights = LoadModelFor(testing::TinyModel(3));
  PrepareScenario(sc, *weights);
  const auto impl = MakeBackend("impl", weights, 1);
  const Recording rec = Replay(sc, *impl);
  auto reach_at = [&](size_t step) {
    std::vector<std::pair<int64_t, int64_t>> out;  // (position, rope_reach)
    for (size_t k = rec.steps[step].rows_begin; k < rec.steps[step].rows_end; ++k)
      out.emplace_back(rec.rows[k].position, rec.rows[k].rope_reach);
    return out;
  };
  EXPECT_EQ(reach_at(0).back(), std::make_pair(int64_t{299}, int64_t{299}));  // not shifted
  // The 9 moved keys were rotated at up to 299 and turned back by 290: 589.
  EXPECT_EQ(reach_at(2), (std::vector<std::pair<int64_t, int64_t>>{{10, 589}, {11, 589}}));
  // A second shift turns them back 3 more.
  EXPECT_EQ(reach_at(5), (std::vector<std::pair<int64_t, int64_t>>{{9, 592}}));
  // The fork, truncated to within keep, holds no moved key any more.
  EXPECT_EQ(reach_at(7), (std::vector<std::pair<int64_t, int64_t>>{{1, 1}}));
  if (!BackendRegistry::Global().Has("ref64")) return;
  // ref (float32 angles) against ref64 with the profile: within, on every row after the shifts.
  const auto ref = MakeBackend("ref", weights, 1);
  const auto ref64 = MakeBackend("ref64", weights, 1);
  sc.gate.rope_f32_per_position = RopeF32Profile().per_position;
  const RunReport r = RunScenario(sc, {ref.get(), ref64.get()}, RunOptions{});
  EXPECT_TRUE(r.Passed()) << r.worst_diff;
}

}  // namespace
}  // namespace kvdiff::harness
