// The differential run across impl, ref and ref64 on the tiny model: cross-backend comparisons, and
// the transformers-style reuse misuse (silent on the reference, an error on impl's raw call).
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "harness/backend/backend.h"
#include "harness/compare/tolerance_profile.h"
#include "harness/run/differential_run.h"
#include "harness/scenario/scenario.h"
#include "tests/harness/harness_test_util.h"

namespace kvdiff::harness {
namespace {

using ::testing::HasSubstr;

class TorchRunnerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const ModelSpec spec = testing::TinyModel(3);
    weights_ = new std::shared_ptr<const format::ModelWeights>(LoadModelFor(spec));
    for (const char* name : {"impl", "ref", "ref64"}) {
      backends_.push_back(MakeBackend(name, *weights_, 1).release());
    }
  }
  static void TearDownTestSuite() {
    for (auto* b : backends_) delete b;
    backends_.clear();
    delete weights_;
  }
  RunReport Run(const std::string& json) {
    Scenario sc = ParseScenario(json);
    PrepareScenario(sc, **weights_);
    RunOptions options;
    options.localize = true;
    return RunScenario(sc, {backends_.begin(), backends_.end()}, options);
  }
  static std::shared_ptr<const format::ModelWeights>* weights_;
  static std::vector<const Backend*> backends_;
};
std::shared_ptr<const format::ModelWeights>* TorchRunnerTest::weights_ = nullptr;
std::vector<const Backend*> TorchRunnerTest::backends_;

TEST_F(TorchRunnerTest, SessionsOfAllThreeBackendsAgreeRowByRow) {
  const RunReport r = Run(R"({"model": {"preset": "tiny", "seed": 3},
    "steps": [{"op": "prefill", "tokens": [5, 17, 3, 99, 42], "chunks": [3, 2]},
              {"op": "decode", "n": 10},
              {"op": "fork", "from": "main", "to": "f"},
              {"op": "truncate", "conversation": "f", "length": 6},
              {"op": "prefill", "conversation": "f", "tokens": [8, 9]},
              {"op": "decode", "conversation": "f", "n": 4}]})");
  EXPECT_TRUE(r.Passed()) << (r.first_divergence ? r.first_divergence->path : "");
  // 3 oracle columns + 3 pairs.
  ASSERT_EQ(r.steps[0].outcomes.size(), 6u);
  std::vector<std::string> paths;
  for (const auto& o : r.steps[0].outcomes) paths.push_back(o.path);
  EXPECT_EQ(paths, (std::vector<std::string>{"impl", "ref", "ref64", "impl~ref", "impl~ref64",
                                             "ref~ref64"}));
  for (const auto& o : r.steps[1].outcomes) {
    EXPECT_EQ(o.status, PathStatus::kPass) << o.path;
    EXPECT_EQ(o.rows.size(), 10u) << o.path;
  }
  EXPECT_EQ(r.rows_compared, 6 * (5 + 10 + 2 + 4));
}

TEST_F(TorchRunnerTest, ReusingADynamicCacheIsSilentAndWrong) {
  const RunReport r = Run(R"({"model": {"preset": "tiny", "seed": 3}, "driver": "reuse",
    "steps": [{"op": "prefill", "tokens": [5, 17, 3, 99, 42]}, {"op": "decode", "n": 19},
              {"op": "new_conversation", "name": "second"},
              {"op": "prefill", "conversation": "second", "tokens": [8, 17, 3, 120, 42]}]})");
  ASSERT_EQ(r.steps[3].outcomes.size(), 6u);
  EXPECT_EQ(r.steps[3].outcomes[0].status, PathStatus::kError);  // impl: cannot broadcast
  EXPECT_THAT(r.steps[3].outcomes[0].message, HasSubstr("cannot broadcast [5, 5]"));
  EXPECT_EQ(r.steps[3].outcomes[1].status, PathStatus::kFail);     // ref: silent, wrong
  EXPECT_EQ(r.steps[3].outcomes[2].status, PathStatus::kFail);     // ref64 likewise
  EXPECT_EQ(r.steps[3].outcomes[3].status, PathStatus::kSkipped);  // impl~ref: impl has no rows
  ASSERT_TRUE(r.first_divergence.has_value());
  EXPECT_EQ(r.first_divergence->a, "ref");
  EXPECT_EQ(r.first_divergence->row.position, 0);
  ASSERT_TRUE(r.localization.has_value());
  EXPECT_TRUE(r.localization->found);
  EXPECT_EQ(r.localization->layer, 0);
  EXPECT_EQ(r.localization->block, "attention") << "the stale cache is read by attention";
}

