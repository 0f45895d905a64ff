// ReplayAndCompare on the tiny model with several impl instances: the rows of every backend but
// the last are compared as the last one replays and freed (a case holds one backend's logits, not
// one per backend), in rounds a campaign's idle job can share, with the same comparisons in any
// order the rounds' tasks run.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "harness/backend/registry.h"
#include "harness/run/differential_run.h"
#include "tests/harness/harness_test_util.h"

namespace kvdiff::harness {
namespace {

class ReplayAndCompareTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    weights_ = new std::shared_ptr<const format::ModelWeights>(LoadModelFor(testing::TinyModel(3)));
    owned_ = new std::vector<std::unique_ptr<Backend>>();
    for (int b = 0; b < 4; ++b) owned_->push_back(MakeBackend("impl", *weights_, 1));
  }
  static void TearDownTestSuite() {
    delete owned_;
    delete weights_;
  }

  static std::vector<const Backend*> Backends(size_t n) {
    std::vector<const Backend*> out;
    for (size_t b = 0; b < n; ++b) out.push_back((*owned_)[b].get());
    return out;
  }

  static Scenario Forks() {
    Scenario sc = ParseScenario(R"({"model": {"preset": "tiny", "seed": 3},
      "steps": [{"op": "prefill", "tokens": [5, 17, 3, 99, 42], "chunks": [3, 2]},
                {"op": "decode", "n": 6},
                {"op": "fork", "from": "main", "to": "f"},
                {"op": "truncate", "conversation": "f", "length": 7},
                {"op": "prefill", "conversation": "f", "tokens": [1, 2, 3]},
                {"op": "decode", "conversation": "f", "n": 3}]})");
    sc.name = "forks";
    PrepareScenario(sc, **weights_);
    return sc;
  }

  static std::shared_ptr<const format::ModelWeights>* weights_;
  static std::vector<std::unique_ptr<Backend>>* owned_;
};
std::shared_ptr<const format::ModelWeights>* ReplayAndCompareTest::weights_ = nullptr;
std::vector<std::unique_ptr<Backend>>* ReplayAndCompareTest::owned_ = nullptr;

// The rows each cross outcome compared, pair by pair and step by step.
std::vector<size_t> RowsCompared(const Replayed& r) {
  std::vector<size_t> out;
  for (const auto& [pair, steps] : r.cross) {
    for (const PathOutcome& o : steps) out.push_back(o.rows.size());
  }
  return out;
}

TEST_F(ReplayAndCompareTest, FreesEveryLogitsRowButTheLastBackendsAndComparesThemAll) {
  const Scenario sc = Forks();
  const Replayed r = ReplayAndCompare(sc, Backends(3), RunOptions{});
  ASSERT_EQ(r.recs.size(), 3u);
  const int64_t vocab = (*weights_)->config.vocab_size;
  for (size_t b = 0; b < 3; ++b) {
    ASSERT_EQ(r.recs[b].rows.size(), 5u + 6 + 3 + 3) << "backend " << b;
    for (const RecordedRow& row : r.recs[b].rows) {
      EXPECT_EQ(row.logits.size(), b < 2 ? 0u : static_cast<size_t>(vocab))
          << "backend " << b << ", step " << row.step << ", row " << row.row;
    }
  }
  // Each pair compared every row, where their histories agree (everywhere: three instances of
  // one backend), and each backend's rows met its oracle.
  ASSERT_EQ(r.cross.size(), 3u);
  for (const auto& [pair, steps] : r.cross) {
    EXPECT_LT(pair.first, pair.second);
    ASSERT_EQ(steps.size(), sc.steps.size());
    size_t rows = 0;
    for (const PathOutcome& o : steps) {
      rows += o.rows.size();
      EXPECT_EQ(o.a_index, pair.first);
      EXPECT_EQ(o.b_index, pair.second);
      EXPECT_EQ(o.max_abs_diff, 0.0) << "the same backend, the same bits";
    }
    EXPECT_EQ(rows, 17u);
  }
  for (const OracleCheck& oracle : r.oracles) {
    EXPECT_TRUE(std::all_of(oracle.rows.begin(), oracle.rows.end(),
                            [](const auto& c) { return c && c->within_tolerance; }));
  }
}

TEST_F(ReplayAndCompareTest, RunsEachOraclePassBesideTheNextReplayInAnyOrder) {
  const Scenario sc = Forks();
  const Replayed in_order = ReplayAndCompare(sc, Backends(3), RunOptions{});
  // A campaign's idle job may start a round's replay before its oracle pass: rows are then freed
  // only once that pass is done, and the comparisons are the same.
  std::vector<std::vector<size_t>> rounds;
  RunOptions options;
  options.for_each_backend = [&](const std::vector<size_t>& which, const auto& work) {
    rounds.push_back(which);
    for (auto b = which.rbegin(); b != which.rend(); ++b) work(*b, *Backends(3)[*b]);
  };
  const Replayed reversed = ReplayAndCompare(sc, Backends(3), options);
  EXPECT_EQ(rounds, (std::vector<std::vector<size_t>>{{0}, {0, 1}, {1, 2}, {2}}));
  EXPECT_EQ(RowsCompared(reversed), RowsCompared(in_order));
  for (size_t b = 0; b < 2; ++b) {
    for (const RecordedRow& row : reversed.recs[b].rows) EXPECT_TRUE(row.logits.empty());
  }
}

TEST_F(ReplayAndCompareTest, ReportListsOraclesThenEveryPairInOrder) {
  // Four backends: the pairs are compared as each later one replays ((0,1), then (0,2), (1,2),
  // then (0,3), ...) but reported in the order of before, (0,1), (0,2), (0,3), (1,2), ...
  const RunReport report = RunScenario(Forks(), Backends(4), RunOptions{});
  EXPECT_TRUE(report.Passed());
  std::vector<std::pair<size_t, size_t>> want = {{0, 0}, {1, 1}, {2, 2}, {3, 3}, {0, 1},
                                                 {0, 2}, {0, 3}, {1, 2}, {1, 3}, {2, 3}};
  for (const StepReport& step : report.steps) {
    std::vector<std::pair<size_t, size_t>> got;
    for (const PathOutcome& o : step.outcomes) got.emplace_back(o.a_index, o.b_index);
    EXPECT_EQ(got, want) << "step " << step.index;
  }
  EXPECT_EQ(report.rows_compared, 17 * (4 + 6));
}

}  // namespace
}  // namespace kvdiff::harness
