// The campaign's follow-ups (harness/campaign/follow_up.h): every case's own steps stay what they
// were without them; the default campaign's 200 cases draw each call the follow-ups are there for
// (a fork, a batch, a truncate or a one-token prompt right after a reset or a shift; forks,
// truncates and batch items past 256 positions; more than eight conversations alive and batched);
// and each stays within the sessions and call size the backends declare. Their power:
// follow_up_mutants_test.cc.
#include "harness/campaign/follow_up.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>
#include <map>
#include <string>

#include "harness/backend/registry.h"
#include "harness/campaign/case_generator.h"
#include "harness/run/model_for.h"
#include "harness/scenario/scenario.h"
#include "tests/harness/harness_test_util.h"

namespace kvdiff::testing {
namespace {

using harness::Op;

constexpr int64_t kCases = 200;  // what the README's `ci/demo` runs

harness::GenerationOptions DefaultOptions(const harness::Backend& impl) {
  harness::GenerationOptions options;
  options.boundaries = harness::CampaignBoundaries({&impl}, 512);
  options.shifts = true;  // impl and ref (check's default backends) both shift
  return options;
}

// What the follow-ups are there to draw, counted over a campaign's cases.
std::map<std::string, int64_t> Draws(const harness::ModelSpec& model,
                                     const harness::GenerationOptions& options) {
  std::map<std::string, int64_t> out;
  const format::LlamaConfig config = format::PresetConfig("tiny");
  for (int64_t k = 0; k < kCases; ++k) {
    const harness::Scenario sc = harness::GenerateCase(config, model, 0, k, options);
    harness::Conversations convs;
    const harness::Step* last = nullptr;
    for (const harness::Step& s : sc.steps) {
      // "reset>fork" and so on: a call on the conversation a reset or shift just acted on.
      if (last && (last->op == Op::kReset || last->op == Op::kShift)) {
        const std::string lead = last->op == Op::kReset ? "reset>" : "shift>";
        const std::string& c = last->conversation;
        if (s.op == Op::kFork && s.from == c) ++out[lead + "fork"];
        if (s.op == Op::kTruncate && s.conversation == c) ++out[lead + "truncate"];
        if (s.op == Op::kPrefill && s.conversation == c && s.tokens.size() == 1)
          ++out[lead + "one token"];
        if (s.op == Op::kBatch &&
            std::any_of(s.items.begin(), s.items.end(),
                        [&](const harness::BatchEntry& i) { return i.conversation == c; }))
          ++out[lead + "batch"];
      }
      auto far = [&](const std::string& c) { return convs.At(c).length > 300; };
      if (s.op == Op::kFork && far(s.from)) ++out["fork past 300"];
      if (s.op == Op::kTruncate && far(s.conversation) && s.length < 300)
        ++out["truncate from past 300 to below"];
      if (s.op == Op::kBatch)
        for (const harness::BatchEntry& i : s.items)
          if (far(i.conversation)) ++out["batch item past 300"];
      if (s.op == Op::kBatch && s.items.size() > 8) ++out["batch of more than 8"];
      convs.Apply(s);
      const auto alive = static_cast<int64_t>(convs.Names().size());
      out["most alive"] = std::max(out["most alive"], alive);
      out["most call tokens"] = std::max(out["most call tokens"], [&] {
        int64_t n = 0;
        for (const harness::BatchEntry& i : s.items) n += i.Size();
        if (s.op == Op::kPrefill)
          n = s.chunks.empty() ? static_cast<int64_t>(s.tokens.size())
                               : *std::max_element(s.chunks.begin(), s.chunks.end());
        return n;
      }());
      last = &s;
    }
  }
  return out;
}

class FollowUps : public ::testing::Test {
 protected:
  const harness::ModelSpec model_ = TinyModel();
  const std::shared_ptr<const format::ModelWeights> weights_ = harness::LoadModelFor(model_);
  const std::unique_ptr<harness::Backend> impl_ = harness::MakeBackend("impl", weights_, 1);
};

TEST_F(FollowUps, EveryCaseStartsWithTheStepsItDrewWithoutThem) {
  const format::LlamaConfig config = format::PresetConfig("tiny");
  harness::GenerationOptions with = DefaultOptions(*impl_), without = with;
  without.follow_ups = false;
  int64_t longer = 0;
  for (int64_t k = 0; k < kCases; ++k) {
    const harness::Scenario a = harness::GenerateCase(config, model_, 0, k, without);
    const harness::Scenario b = harness::GenerateCase(config, model_, 0, k, with);
    ASSERT_GE(b.steps.size(), a.steps.size()) << "case " << k;
    harness::Scenario prefix = b;
    prefix.steps.resize(a.steps.size());
    ASSERT_EQ(prefix.ToJson(), a.ToJson()) << "case " << k;
    longer += b.steps.size() > a.steps.size();
    harness::ValidateScenario(b, config);  // throws on an invalid step
  }
  EXPECT_GT(longer, kCases / 2);  // most cases have follow-ups
}

TEST_F(FollowUps, TheDefaultCampaignDrawsEachCallTheyAreThereFor) {
  const std::map<std::string, int64_t> draws = Draws(model_, DefaultOptions(*impl_));
  std::string all;
  for (const auto& [what, n] : draws) all += fmt::format("{} {}; ", what, n);
  std::cout << "figure: seed 0, 200 cases: " << all << "\n";
  for (const char* what :
       {"reset>fork", "reset>batch", "reset>one token", "shift>fork", "shift>batch",
        "shift>truncate", "fork past 300", "truncate from past 300 to below", "batch item past 300",
        "batch of more than 8"}) {
    EXPECT_GE(draws.count(what) ? draws.at(what) : 0, 3) << what << "\n" << all;
  }
  EXPECT_GE(draws.at("most alive"), 12) << all;
}

TEST_F(FollowUps, TheyKeepToTheSessionsAndTheCallSizeTheBackendsDeclare) {
  harness::GenerationOptions options = DefaultOptions(*impl_);
  options.max_sessions = 4;
  options.max_call_tokens = 16;
  const std::map<std::string, int64_t> draws = Draws(model_, options);
  EXPECT_EQ(draws.at("most alive"), 4);
  EXPECT_LE(draws.at("most call tokens"), 16);
  EXPECT_EQ(draws.count("batch of more than 8"), 0u);
  EXPECT_GT(draws.at("reset>fork"), 0);  // a fork still, freed at once when sessions are scarce
}

}  // namespace
}  // namespace kvdiff::testing
