// A backend that outlasts its time-out (EngineHungError) is stopped for the rest of the scenario:
// the step it hung in fails, every later step is skipped without calling it, its oracle pass is
// not run, and the run names it (RunReport::hung_backends). A backend that merely errs goes on
// with its other conversations, as before.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "format/error.h"
#include "harness/backend/registry.h"
#include "harness/replay/oracle_check.h"
#include "harness/replay/replay.h"
#include "harness/run/differential_run.h"
#include "harness/scenario/scenario.h"
#include "tests/harness/wrapped_backend.h"

namespace kvdiff::testing {
namespace {

using namespace kvdiff::harness;
using ::testing::HasSubstr;

// What a HangingBackend was asked, and when it hangs.
struct Calls {
  int64_t hang_past = 0;  // an append that would take a session past this many positions hangs
  int64_t hang_forward_full_past = 1 << 30;  // so does a ForwardFull of more tokens than this
  bool hung_error = true;  // false: it throws a plain EngineError instead (a crash, say)
  int64_t appends = 0, new_sessions = 0, forward_fulls = 0;
};

void Hang(const Calls& calls) {
  if (calls.hung_error) throw EngineHungError("hanging: did not answer within 1 s (killed)");
  throw EngineError("hanging: was killed by signal 11");
}

class HangingSession : public BackendSession {
 public:
  HangingSession(std::unique_ptr<BackendSession> inner, Calls& calls)
      : inner_(std::move(inner)), calls_(calls) {}
  Logits Append(const Tokens& tokens, ForwardTrace* trace) override {
    ++calls_.appends;
    if (inner_->Length() + static_cast<int64_t>(tokens.size()) > calls_.hang_past) Hang(calls_);
    return inner_->Append(tokens, trace);
  }
  int64_t Length() const override { return inner_->Length(); }
  void Truncate(int64_t length) override { inner_->Truncate(length); }
  std::unique_ptr<BackendSession> Fork() const override {
    return std::make_unique<HangingSession>(inner_->Fork(), calls_);
  }
  void Reset() override { inner_->Reset(); }

 private:
  std::unique_ptr<BackendSession> inner_;
  Calls& calls_;
};

class HangingBackend : public WrappedBackend {
 public:
  HangingBackend(std::unique_ptr<Backend> inner, Calls& calls)
      : WrappedBackend(std::move(inner), "hanging"), calls_(calls) {}
  Logits ForwardFull(const Tokens& t, ForwardTrace* trace) const override {
    ++calls_.forward_fulls;
    if (static_cast<int64_t>(t.size()) > calls_.hang_forward_full_past) Hang(calls_);
    return inner().ForwardFull(t, trace);
  }
  std::unique_ptr<BackendSession> NewSession() const override {
    ++calls_.new_sessions;
    return std::make_unique<HangingSession>(inner().NewSession(), calls_);
  }

 private:
  Calls& calls_;
};

// main hangs at step 1 (past 4 positions) when hang_past is 4; c runs on its own session after it.
constexpr const char* kScenario = R"({
  "model": {"preset": "tiny", "seed": 3},
  "steps": [
    {"op": "prefill", "tokens": [1, 2, 3]},
    {"op": "prefill", "tokens": [4, 5]},
    {"op": "new_conversation", "name": "c"},
    {"op": "prefill", "conversation": "c", "tokens": [6, 7]},
    {"op": "decode", "conversation": "c", "n": 2}
  ]
})";

struct Fixture {
  Scenario sc = ParseScenario(kScenario);
  std::shared_ptr<const format::ModelWeights> weights = LoadModelFor(sc.model);
  Calls calls;
  Fixture() { PrepareScenario(sc, *weights); }
  std::unique_ptr<HangingBackend> Backend() {
    return std::make_unique<HangingBackend>(MakeBackend("impl", weights, 1), calls);
  }
};

