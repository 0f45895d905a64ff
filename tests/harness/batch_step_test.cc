// Batch steps (a serving engine's call: several conversations in one engine call) and end steps:
// read and written back, validated, replayed through Backend::AppendBatch with every returned row
// recorded under its conversation and position, and impl's batched forward held to the same items
// appended one at a time.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>

#include "format/error.h"
#include "harness/backend/backend.h"
#include "harness/backend/registry.h"
#include "harness/replay/oracle_check.h"
#include "harness/replay/replay.h"
#include "harness/run/differential_run.h"
#include "harness/scenario/scenario.h"
#include "tests/harness/harness_test_util.h"
#include "tests/test_support.h"

namespace kvdiff::harness {
namespace {

using ::testing::HasSubstr;

const char* kServing = R"({"model": {"preset": "tiny", "seed": 3}, "steps": [
  {"op": "new_conversation", "name": "b"},
  {"op": "batch", "items": [{"conversation": "main", "tokens": [5, 17, 3, 99, 42]},
                            {"conversation": "b", "tokens": [7, 8, 9], "logits": "last"}]},
  {"op": "fork", "from": "main", "to": "twin"},
  {"op": "batch", "items": [{"conversation": "twin", "decode": true},
                            {"conversation": "b", "tokens": [1, 2], "logits": "none"},
                            {"conversation": "main", "decode": true}]},
  {"op": "end", "conversation": "b"},
  {"op": "new_conversation", "name": "b"},
  {"op": "batch", "items": [{"conversation": "b", "tokens": [4, 4, 4, 4, 4, 4, 4, 4, 4, 4]},
                            {"conversation": "main", "decode": true}]}]})";

class BatchStepTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    weights_ = new std::shared_ptr<const format::ModelWeights>(LoadModelFor(testing::TinyModel(3)));
    impl_ = MakeBackend("impl", *weights_, 1).release();
  }
  static void TearDownTestSuite() {
    delete impl_;
    delete weights_;
  }
  static Scenario Serving() {
    Scenario sc = ParseScenario(kServing);
    ValidateScenario(sc, impl_->config());
    return sc;
  }
  static std::shared_ptr<const format::ModelWeights>* weights_;
  static Backend* impl_;
};
std::shared_ptr<const format::ModelWeights>* BatchStepTest::weights_ = nullptr;
Backend* BatchStepTest::impl_ = nullptr;

TEST_F(BatchStepTest, ReadsWritesBackAndNamesItsItems) {
  const Scenario sc = Serving();
  EXPECT_EQ(sc.steps[1].ParamString(), "batch(main:5,b:3/last)");
  EXPECT_EQ(sc.steps[3].ParamString(), "batch(twin:decode,b:2/none,main:decode)");
  EXPECT_EQ(sc.steps[4].ParamString(), "end(b)");
  const Scenario back = ParseScenario(sc.ToText());
  ASSERT_EQ(back.steps.size(), sc.steps.size());
  for (size_t i = 0; i < sc.steps.size(); ++i)
    EXPECT_EQ(back.steps[i].ParamString(), sc.steps[i].ParamString());
  EXPECT_EQ(back.steps[1].items[0].tokens, (Tokens{5, 17, 3, 99, 42}));
}

// Every row asked for is recorded under its conversation and position, and no other.
TEST_F(BatchStepTest, RecordsTheRowsAskedForUnderTheirConversationAndPosition) {
  const Recording rec = Replay(Serving(), *impl_);
  ASSERT_FALSE(rec.FirstError()) << rec.steps[*rec.FirstError()].message;
  std::vector<std::string> rows;
  for (size_t r = rec.steps[1].rows_begin; r < rec.steps[1].rows_end; ++r)
    rows.push_back(rec.rows[r].conversation + "@" + std::to_string(rec.rows[r].position));
  EXPECT_EQ(rows,
            (std::vector<std::string>{"main@0", "main@1", "main@2", "main@3", "main@4", "b@2"}));
  rows.clear();
  for (size_t r = rec.steps[3].rows_begin; r < rec.steps[3].rows_end; ++r)
    rows.push_back(rec.rows[r].conversation + "@" + std::to_string(rec.rows[r].position));
  EXPECT_EQ(rows, (std::vector<std::string>{"twin@5", "main@5"}));
  // The twin and its source were fed the same history: their decode rows chose the same token.
  EXPECT_EQ(rec.rows[rec.steps[3].rows_begin].token, rec.rows[rec.steps[3].rows_begin + 1].token);
  const OracleCheck oracle = CheckAgainstOracle(rec, *impl_, Tolerance{kDefaultTolerance, 0});
  for (size_t r = 0; r < rec.rows.size(); ++r) {
    ASSERT_TRUE(oracle.rows[r].has_value());
    EXPECT_LE(oracle.rows[r]->max_abs_diff, kDefaultTolerance)
        << rec.rows[r].conversation << "@" << rec.rows[r].position;
  }
}

// impl's batched forward against the same items appended alone: the rows go through the same
// matrix products in one call, so only the order of float32 sums may differ (the GEMM takes over
// from the row kernel past kLinearRowsMax rows), held to 2e-5, a fifth of the gate.
TEST_F(BatchStepTest, ImplBatchedForwardEqualsTheItemsAppendedAloneWithinRounding) {
  auto a = impl_->NewSession(), b = impl_->NewSession(), c = impl_->NewSession();
  a->Append({1, 2, 3});
  b->Append({9});
  auto a1 = a->Fork(), b1 = b->Fork(), c1 = impl_->NewSession();
  const std::vector<BatchItem> items = {{a.get(), {4, 5, 6, 7}, {}},
                                        {b.get(), {8}, {}},
                                        {c.get(), {10, 11, 12, 13, 14, 15, 16, 17, 18}, {}}};
  const std::vector<Logits> batched = impl_->AppendBatch(items);
  const Logits alone[] = {a1->Append({4, 5, 6, 7}), b1->Append({8}),
                          c1->Append({10, 11, 12, 13, 14, 15, 16, 17, 18})};
  for (size_t i = 0; i < 3; ++i) {
    ASSERT_EQ(batched[i].rows(), alone[i].rows());
    EXPECT_LT((batched[i] - alone[i]).cwiseAbs().maxCoeff(), 2e-5) << "item " << i;
  }
  EXPECT_EQ(a->Length(), 7);
  EXPECT_EQ(b->Length(), 2);
  EXPECT_EQ(c->Length(), 9);
  // Output flags: only the rows asked for, in order.
  auto d = a->Fork(), d1 = a->Fork();
  const std::vector<Logits> last = impl_->AppendBatch({{d.get(), {3, 3, 3}, {false, true, true}}});
  const Logits all = d1->Append({3, 3, 3});
  ASSERT_EQ(last[0].rows(), 2);
  EXPECT_LT((last[0] - all.bottomRows(2)).cwiseAbs().maxCoeff(), 2e-5);
}

TEST_F(BatchStepTest, ImplRefusesASessionTwiceAndChangesNothing) {
  auto a = impl_->NewSession();
  a->Append({1, 2});
  try {
    impl_->AppendBatch({{a.get(), {3}, {}}, {a.get(), {4}, {}}});
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(), HasSubstr("share a cache"));
  }
  EXPECT_EQ(a->Length(), 2);
}

TEST_F(BatchStepTest, ARunOfBatchStepsPassesOnImpl) {
  Scenario sc = Serving();
  sc.name = "serving";
  const RunReport run = RunScenario(sc, {impl_}, {});
  EXPECT_TRUE(run.Passed());
}

}  // namespace
}  // namespace kvdiff::harness
