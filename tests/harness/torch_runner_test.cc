// The runner across impl, ref and ref64 on the tiny model: cross-backend comparisons, and the
// transformers-style reuse misuse (silent on the reference, an error on impl's raw call).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "harness/backend.h"
#include "harness/runner.h"
#include "harness/scenario.h"

namespace kvdiff::harness {
namespace {

using ::testing::HasSubstr;

class TorchRunnerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ModelSpec spec;
    spec.preset = "tiny";
    spec.seed = 3;
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

}  // namespace
}  // namespace kvdiff::harness
