// The one replay holds a session's Length() to what it was fed after every call (append,
// truncate, fork on both sides, reset, a new conversation): a session that miscounts its
// positions fails that step, naming the backend, the conversation, what it was fed and what it
// said, even when its logits are right. The lying plugin (broken_plugin.c, lie=...) is caught the
// same way through the binary (bad_input_catalogue.txt).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "format/model_files.h"
#include "harness/backend/registry.h"
#include "harness/replay/replay.h"
#include "harness/run/differential_run.h"
#include "harness/scenario/scenario.h"

namespace kvdiff::testing {
namespace {

using namespace kvdiff::harness;
using ::testing::HasSubstr;

// impl, whose sessions say one position more than they hold once `lie_after` has happened to
// them: "new" (from the start), "truncate", "fork-parent", "fork-child" or "reset".
class LiesAfter : public Backend {
 public:
  LiesAfter(std::unique_ptr<Backend> inner, std::string lie_after)
      : inner_(std::move(inner)), lie_after_(std::move(lie_after)) {
    info_.name = "lies-after-" + lie_after_;
    info_.dtype = "float32";
  }
  const BackendInfo& Info() const override { return info_; }
  const format::LlamaConfig& config() const override { return inner_->config(); }
  Logits ForwardFull(const Tokens& t, ForwardTrace* trace) const override {
    return inner_->ForwardFull(t, trace);
  }
  std::unique_ptr<BackendSession> NewSession() const override {
    return std::make_unique<Session>(inner_->NewSession(), lie_after_, lie_after_ == "new");
  }

 private:
  struct Session : BackendSession {
    Session(std::unique_ptr<BackendSession> inner, std::string lie_after, bool lying)
        : inner(std::move(inner)), lie_after(std::move(lie_after)), lying(lying) {}
    Logits Append(const Tokens& t, ForwardTrace* trace) override { return inner->Append(t, trace); }
    int64_t Length() const override { return inner->Length() + (lying ? 1 : 0); }
    void Truncate(int64_t n) override {
      inner->Truncate(n);
      lying = lying || lie_after == "truncate";
    }
    std::unique_ptr<BackendSession> Fork() const override {
      lying = lying || lie_after == "fork-parent";
      return std::make_unique<Session>(inner->Fork(), lie_after, lie_after == "fork-child");
    }
    void Reset() override {
      inner->Reset();
      lying = lie_after == "reset";
    }
    std::unique_ptr<BackendSession> inner;
    std::string lie_after;
    mutable bool lying;  // a fork changes what the parent says (Fork is const)
  };
  BackendInfo info_;
  std::unique_ptr<Backend> inner_;
  std::string lie_after_;
};

// Every op the replay makes, each once.
constexpr const char* kScenario = R"({
  "model": {"preset": "tiny", "seed": 3},
  "steps": [
    {"op": "prefill", "tokens": [1, 2, 3]},
    {"op": "fork", "from": "main", "to": "b"},
    {"op": "truncate", "conversation": "b", "length": 1},
    {"op": "reset", "conversation": "main"},
    {"op": "new_conversation", "name": "c"},
    {"op": "prefill", "conversation": "c", "tokens": [4]}
  ]
})";

struct Lie {
  const char* after;
  size_t step;          // the step that must fail
  const char* message;  // what it must say
};

TEST(LengthCheck, EveryOpHoldsLengthToWhatWasFed) {
  Scenario sc = ParseScenario(kScenario);
  auto weights = LoadModelFor(sc.model);
  PrepareScenario(sc, *weights);
  const Lie lies[] = {
      {"new", 0,
       "conversation \"main\": Length() is 4 after an append of 3 tokens, but kvdiff "
       "fed it 3 positions"},
      {"fork-parent", 1,
       "conversation \"main\": Length() is 4 after a fork to \"b\", but kvdiff "
       "fed it 3 positions"},
      {"fork-child", 1,
       "conversation \"b\": Length() is 4 after a fork from \"main\", but "
       "kvdiff fed it 3 positions"},
      {"truncate", 2,
       "conversation \"b\": Length() is 2 after truncate to 1, but kvdiff fed it 1 "
       "positions"},
      {"reset", 3,
       "conversation \"main\": Length() is 1 after reset, but kvdiff fed it 0 "
       "positions"},
  };
  for (const Lie& lie : lies) {
    const LiesAfter backend(MakeBackend("impl", weights, 1), lie.after);
    const Recording rec = Replay(sc, backend);
    ASSERT_EQ(rec.FirstError(), lie.step) << lie.after;
    EXPECT_THAT(rec.steps[lie.step].message,
                HasSubstr("backend lies-after-" + std::string(lie.after) + ", " + lie.message))
        << lie.after;
  }
  // A new conversation is checked too: main's lie at step 0 stops main, not c.
  const LiesAfter from_the_start(MakeBackend("impl", weights, 1), "new");
  const Recording rec = Replay(sc, from_the_start);
  EXPECT_EQ(rec.steps[4].status, StepStatus::kError);
  EXPECT_THAT(rec.steps[4].message, HasSubstr("Length() is 1 after a new conversation"));
}

TEST(LengthCheck, AnHonestSessionPasses) {
  Scenario sc = ParseScenario(kScenario);
  auto weights = LoadModelFor(sc.model);
  PrepareScenario(sc, *weights);
  const LiesAfter honest(MakeBackend("impl", weights, 1), "never");
  EXPECT_EQ(Replay(sc, honest).FirstError(), std::nullopt);
}

}  // namespace
}  // namespace kvdiff::testing
