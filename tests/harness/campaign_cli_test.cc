// The long campaigns: `kvdiff check --cases 200` on tiny, and --shard partitions 1000 cases.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>

#include "tests/harness/harness_test_util.h"
#include "tests/test_support.h"

namespace kvdiff::testing {
namespace {

using ::testing::HasSubstr;

TEST(CheckCampaign, TwoHundredCasesOnTinyPass) {
  TempDir dir;
  // Default backends: impl and, when built with LibTorch, ref.
  const auto r = RunKvdiff("check --cases 200 --threads 1 --json c.json", dir.path());
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("PASS: 200 of 200 cases run"));
  const auto j = nlohmann::json::parse(ReadFile(dir / "c.json"));
  EXPECT_EQ(j.at("failures"), 0);
  EXPECT_EQ(j.at("case_indices").size(), 200u);
  // The worst figure names its row and the gate it was held to there, which may be above the
  // plain tolerance (the rope-f32 allowance of a long position): never "worst X (tolerance Y)".
  const auto& worst = j.at("worst");
  EXPECT_LE(worst.at("diff").get<double>(), worst.at("gate").get<double>());
  EXPECT_TRUE(worst.at("within").get<bool>());
  EXPECT_EQ(worst.at("diff"), j.at("worst_diff"));
  const int64_t worst_case = j.at("worst_case");
  EXPECT_EQ(j.at("results").at(worst_case).at("worst"), worst);
  EXPECT_THAT(r.out,
              HasSubstr(fmt::format(
                  "worst difference: {:.1e} at {}, step {}, conversation "
                  "{}, position {}, within ",
                  worst.at("diff").get<double>(), worst.at("path").get<std::string>(),
                  worst.at("step").get<int64_t>(), worst.at("conversation").get<std::string>(),
                  worst.at("position").get<int64_t>())));
  EXPECT_THAT(r.out, HasSubstr(fmt::format("{:.1e}", worst.at("gate").get<double>())));
  EXPECT_THAT(r.out, ::testing::Not(HasSubstr("(tolerance 1.0e-04)")));
  // ref computes float32 RoPE angles: a row it shares with impl is held to the tolerance plus the
  // rope-f32 allowance of its position (here the worst row is one, at a long position).
  const int64_t position = worst.at("position");
  if (worst.at("path") == "impl~ref") {
    EXPECT_EQ(worst.at("gate_basis"),
              fmt::format("tolerance 1.0e-04 + rope-f32 allowance 2.0e-06 x {}", position));
    EXPECT_NEAR(worst.at("gate").get<double>(), 1e-4 + 2e-6 * static_cast<double>(position), 1e-12);
  } else {
    EXPECT_EQ(worst.at("gate_basis"), "tolerance");
    EXPECT_THAT(r.out, HasSubstr("within the tolerance 1.0e-04 in case"));
  }
}

TEST(CheckCampaign, ShardsAreDisjointAndCoverEveryCase) {
  TempDir dir;
  std::set<int64_t> seen;
  size_t total = 0;
  for (int i = 1; i <= 4; ++i) {
    const std::string json = "s" + std::to_string(i) + ".json";
    const auto r = RunKvdiff("check --cases 1000 --shard " + std::to_string(i) +
                                 "/4 --backends impl --threads 1 --json " + json,
                             dir.path());
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    const auto j = nlohmann::json::parse(ReadFile(dir / json));
    const auto indices = j.at("case_indices").get<std::vector<int64_t>>();
    EXPECT_EQ(indices.size(), 250u) << "shard " << i << "/4 runs exactly its quarter";
    for (int64_t k : indices) {
      EXPECT_EQ(k % 4, i - 1);
      EXPECT_TRUE(seen.insert(k).second) << "case " << k << " ran in two shards";
    }
    total += indices.size();
  }
  EXPECT_EQ(total, 1000u);
  EXPECT_EQ(seen.size(), 1000u);
  EXPECT_EQ(*seen.begin(), 0);
  EXPECT_EQ(*seen.rbegin(), 999);
}

TEST(CheckCampaign, AShardRunsTheSameCasesAsTheWholeCampaign) {
  TempDir dir;
  ASSERT_EQ(
      RunKvdiff("check --cases 40 --seed 9 --backends impl --threads 1 --json all.json", dir.path())
          .exit_code,
      0);
  ASSERT_EQ(RunKvdiff("check --cases 40 --seed 9 --shard 2/3 --backends impl --threads 1 "
                      "--json part.json",
                      dir.path())
                .exit_code,
            0);
  const auto all = nlohmann::json::parse(ReadFile(dir / "all.json")).at("results");
  const auto part = nlohmann::json::parse(ReadFile(dir / "part.json")).at("results");
  ASSERT_EQ(part.size(), 13u);  // k = 1, 4, ..., 37
  for (const auto& c : part) {
    const auto k = c.at("case").get<size_t>();
    EXPECT_EQ(c, all.at(k)) << "case " << k << " is a function of (seed, k) alone";
  }
}

}  // namespace
}  // namespace kvdiff::testing