// The map of a cross divergence: impl against ref64 at a tolerance (1e-9) that float32 cannot
// meet, so the two backends' traces differ at every row of the prompt (while a one-call prompt is
// its own ForwardFull on each): one column per row, in order, both traced by replaying each
// backend's calls.
TEST_F(TorchRunnerTest, CrossDivergenceMapsEveryRowOfTheStepOnBothBackends) {
  Scenario sc = ParseScenario(R"({"model": {"preset": "tiny", "seed": 3},
    "tolerance": {"abs": 1e-9},
    "steps": [{"op": "prefill", "tokens": [5, 17, 3, 99, 42]}]})");
  PrepareScenario(sc, **weights_);
  RunOptions options;
  options.localize = true;
  const RunReport r = RunScenario(sc, {backends_[0], backends_[2]}, options);
  ASSERT_TRUE(r.first_divergence.has_value());
  ASSERT_EQ(r.first_divergence->kind, PathKind::kCross) << r.first_divergence->path;
  ASSERT_TRUE(r.localization.has_value());
  const Localization& loc = *r.localization;
  ASSERT_EQ(loc.columns.size(), 5u) << loc.note;
  for (size_t c = 0; c < 5; ++c) EXPECT_EQ(loc.columns[c].position, static_cast<int64_t>(c));
  EXPECT_EQ(loc.columns[loc.divergent_column].row, r.first_divergence->row.row);
  const auto layers = static_cast<size_t>((*weights_)->config.num_hidden_layers);
  ASSERT_EQ(loc.attention_map.size(), layers);
  for (size_t l = 0; l < layers; ++l) {
    ASSERT_EQ(loc.mlp_map[l].size(), 5u);
    for (size_t c = 0; c < 5; ++c) {
      EXPECT_GT(loc.mlp_map[l][c], 0) << "float32 against float64, layer " << l << ", row " << c;
      EXPECT_LT(loc.mlp_map[l][c], 1e-3) << "the same model: rounding, not a bug";
    }
  }
  ASSERT_TRUE(loc.first_cell.has_value());
  EXPECT_EQ(loc.first_cell->column, 0u);
}

// The rope-f32 profile, measured: on a 512-position prefill, ref (transformers' float32 angles)
// drifts from ref64 past the flat 1e-4 gate at high positions while impl (angles in double) stays
// within it; with the profile's allowance every cross path passes, and every backend's own
// cached-vs-uncached path is held to the flat gate either way.
TEST(RopeF32Profile, Float32AnglesDriftWithThePositionAndTheProfileAllowsExactlyThat) {
  const ModelSpec spec = testing::TinyModel();
  const auto weights = LoadModelFor(spec);
  std::vector<std::unique_ptr<Backend>> owned;
  std::vector<const Backend*> backends;
  for (const char* name : {"impl", "ref", "ref64"}) {
    owned.push_back(MakeBackend(name, weights, 1));
    backends.push_back(owned.back().get());
  }
  std::vector<int64_t> tokens;
  uint64_t x = 1;
  for (int i = 0; i < 512; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    tokens.push_back(static_cast<int64_t>((x >> 33) % 256));
  }
  Scenario sc = ParseScenario(fmt::format(
      R"({{"model": {{"preset": "tiny", "seed": 7}}, "steps": [{{"op": "prefill",
          "tokens": [{}], "chunks": [128, 128, 128, 128]}}]}})",
      fmt::join(tokens, ",")));
  PrepareScenario(sc, *weights);

  std::string note;
  const double allowance = ResolveRopeAllowance(std::nullopt, backends, &note);
  EXPECT_EQ(allowance, RopeF32Profile().per_position);
  EXPECT_THAT(note, HasSubstr("tolerance profile rope-f32"));
  EXPECT_THAT(note, HasSubstr("for ref:"));
  EXPECT_EQ(ResolveRopeAllowance(std::nullopt, {backends[0], backends[2]}, &note), 0.0);
  EXPECT_EQ(note, "");  // impl and ref64 compute their angles in double
  EXPECT_EQ(ResolveRopeAllowance(1e-4, backends, &note), 0.0);  // a --tolerance flag wins

  auto status = [](const RunReport& r, const std::string& path) {
    for (const PathOutcome& o : r.steps[0].outcomes)
      if (o.path == path) return o.status;
    ADD_FAILURE() << "no path " << path;
    return PathStatus::kSkipped;
  };
  const RunReport flat = RunScenario(sc, backends, RunOptions{});
  EXPECT_EQ(status(flat, "impl~ref64"), PathStatus::kPass);
  EXPECT_EQ(status(flat, "ref~ref64"), PathStatus::kFail);  // the drift, beyond 1e-4
  Scenario with_profile = sc;
  with_profile.gate.rope_f32_per_position = allowance;
  const RunReport profiled = RunScenario(with_profile, backends, RunOptions{});
  EXPECT_TRUE(profiled.Passed());
  for (const char* own : {"impl", "ref", "ref64"}) {
    EXPECT_EQ(status(flat, own), PathStatus::kPass) << own;
    EXPECT_EQ(status(profiled, own), PathStatus::kPass) << own;
  }
  EXPECT_EQ(profiled.gate.rope_f32_per_position, allowance);
}

}  // namespace
}  // namespace kvdiff::harness
