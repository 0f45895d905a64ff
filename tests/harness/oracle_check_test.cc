// The oracle pass returns its own table and leaves the recording as replayed: a ForwardFull that
// fails fails the steps whose rows it should have checked (in the table, the run's columns and
// its first error), and nothing else.
#include "harness/replay/oracle_check.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "format/error.h"
#include "harness/backend/registry.h"
#include "harness/replay/replay.h"
#include "harness/run/differential_run.h"
#include "harness/scenario/scenario.h"
#include "tests/harness/wrapped_backend.h"

namespace kvdiff::testing {
namespace {

using namespace kvdiff::harness;
using ::testing::HasSubstr;

// impl, whose ForwardFull refuses histories longer than `longest`.
class ShortOracle : public WrappedBackend {
 public:
  ShortOracle(std::unique_ptr<Backend> inner, int64_t longest)
      : WrappedBackend(std::move(inner), "short-oracle"), longest_(longest) {}
  Logits ForwardFull(const Tokens& t, ForwardTrace* trace) const override {
    if (static_cast<int64_t>(t.size()) > longest_) throw EngineError("history too long");
    return inner().ForwardFull(t, trace);
  }

 private:
  int64_t longest_;
};

// main reaches 5 positions (steps 0 and 1), c stays at 2 (step 3).
constexpr const char* kScenario = R"({
  "model": {"preset": "tiny", "seed": 3},
  "steps": [
    {"op": "prefill", "tokens": [1, 2, 3]},
    {"op": "prefill", "tokens": [4, 5]},
    {"op": "new_conversation", "name": "c"},
    {"op": "prefill", "conversation": "c", "tokens": [6, 7]}
  ]
})";

TEST(OracleCheck, AFailedForwardFullFailsItsStepsInTheTableNotInTheRecording) {
  Scenario sc = ParseScenario(kScenario);
  auto weights = LoadModelFor(sc.model);
  PrepareScenario(sc, *weights);
  const ShortOracle backend(MakeBackend("impl", weights, 1), 4);
  const Recording rec = Replay(sc, backend);
  const OracleCheck oracle = CheckAgainstOracle(rec, backend, sc.gate.Own());

  EXPECT_EQ(rec.FirstError(), std::nullopt) << "the recording stays as replayed";
  ASSERT_EQ(oracle.rows.size(), rec.rows.size());
  for (size_t k = 0; k < rec.rows.size(); ++k) {
    EXPECT_EQ(oracle.rows[k].has_value(), rec.rows[k].conversation == "c") << k;
  }
  EXPECT_THAT(oracle.failures[0], HasSubstr("the oracle ForwardFull failed: history too long"));
  EXPECT_EQ(oracle.failures[1], oracle.failures[0]);
  EXPECT_EQ(oracle.failures[3], "");
  EXPECT_EQ(oracle.FirstError(rec), 0u);
  EXPECT_EQ(oracle.StepError(rec, 3), std::nullopt);

  const RunReport run = RunScenario(sc, {&backend}, {});
  EXPECT_EQ(run.steps[1].outcomes[0].status, PathStatus::kError);
  EXPECT_EQ(run.steps[1].outcomes[0].message, oracle.failures[1]);
  EXPECT_EQ(run.steps[3].outcomes[0].status, PathStatus::kPass);
  ASSERT_TRUE(run.first_error.has_value());
  EXPECT_EQ(run.first_error->step, 0);
  EXPECT_EQ(run.first_error->message, oracle.failures[0]);
}

TEST(OracleCheck, ARowIsHeldToTheGateOfItsPosition) {
  Scenario sc = ParseScenario(kScenario);
  auto weights = LoadModelFor(sc.model);
  PrepareScenario(sc, *weights);
  const auto impl = MakeBackend("impl", weights, 1);
  const Recording rec = Replay(sc, *impl);
  // A gate no row can meet past position 2 (impl's cached rows differ from its uncached ones by
  // rounding alone): exactly those rows fail.
  const OracleCheck oracle = CheckAgainstOracle(
      rec, *impl, [](int64_t position) { return Tolerance(position > 2 ? -1 : 1); });
  for (size_t k = 0; k < rec.rows.size(); ++k) {
    ASSERT_TRUE(oracle.rows[k].has_value());
    EXPECT_EQ(oracle.rows[k]->within_tolerance, rec.rows[k].position <= 2) << k;
  }
}

}  // namespace
}  // namespace kvdiff::testing
