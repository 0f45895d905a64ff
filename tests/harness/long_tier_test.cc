// check --long, the long tier: its shapes (narrow, 8192-32768 positions, llama3 scaling half the
// time), its cases (every one long, decodes capped, the target reached with a prompt), the
// reference attending a block of queries at a time past its whole mask's size (the same rows as
// the whole mask gives), and through the binary: impl,ref64 passes, and a port whose RoPE angles
// are float32 (ref without its declared allowance) agrees with its own uncached forward at every
// position, so only the comparison with ref64 at long positions catches it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "format/model_files.h"
#include "harness/backend/registry.h"
#include "harness/campaign/case_generator.h"
#include "harness/campaign/shape_generator.h"
#include "harness/run/model_for.h"
#include "harness/scenario/conversations.h"
#include "harness/scenario/scenario.h"
#include "tests/harness/harness_test_util.h"
#include "tests/test_support.h"

namespace kvdiff::testing {
namespace {

using namespace kvdiff::harness;
using ::testing::HasSubstr;

TEST(LongTier, ShapesAreNarrowWithLongContextsAndScaledRopeHalfTheTime) {
  int64_t scaled = 0, at_max = 0, between = 0;
  for (int64_t k = 0; k < 400; ++k) {
    const format::LlamaConfig c = DrawShape(0, k, ShapeTier::kLong);
    EXPECT_NO_THROW(c.Validate()) << ShapeParams(c);
    EXPECT_GE(c.max_position_embeddings, kLongTierMinContext) << ShapeParams(c);
    EXPECT_LE(c.max_position_embeddings, kLongTierMaxContext) << ShapeParams(c);
    EXPECT_GE(c.QDim(), kMinShapeWidth) << ShapeParams(c);
    EXPECT_LE(c.QDim(), 64) << ShapeParams(c);
    EXPECT_LE(c.num_hidden_layers, 2) << ShapeParams(c);
    at_max += c.max_position_embeddings == kLongTierMaxContext;
    between += c.max_position_embeddings % 8192 != 0;
    if (c.rope_scaling) {
      ++scaled;
      // Long positions lie far past the original context: the scaled band is where they run.
      EXPECT_LE(c.rope_scaling->original_max_position_embeddings, 8192);
    }
  }
  EXPECT_GT(scaled, 150);
  EXPECT_LT(scaled, 250);
  EXPECT_GT(at_max, 30);
  EXPECT_GT(between, 30);
  // A stream of its own: the small tier's shapes are not moved by the long tier.
  EXPECT_NE(format::ConfigToJson(DrawShape(0, 3, ShapeTier::kLong)),
            format::ConfigToJson(DrawShape(0, 3)));
  EXPECT_EQ(format::ConfigToJson(DrawShape(0, 3, ShapeTier::kLong)),
            format::ConfigToJson(DrawShape(0, 3, ShapeTier::kLong)));
}

// Every case long; no decode step longer than max_decode; the histories still reach their whole
// context in some cases (with a prompt before the last decode), and no case runs a decode of
// thousands of calls.
TEST(LongTier, DecodesAreCappedAndLongCasesReachTheirTargetWithAPrompt) {
  GenerationOptions options;
  options.max_length = 0;
  options.long_fraction = 1.0;
  options.batch_percent = 0;
  options.max_decode = 64;
  options.min_long_target = 4096;
  int64_t reached_context = 0, past_8192 = 0;
  for (int64_t k = 0; k < 60; ++k) {
    const ModelSpec model = ShapeModel(1, k, ShapeTier::kLong);
    const format::LlamaConfig& config = *model.config;
    GenerationOptions for_case = options;
    for_case.max_length = CampaignMaxLength(config, 0);
    for_case.boundaries = CampaignBoundaries({}, for_case.max_length);
    const Scenario sc = GenerateCase(config, model, 1, k, for_case);
    EXPECT_NO_THROW(ValidateScenario(sc, config));
    EXPECT_THAT(sc.description, HasSubstr("(long)"));
    Conversations convs;
    int64_t longest = 0;
    for (const Step& s : sc.steps) {
      if (s.op == Op::kDecode) {
        EXPECT_LE(s.n, 64) << s.ParamString();
      }
      EXPECT_NE(s.op, Op::kBatch);
      convs.Apply(s);
      for (const std::string& name : convs.Names())
        longest = std::max(longest, convs.At(name).length);
    }
    EXPECT_GE(longest, 4096) << sc.ToText();
    reached_context += longest == config.max_position_embeddings;
    past_8192 += longest > 8192;
  }
  EXPECT_GE(reached_context, 2) << "some cases run to the end of their context";
  EXPECT_GT(past_8192, 10);
}

#ifdef KVDIFF_LONG_TIER_WITH_TORCH
// A forward whose whole mask would pass kWholeMaskEntries attends a block of queries at a time;
// its rows are those the whole mask gives (up to the BLAS's rounding of other matrix shapes).
// With a sliding window too: each block's rows get the window, as the whole mask does.
class BlockByBlock : public ::testing::TestWithParam<int64_t> {};

TEST_P(BlockByBlock, TheReferenceAttendsBlockByBlockPastItsWholeMaskAndGivesTheSameRows) {
  format::LlamaConfig config = DrawShape(2, 0, ShapeTier::kLong);
  config.max_position_embeddings = 8192;
  config.sliding_window = GetParam();
  ModelSpec spec;
  spec.config = config;
  spec.seed = 3;
  const auto weights = LoadModelFor(spec);
  Tokens tokens(4300);  // 4300 x 4301 mask entries: past kWholeMaskEntries (4096 x 4097)
  for (size_t i = 0; i < tokens.size(); ++i)
    tokens[i] = static_cast<Token>((i * 131 + 17) % config.vocab_size);
  const Tokens head(tokens.begin(), tokens.begin() + 4096);  // the whole mask, as before
  for (const char* name : {"ref", "ref64"}) {
    const auto backend = MakeBackend(name, weights, 2);
    const Logits blocked = backend->ForwardFull(tokens);
    const Logits whole = backend->ForwardFull(head);
    ASSERT_EQ(blocked.rows(), 4300);
    // In float64 the rows agree to the last bits; in float32, softmax sums over rows of another
    // length round otherwise (1.5e-5 measured), as they do in transformers itself.
    const double diff = MaxAbsDiff(blocked.topRows(4096), whole);
    EXPECT_LE(diff, std::string(name) == "ref64" ? 1e-12 : kDefaultTolerance) << name;
  }
}
INSTANTIATE_TEST_SUITE_P(LongTier, BlockByBlock, ::testing::Values(0, 300));

// Through the binary. impl,ref64 passes the long tier. ref with --tolerance 1e-4 (no rope-f32
// allowance: a port whose angles are float32 and who does not say so) agrees with its own
// uncached forward everywhere, since both paths round the same angles; against ref64 it fails,
// at a position far past the short cases' reach.
TEST(LongTier, PassesOnImplAndRef64AndOnlyTheReferenceComparisonSeesFloat32Angles) {
  TempDir dir;
  const std::string tier = "check --long --cases 2 --max-length 6000 --jobs 2 --shrink 0 ";
  const auto pass = RunKvdiff(tier + "--json pass.json", dir.path());
  EXPECT_EQ(pass.exit_code, 0) << pass.out << pass.err;
  EXPECT_THAT(pass.out, HasSubstr("kvdiff check: long tier: random long-context shapes"));
  EXPECT_THAT(pass.out, HasSubstr("backends impl,ref64"));
  const auto j = nlohmann::json::parse(ReadFile(dir / "pass.json"));
  EXPECT_EQ(j.at("shapes"), "long");
  EXPECT_GT(j.at("coverage").at("longest").get<int64_t>(), 4096);

  const auto alone = RunKvdiff(tier + "--backends ref --tolerance 1e-4", dir.path());
  EXPECT_EQ(alone.exit_code, 0) << "cached and uncached share the float32 angles\n" << alone.out;
  const auto against =
      RunKvdiff(tier + "--backends ref,ref64 --tolerance 1e-4 --json f.json", dir.path());
  EXPECT_EQ(against.exit_code, 1) << against.out << against.err;
  const auto f = nlohmann::json::parse(ReadFile(dir / "f.json"));
  EXPECT_GT(f.at("worst_diff").get<double>(), 1e-4);
}
#endif

}  // namespace
}  // namespace kvdiff::testing
