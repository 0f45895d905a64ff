// The reach of the campaign's generator, and the coverage report that shows it.
#include "harness/campaign/coverage.h"

#include <gtest/gtest.h>

#include <iostream>
#include <string>

#include "format/error.h"
#include "harness/backend/registry.h"
#include "harness/campaign/case_generator.h"
#include "harness/run/differential_run.h"
#include "tests/harness/harness_test_util.h"
#include "tests/harness/wrapped_backend.h"

namespace kvdiff::harness {
namespace {

format::LlamaConfig Tiny() { return format::PresetConfig("tiny"); }

ModelSpec TinySpec() {
  const ModelSpec m = testing::TinyModel();
  return m;
}

TEST(CaseGenerator, BoundariesArePowersOfTwoAndDeclaredSizes) {
  auto weights = LoadModelFor(TinySpec());
  const auto impl = MakeBackend("impl", weights, 1);
  const std::vector<Boundary> b = CampaignBoundaries({impl.get()}, 512);
  std::vector<int64_t> sizes;
  for (const Boundary& x : b) sizes.push_back(x.size);
  EXPECT_EQ(sizes, (std::vector<int64_t>{2, 4, 8, 16, 32, 64, 128, 256}));
  EXPECT_EQ(b[2].declared_by, "impl");  // 8: LinearRows
  EXPECT_EQ(b[6].declared_by, "impl");  // 128: the attention query tile
  EXPECT_EQ(b[0].declared_by, "");
  EXPECT_EQ(CampaignBoundaries({impl.get()}, 100).back().size, 64);
}

TEST(CaseGenerator, ShortCasesDoNotDependOnTheLongFraction) {
  const auto config = Tiny();
  GenerationOptions none, some;
  none.long_fraction = 0;
  some.long_fraction = 0.5;
  int64_t long_cases = 0;
  for (int64_t k = 0; k < 100; ++k) {
    if (IsLongCase(3, k, some.long_fraction, 512)) {
      ++long_cases;
      continue;
    }
    EXPECT_EQ(GenerateCase(config, TinySpec(), 3, k, none).ToJson(),
              GenerateCase(config, TinySpec(), 3, k, some).ToJson());
  }
  EXPECT_GT(long_cases, 30);
  EXPECT_LT(long_cases, 70);
  EXPECT_FALSE(IsLongCase(3, 0, 1.0, kShortCaseLength));  // no room to go long
  GenerationOptions bad;
  bad.long_fraction = 1.5;
  EXPECT_THROW(GenerateCase(config, TinySpec(), 0, 0, bad), InputError);
  EXPECT_THROW(CampaignMaxLength(config, -1), InputError);
  EXPECT_EQ(CampaignMaxLength(config, 100000), 512);
}

// The report says how far the histories may go when it is short of the model's context, and why;
// and what a backend's declared sessions and call size leave out.
TEST(CaseGenerator, TheReachLimitNamesWhatStopsTheHistoriesShortOfTheContext) {
  const auto weights = LoadModelFor(TinySpec());
  const auto impl = MakeBackend("impl", weights, 1);
  const std::vector<const Backend*> backends = {impl.get()};
  EXPECT_EQ(CampaignReachLimit(weights->config, 0, backends), "");
  EXPECT_EQ(CampaignReachLimit(weights->config, 512, backends), "");
  EXPECT_EQ(CampaignReachLimit(weights->config, 100, backends),
            "histories stop at 100 of the model's 512 positions: --max-length 100 "
            "(--max-length 0 reaches them all)");
  // An engine that declares one session and 16 tokens a call: what the campaign then never draws
  // is said beside the verdict, not left to the coverage counts.
  BackendInfo info;
  info.name = "one-session";
  info.dtype = "float32";
  info.max_sessions = 1;
  info.max_batch_tokens = 16;
  const testing::WrappedBackend limited(MakeBackend("impl", weights, 1), info);
  EXPECT_EQ(CampaignReachLimit(weights->config, 0, {impl.get(), &limited}),
            "at most 1 conversation alive at once of the 16 drawn otherwise: backend one-session "
            "holds 1 (max_sessions), so no fork, no second conversation and no batch of two; calls "
            "of at most 16 tokens: backend one-session takes 16 (max_batch_tokens)");
}

TEST(CaseGenerator, TheOtherCasesDoNotDependOnTheDeepFraction) {
  const auto config = Tiny();
  GenerationOptions none, some;
  none.deep_fraction = 0;
  some.deep_fraction = 0.5;
  int64_t deep = 0;
  for (int64_t k = 0; k < 100; ++k) {
    const int64_t start = DeepCaseStart(3, k, some.deep_fraction, some.long_fraction, 512);
    if (start == 0) {
      EXPECT_EQ(GenerateCase(config, TinySpec(), 3, k, none).ToJson(),
                GenerateCase(config, TinySpec(), 3, k, some).ToJson());
      continue;
    }
    ++deep;
    EXPECT_GT(start, kDeepPosition);
    EXPECT_FALSE(IsLongCase(3, k, some.long_fraction, 512));
    const Scenario sc = GenerateCase(config, TinySpec(), 3, k, some);
    ASSERT_EQ(sc.steps[0].op, Op::kPrefill);
    EXPECT_EQ(static_cast<int64_t>(sc.steps[0].tokens.size()), start);  // the deep prompt
    ValidateScenario(sc, config);
  }
  EXPECT_GT(deep, 25);
  EXPECT_LT(deep, 65);
  // No room for a deep start and a short case on top: no deep case.
  EXPECT_EQ(DeepCaseStart(3, 0, 1.0, 0, kDeepPosition + kShortCaseLength), 0);
  GenerationOptions bad;
  bad.deep_fraction = -0.1;
  EXPECT_THROW(GenerateCase(config, TinySpec(), 0, 0, bad), InputError);
}

// A backend that takes few tokens per call (BackendInfo::max_batch_tokens) gets no prefill chunk
// and no batch step larger: the campaign asks only what every backend can do.
TEST(CaseGenerator, CallsStayWithinTheTokensPerCallEveryBackendTakes) {
  GenerationOptions g;
  g.max_call_tokens = 5;
  int64_t batches = 0, chunks = 0;
  for (int64_t k = 0; k < 200; ++k) {
    const Scenario sc = GenerateCase(Tiny(), TinySpec(), 0, k, g);
    ValidateScenario(sc, Tiny());
    for (const Step& s : sc.steps) {
      if (s.op == Op::kPrefill) {
        const std::vector<int64_t> calls =
            s.chunks.empty() ? std::vector<int64_t>{static_cast<int64_t>(s.tokens.size())}
                             : s.chunks;
        for (int64_t c : calls) EXPECT_LE(c, 5) << "case " << k;
        chunks += static_cast<int64_t>(calls.size());
      }
      if (s.op == Op::kBatch) {
        int64_t total = 0;
        for (const BatchEntry& item : s.items) total += item.Size();
        EXPECT_LE(total, 5) << "case " << k;
        EXPECT_FALSE(s.items.empty());
        ++batches;
      }
    }
  }
  EXPECT_GT(batches, 100);
  EXPECT_GT(chunks, 1000);
}

// The deep cases are what puts forks, truncations and batch items on conversations past
// kDeepPosition: without them few are (the long cases' few steps), with the default fraction
// several times more, and the coverage report says how many. (Measured without the follow-ups,
// whose long-case tours add more: follow_up_test.)
TEST(Coverage, DeepCasesPutForksTruncationsAndBatchesOnLongConversations) {
  auto deep_share = [](double deep_fraction, const std::string& what) {
    GenerationOptions g;
    g.deep_fraction = deep_fraction;
    g.follow_ups = false;
    Coverage c = NewCoverage({}, 512);
    for (int64_t k = 0; k < 200; ++k)
      c.Add(GenerateCase(Tiny(), TinySpec(), 0, k, g), "tiny", IsLongCase(0, k, 0.1, 512));
    EXPECT_NE(c.Text().find("deep ops:      on conversations past 64 (256) positions: fork "),
              std::string::npos)
        << c.Text();
    return static_cast<double>(c.deep[what + " deep"]) / static_cast<double>(c.deep[what]);
  };
  for (const char* what : {"fork", "truncate", "batch item"}) {
    const double without = deep_share(0, what), with = deep_share(kDefaultDeepFraction, what);
    std::cout << "figure: " << what << "s on conversations past " << kDeepPosition
              << " positions: " << without << " without deep cases, " << with << " with\n";
    EXPECT_GT(with, 3 * without) << what;
    EXPECT_GT(with, 0.12) << what;
  }
}

// The shift line: what kinds of shift the cases drew, added up across shards and through JSON.
TEST(Coverage, CountsTheKindsOfShiftDrawn) {
  Scenario sc;
  sc.steps = {Step::Prefill("main", Tokens(12, 3)),
              Step::Shift("main", 0, 2),
              Step::Shift("main", 1, 3),
              Step::Decode("main", 2),
              Step::Fork("main", "b"),
              Step::Shift("b", 4, 5),
              Step::Truncate("b", 4),
              Step::Shift("main", 2, 0)};
  ValidateScenario(sc, Tiny());
  Coverage c = NewCoverage({}, 512);
  c.Add(sc, "tiny", false);
  EXPECT_EQ(c.shifts["steps"], 4);
  EXPECT_EQ(c.shifts["keep 0"], 1);
  EXPECT_EQ(c.shifts["keep 1"], 1);
  EXPECT_EQ(c.shifts["discard 0"], 1);
  EXPECT_EQ(c.shifts["nothing after keep"], 1);  // b: 4 + 5 of its 9
  EXPECT_EQ(c.shifts["twice before a call"], 1);
  EXPECT_EQ(c.shifts["of a fork"], 1);
  EXPECT_EQ(c.shifts["then decode"], 1);
  EXPECT_EQ(c.shifts["then truncate to keep"], 1);
  EXPECT_NE(c.Text().find("  shifts:        4 steps; keep 0 1, keep 1 1; discard 0 1; nothing "
                          "after keep 1; twice before a call 1; of a fork 1; then decode 1, then "
                          "truncate to keep 1\n"),
            std::string::npos)
      << c.Text();
  Coverage merged = Coverage::FromJson(c.ToJson(), "coverage");
  merged.Merge(c);
  EXPECT_EQ(merged.shifts["steps"], 8);
  EXPECT_EQ(merged.shifts["nothing after keep"], 2);
}

TEST(Coverage, CountsCallsRowsAndBoundariesOfAScenario) {
  Scenario sc;
  sc.steps = {Step::Prefill("main", Tokens(10, 1), {3, 7}), Step::Decode("main", 2),
              Step::Fork("main", "b"), Step::Truncate("b", 4), Step::Decode("b", 1)};
  Coverage c = NewCoverage({{8, "impl"}, {16, ""}}, 512);
  c.Add(sc, "shape", false);
  EXPECT_EQ(c.cases, 1);
  EXPECT_EQ(c.longest, 12);
  EXPECT_EQ(c.ops.at("decode"), 2);
  EXPECT_EQ(c.bigrams.at("fork>truncate"), 1);
  EXPECT_EQ(c.conversations.at(2), 1);
  EXPECT_EQ(c.call_sizes.at(1), 3);  // three decode rows
  EXPECT_EQ(c.call_sizes.at(2), 1);  // the chunk of 3
  EXPECT_EQ(c.call_sizes.at(4), 1);  // the chunk of 7
  // 8: the chunk of 7 is "at"; no call is longer; rows at position 7 (the chunk 3..9) and at 8 or
  // beyond: 8, 9 of that chunk and the decodes at 10, 11.
  EXPECT_EQ(c.boundaries[0].calls_at, 1);
  EXPECT_EQ(c.boundaries[0].calls_over, 0);
  EXPECT_EQ(c.boundaries[0].rows_at, 1);
  EXPECT_EQ(c.boundaries[0].rows_over, 4);
  // Only the declared boundary warns, and only for the side it missed (calls).
  ASSERT_EQ(c.Warnings().size(), 1u);
  EXPECT_NE(c.Warnings()[0].find("boundary 8 (declared by impl) not crossed by a forward call"),
            std::string::npos);
  // Counts add up: merging two shards' coverage is the coverage of both.
  Coverage twice = c;
  twice.Merge(c);
  EXPECT_EQ(twice.cases, 2);
  EXPECT_EQ(twice.boundaries[0].rows_over, 8);
  EXPECT_EQ(twice.ops.at("decode"), 4);
  EXPECT_EQ(twice.longest, 12);
  EXPECT_EQ(twice.ToJson()["boundaries"][0]["rows_over"], 8);
}

TEST(Coverage, TheDefaultGeneratorReachesTheContextAndCrossesImplsBoundaries) {
  auto weights = LoadModelFor(TinySpec());
  const auto impl = MakeBackend("impl", weights, 1);
  GenerationOptions g;
  const int64_t context = CampaignMaxLength(weights->config, g.max_length);
  g.boundaries = CampaignBoundaries({impl.get()}, context);
  Coverage c = NewCoverage(g.boundaries, context);
  for (int64_t k = 0; k < 200; ++k) {
    const Scenario sc = GenerateCase(weights->config, TinySpec(), 0, k, g);
    ValidateScenario(sc, weights->config);
    c.Add(sc, "tiny", IsLongCase(0, k, g.long_fraction, context));
  }
  EXPECT_GT(c.cases_at_context, 0) << c.Text();
  EXPECT_TRUE(c.Warnings().empty()) << c.Text();
  EXPECT_GT(c.boundaries[6].calls_over, 0) << "a chunk of more than 128 tokens";
}

}  // namespace
}  // namespace kvdiff::harness
