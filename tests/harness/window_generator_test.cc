// The case generator and the scenario validation on a sliding-window model (issue 34): cases of
// tiny-swa cross and wrap the window and land on its edges, every truncate they draw is one the
// ring can make (ShortestTruncate), they draw no shift; the validation refuses the truncates and
// shifts a window forbids, with the rule in the message; the random shapes get windows only when
// asked, without moving any other field of any shape.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "format/error.h"
#include "format/model_files.h"
#include "harness/campaign/case_generator.h"
#include "harness/campaign/coverage.h"
#include "harness/campaign/shape_generator.h"
#include "harness/scenario/conversations.h"
#include "tests/harness/harness_test_util.h"

namespace kvdiff::harness {
namespace {

using ::testing::HasSubstr;

format::LlamaConfig TinySwa() { return format::PresetConfig("tiny-swa"); }

TEST(WindowGenerator, CasesCrossTheWindowAndTruncateOnlyWhereTheRingCan) {
  const format::LlamaConfig config = TinySwa();
  const int64_t w = config.sliding_window;
  Coverage coverage;
  int64_t truncates_after_a_drop = 0, edges = 0;
  for (int64_t k = 0; k < 300; ++k) {
    const Scenario sc = GenerateCase(config, testing::TinyModel(), 0, k);
    ValidateScenario(sc, config);  // throws on a truncate the window forbids, or a shift
    coverage.Add(sc, "tiny-swa", false, 0, w);
    Conversations convs;
    for (const Step& s : sc.steps) {
      EXPECT_NE(s.op, Op::kShift) << "case " << k;
      if (s.op == Op::kTruncate && convs.At(s.conversation).furthest > w) {
        EXPECT_GE(s.length, convs.At(s.conversation).furthest - 1) << "case " << k;
        ++truncates_after_a_drop;
      }
      for (const ForwardCall& call : convs.CallsOf(s)) {
        const int64_t end = call.first_position + call.size;
        edges += end >= w - 1 && end <= w + 1 ? 1 : 0;
      }
      convs.Apply(s);
    }
  }
  EXPECT_GT(truncates_after_a_drop, 10);
  EXPECT_GT(edges, 100);
  EXPECT_GT(coverage.windows["crossed"], 150);
  EXPECT_GT(coverage.windows["twice"], 50);
  EXPECT_GT(coverage.windows["over W"], 20);
  EXPECT_THAT(coverage.Text(), HasSubstr("  windows:       300 cases, "));
}

// Power of the check above: the same generator on the same cases without the window's rule
// (ShortestTruncate) draws truncates the ring could not make, which the validation refuses.
TEST(WindowGenerator, WithoutTheWindowTheSameCasesTruncateWhereTheRingCannot) {
  format::LlamaConfig config = TinySwa();
  config.sliding_window = 0;
  int64_t refused = 0;
  for (int64_t k = 0; k < 300; ++k) {
    try {
      ValidateScenario(GenerateCase(config, testing::TinyModel(), 0, k), TinySwa());
    } catch (const InputError& e) {
      ++refused;
      EXPECT_THAT(e.what(), ::testing::AnyOf(HasSubstr("sliding window"), HasSubstr("shift")));
    }
  }
  EXPECT_GT(refused, 10);
}

TEST(WindowValidation, RefusesATruncatePastTheWindowAndAShiftNamingTheRule) {
  const format::LlamaConfig config = TinySwa();
  Scenario sc;
  Step prefill;
  prefill.op = Op::kPrefill;
  prefill.conversation = "main";
  prefill.tokens = Tokens(40, 5);
  sc.steps = {prefill};
  Step truncate;
  truncate.op = Op::kTruncate;
  truncate.conversation = "main";
  truncate.length = 39;
  sc.steps.push_back(truncate);
  EXPECT_NO_THROW(ValidateScenario(sc, config));
  sc.steps.back().length = 38;
  EXPECT_THAT([&] { ValidateScenario(sc, config); },
              ::testing::ThrowsMessage<InputError>(
                  HasSubstr("steps[1].length: cannot truncate conversation \"main\" to 38: the "
                            "model has a sliding window of 32 positions and the conversation has "
                            "reached 40, so positions 0..7 have left its window")));
  sc.steps.back().length = 0;
  format::LlamaConfig wide = config;
  wide.sliding_window = 40;  // nothing has left a window of 40
  EXPECT_NO_THROW(ValidateScenario(sc, wide));
  Step shift;
  shift.op = Op::kShift;
  shift.conversation = "main";
  shift.keep = 1;
  shift.discard = 2;
  sc.steps.back() = shift;
  EXPECT_THAT([&] { ValidateScenario(sc, config); },
              ::testing::ThrowsMessage<InputError>(HasSubstr("cannot shift its context")));
}

TEST(WindowShapes, SomeRandomShapesHaveAWindowAndNoOtherFieldMoves) {
  int64_t windowed = 0;
  for (int64_t k = 0; k < 200; ++k) {
    format::LlamaConfig with = DrawShape(3, k, ShapeTier::kSmall, true);
    const format::LlamaConfig without = DrawShape(3, k, ShapeTier::kSmall, false);
    EXPECT_EQ(without.sliding_window, 0);
    if (with.Windowed()) {
      ++windowed;
      EXPECT_LE(with.sliding_window, std::min(kMaxWindow, with.max_position_embeddings));
    }
    with.sliding_window = 0;
    EXPECT_EQ(format::ConfigToJson(with), format::ConfigToJson(without)) << "shape " << k;
  }
  EXPECT_GT(windowed, 30);
  EXPECT_LT(windowed, 100);
}

}  // namespace
}  // namespace kvdiff::harness