TEST(HungBackend, TheStepItHungInFailsAndNoLaterStepCallsIt) {
  Fixture f;
  f.calls.hang_past = 4;
  const auto backend = f.Backend();
  const Recording rec = Replay(f.sc, *backend);
  ASSERT_EQ(rec.hung_at, std::optional<size_t>(1));
  EXPECT_EQ(rec.steps[1].status, StepStatus::kError);
  EXPECT_THAT(rec.steps[1].message, HasSubstr("did not answer within 1 s"));
  for (size_t i = 2; i < rec.steps.size(); ++i) {
    EXPECT_EQ(rec.steps[i].status, StepStatus::kSkipped) << i;
    EXPECT_EQ(rec.steps[i].message, "not run: hanging stopped answering at step 1") << i;
  }
  EXPECT_EQ(f.calls.appends, 2);       // steps 0 and 1; c's prefill and decode never came
  EXPECT_EQ(f.calls.new_sessions, 1);  // main's; c's new_conversation was not run either

  // Its own oracle pass would call it again: not run, and no step is failed by it.
  const OracleCheck oracle = CheckAgainstOracle(rec, *backend, f.sc.gate.Own());
  EXPECT_THAT(oracle.not_run, HasSubstr("not checked against hanging ForwardFull: it stopped "
                                        "answering at step 1"));
  EXPECT_EQ(f.calls.forward_fulls, 0);
  EXPECT_EQ(oracle.FirstError(rec), std::optional<size_t>(1));

  const RunReport run = RunScenario(f.sc, {backend.get()}, {});
  EXPECT_EQ(run.hung_backends, std::vector<std::string>{"hanging"});
  ASSERT_TRUE(run.first_error.has_value());
  EXPECT_EQ(run.first_error->step, 1);
  // Step 0 ran before the hang: its rows are not checked, and its column says so (not "pass").
  EXPECT_EQ(run.steps[0].outcomes[0].status, PathStatus::kSkipped);
  EXPECT_THAT(run.steps[0].outcomes[0].message, HasSubstr("it stopped answering at step 1"));
  EXPECT_EQ(run.steps[4].outcomes[0].status, PathStatus::kSkipped);
}

// The contrast that gives the test above its power: a backend that fails otherwise (a crash)
// loses the conversation it failed in, and the others go on calling it.
TEST(HungBackend, AnErrorThatIsNotAHangStopsOnlyItsConversation) {
  Fixture f;
  f.calls.hang_past = 4;
  f.calls.hung_error = false;
  const auto backend = f.Backend();
  const Recording rec = Replay(f.sc, *backend);
  EXPECT_EQ(rec.hung_at, std::nullopt);
  EXPECT_EQ(rec.steps[1].status, StepStatus::kError);
  EXPECT_EQ(rec.steps[3].status, StepStatus::kDone);
  EXPECT_EQ(rec.steps[4].status, StepStatus::kDone);
  EXPECT_EQ(f.calls.new_sessions, 2);
  const RunReport run = RunScenario(f.sc, {backend.get()}, {});
  EXPECT_TRUE(run.hung_backends.empty());
}

// An oracle that hangs on one history is not asked for the next one: that history's steps fail
// with the same story, and the pass says it hung.
TEST(HungBackend, AnOracleThatHungIsNotCalledForTheNextHistory) {
  Fixture f;
  f.calls.hang_past = 1 << 30;
  f.calls.hang_forward_full_past = 1;  // every ForwardFull (main's 5 tokens, c's 4)
  const auto backend = f.Backend();
  const Recording rec = Replay(f.sc, *backend);
  ASSERT_EQ(rec.FirstError(), std::nullopt);
  const OracleCheck oracle = CheckAgainstOracle(rec, *backend, f.sc.gate.Own());
  EXPECT_TRUE(oracle.hung);
  EXPECT_EQ(f.calls.forward_fulls, 1);
  EXPECT_THAT(oracle.failures[0], HasSubstr("the oracle ForwardFull failed: hanging: did not"));
  EXPECT_EQ(oracle.failures[3], oracle.failures[0]);
  const RunReport run = RunScenario(f.sc, {backend.get()}, {});
  EXPECT_EQ(run.hung_backends, std::vector<std::string>{"hanging"});
}

}  // namespace
}  // namespace kvdiff::testing
