// Shard selection from --shard and from the environments of CI fleets, and the job runner that
// runs a campaign's cases on several threads with a sequential loop's result.
#include "harness/campaign/shards.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "format/error.h"
#include "harness/campaign/case_order.h"
#include "harness/campaign/jobs.h"
#include "harness/campaign/merge.h"

namespace kvdiff::harness {
namespace {

using ::testing::HasSubstr;

EnvLookup Env(std::map<std::string, std::string> vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    const auto it = vars.find(name);
    if (it == vars.end() || it->second.empty()) return std::nullopt;
    return it->second;
  };
}

std::string ErrorOf(const std::optional<std::string>& flag, std::optional<int64_t> count,
                    std::map<std::string, std::string> vars) {
  try {
    SelectShard(flag, count, Env(std::move(vars)));
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(SelectShard, NothingSetIsTheWholeCampaign) {
  const ShardSelection s = SelectShard(std::nullopt, std::nullopt, Env({}));
  EXPECT_EQ(s.shard.index, 1);
  EXPECT_EQ(s.shard.count, 1);
  EXPECT_EQ(s.source, "");
}

TEST(SelectShard, BazelIsZeroBasedAndNamesItsStatusFile) {
  const ShardSelection s = SelectShard(std::nullopt, std::nullopt,
                                       Env({{"TEST_SHARD_INDEX", "2"},
                                            {"TEST_TOTAL_SHARDS", "5"},
                                            {"TEST_SHARD_STATUS_FILE", "/tmp/status"}}));
  EXPECT_EQ(s.shard.index, 3);
  EXPECT_EQ(s.shard.count, 5);
  EXPECT_EQ(s.source, "TEST_SHARD_INDEX/TEST_TOTAL_SHARDS");
  EXPECT_EQ(s.status_file, "/tmp/status");
}

TEST(SelectShard, GoogleTestVariables) {
  const ShardSelection s = SelectShard(
      std::nullopt, std::nullopt, Env({{"GTEST_SHARD_INDEX", "0"}, {"GTEST_TOTAL_SHARDS", "2"}}));
  EXPECT_EQ(s.shard.index, 1);
  EXPECT_EQ(s.shard.count, 2);
  EXPECT_EQ(s.status_file, "") << "the status file is Bazel's handshake";
}

TEST(SelectShard, BazelWinsOverGoogleTestAndKubernetes) {
  const ShardSelection s = SelectShard(std::nullopt, 9,
                                       Env({{"TEST_SHARD_INDEX", "1"},
                                            {"TEST_TOTAL_SHARDS", "4"},
                                            {"GTEST_SHARD_INDEX", "0"},
                                            {"GTEST_TOTAL_SHARDS", "3"},
                                            {"JOB_COMPLETION_INDEX", "7"}}));
  EXPECT_EQ(s.shard.index, 2);
  EXPECT_EQ(s.shard.count, 4);
}

TEST(SelectShard, KubernetesIndexWithTheTotalFromTheFlagOrTheEnvironment) {
  ShardSelection s = SelectShard(std::nullopt, 8, Env({{"JOB_COMPLETION_INDEX", "7"}}));
  EXPECT_EQ(s.shard.index, 8);
  EXPECT_EQ(s.shard.count, 8);
  EXPECT_EQ(s.source, "JOB_COMPLETION_INDEX/--shard-count");
  s = SelectShard(std::nullopt, std::nullopt,
                  Env({{"JOB_COMPLETION_INDEX", "0"}, {"KVDIFF_SHARD_COUNT", "3"}}));
  EXPECT_EQ(s.shard.index, 1);
  EXPECT_EQ(s.shard.count, 3);
  s = SelectShard(std::nullopt, 2,
                  Env({{"JOB_COMPLETION_INDEX", "1"}, {"KVDIFF_SHARD_COUNT", "3"}}));
  EXPECT_EQ(s.shard.count, 2) << "the flag wins over the variable";
}

TEST(SelectShard, TheFlagWinsOverEveryEnvironment) {
  const ShardSelection s = SelectShard(std::string("3/7"), std::nullopt,
                                       Env({{"TEST_SHARD_INDEX", "0"},
                                            {"TEST_TOTAL_SHARDS", "2"},
                                            {"TEST_SHARD_STATUS_FILE", "/tmp/status"},
                                            {"JOB_COMPLETION_INDEX", "1"}}));
  EXPECT_EQ(s.shard.index, 3);
  EXPECT_EQ(s.shard.count, 7);
  EXPECT_EQ(s.source, "--shard");
  EXPECT_EQ(s.status_file, "") << "Bazel's shards were not honoured, so no handshake";
}

TEST(SelectShard, MalformedValuesNameTheVariable) {
  EXPECT_THAT(
      ErrorOf(std::nullopt, std::nullopt, {{"TEST_SHARD_INDEX", "x"}, {"TEST_TOTAL_SHARDS", "4"}}),
      HasSubstr("TEST_SHARD_INDEX: expected a whole number >= 0, got \"x\""));
  EXPECT_THAT(
      ErrorOf(std::nullopt, std::nullopt, {{"TEST_SHARD_INDEX", "4"}, {"TEST_TOTAL_SHARDS", "4"}}),
      HasSubstr("TEST_SHARD_INDEX: expected an index below 4"));
  EXPECT_THAT(ErrorOf(std::nullopt, std::nullopt,
                      {{"GTEST_SHARD_INDEX", "0"}, {"GTEST_TOTAL_SHARDS", "0"}}),
              HasSubstr("GTEST_TOTAL_SHARDS: expected a whole number >= 1, got 0"));
  EXPECT_THAT(ErrorOf(std::nullopt, std::nullopt,
                      {{"GTEST_SHARD_INDEX", "-1"}, {"GTEST_TOTAL_SHARDS", "2"}}),
              HasSubstr("GTEST_SHARD_INDEX: expected a whole number >= 0, got \"-1\""));
  EXPECT_THAT(ErrorOf(std::nullopt, std::nullopt, {{"TEST_TOTAL_SHARDS", "4"}}),
              HasSubstr("TEST_TOTAL_SHARDS is set but TEST_SHARD_INDEX is not"));
  EXPECT_THAT(ErrorOf(std::nullopt, std::nullopt, {{"JOB_COMPLETION_INDEX", "2"}}),
              HasSubstr("pass --shard-count N or set KVDIFF_SHARD_COUNT"));
  EXPECT_THAT(ErrorOf(std::nullopt, std::nullopt,
                      {{"JOB_COMPLETION_INDEX", "2"}, {"KVDIFF_SHARD_COUNT", "2.5"}}),
              HasSubstr("KVDIFF_SHARD_COUNT: expected a whole number >= 1, got \"2.5\""));
  EXPECT_THAT(ErrorOf(std::nullopt, 2, {{"JOB_COMPLETION_INDEX", "2"}}),
              HasSubstr("JOB_COMPLETION_INDEX: expected an index below 2 (--shard-count)"));
  EXPECT_THAT(ErrorOf(std::string("5/4"), std::nullopt, {}), HasSubstr("--shard"));
  EXPECT_THAT(ErrorOf(std::nullopt, 0, {}), HasSubstr("--shard-count"));
}

TEST(RunJobs, EveryItemOnceInAnyJob) {
  for (int jobs : {1, 2, 5}) {
    std::vector<std::atomic<int>> runs(100);
    std::mutex mutex;
    std::vector<int64_t> after;
    RunJobs(
        100, jobs,
        [&](int job, int64_t i) {
          EXPECT_GE(job, 0);
          EXPECT_LT(job, jobs);
          runs[i]++;
        },
        [&](int64_t i) { after.push_back(i); });
    for (int i = 0; i < 100; ++i) EXPECT_EQ(runs[i].load(), 1) << "item " << i;
    EXPECT_EQ(after.size(), 100u);
  }
}

TEST(RunJobs, RethrowsTheErrorOfTheSmallestFailingItem) {
  for (int jobs : {1, 3}) {
    try {
      RunJobs(50, jobs, [](int, int64_t i) {
        if (i == 40) throw std::runtime_error("item 40");
        if (i == 17) {
          std::this_thread::sleep_for(std::chrono::milliseconds(20));  // fails last in time
          throw std::runtime_error("item 17");
        }
      });
      ADD_FAILURE() << "no exception";
    } catch (const std::runtime_error& e) {
      EXPECT_STREQ(e.what(), "item 17") << jobs << " jobs";
    }
  }
}

TEST(SharedWork, AnIdleJobTakesTheTasksABusyJobOffers) {
  // Two items: item 0 offers 4 tasks; item 1 returns at once, so its job goes idle and helps.
  // Task 0 holds on until some other task has started on another job (or 10 s pass), which
  // happens only if the idle job took one while task 0 ran.
  for (int round = 0; round < 20; ++round) {
    SharedWork shared;
    std::vector<std::atomic<int>> runs(4);
    std::vector<std::atomic<int>> ran_on(4);
    std::atomic<bool> helped{false};
    RunJobs(
        2, 2,
        [&](int job, int64_t item) {
          if (item == 1) return;
          shared.Run(job, 4, [&](int64_t t, int runner) {
            runs[t]++;
            ran_on[t] = runner;
            if (runner != job) helped = true;
            const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
            while (t == 0 && !helped && std::chrono::steady_clock::now() < until) {
              std::this_thread::sleep_for(std::chrono::milliseconds(1));
            }
          });
        },
        {}, &shared);
    for (int t = 0; t < 4; ++t) EXPECT_EQ(runs[t].load(), 1) << "task " << t;
    EXPECT_TRUE(helped.load()) << "round " << round << ": no task ran on the idle job";
  }
}

TEST(SharedWork, WithNoOneIdleTheOffererRunsEveryTaskInOrder) {
  SharedWork shared;
  std::vector<int64_t> order;
  RunJobs(
      1, 1,
      [&](int job, int64_t) {
        shared.Run(job, 5, [&](int64_t t, int runner) {
          EXPECT_EQ(runner, job);
          order.push_back(t);
        });
      },
      {}, &shared);
  EXPECT_EQ(order, (std::vector<int64_t>{0, 1, 2, 3, 4}));
}

TEST(SharedWork, RethrowsTheSmallestFailingTaskOnTheOfferingJob) {
  for (int jobs : {1, 2}) {
    SharedWork shared;
    try {
      RunJobs(
          jobs, jobs,
          [&](int job, int64_t item) {
            if (item != 0) return;
            shared.Run(job, 6, [](int64_t t, int) {
              if (t == 4) throw std::runtime_error("task 4");
              if (t == 2) {
                std::this_thread::sleep_for(std::chrono::milliseconds(20));
                throw std::runtime_error("task 2");
              }
            });
          },
          {}, &shared);
      ADD_FAILURE() << "no exception";
    } catch (const std::runtime_error& e) {
      EXPECT_STREQ(e.what(), "task 2") << jobs << " jobs";
    }
  }
}

TEST(CaseOrder, TheCostliestCasesAreClaimedFirstAndTiesKeepTheirOrder) {
  auto prefill_then_decode = [](int64_t prompt, int64_t decodes) {
    Scenario sc;
    sc.steps = {Step::Prefill("main", Tokens(static_cast<size_t>(prompt), 3)),
                Step::Decode("main", decodes)};
    return sc;
  };
  // One call of 10 tokens, then one call per decoded token.
  EXPECT_EQ(EstimatedCost(prefill_then_decode(10, 0)), kCallCostInTokens + 2 * 10);
  EXPECT_EQ(EstimatedCost(prefill_then_decode(10, 3)), 4 * kCallCostInTokens + 2 * 13);
  const std::vector<Scenario> scenarios = {prefill_then_decode(4, 1), prefill_then_decode(500, 0),
                                           prefill_then_decode(4, 1), prefill_then_decode(8, 40)};
  EXPECT_EQ(CostliestFirst(scenarios, {0, 1, 2, 3}), (std::vector<size_t>{1, 3, 0, 2}));
  EXPECT_EQ(CostliestFirst(scenarios, {2, 0}), (std::vector<size_t>{2, 0}));
}

TEST(ResolveJobs, ZeroIsEveryCoreAndNeverMoreThanTheItems) {
  EXPECT_GE(ResolveJobs(0, 1000), 1);
  EXPECT_EQ(ResolveJobs(8, 3), 3);
  EXPECT_EQ(ResolveJobs(2, 0), 1);
  EXPECT_EQ(ResolveJobs(1, 100), 1);
}

}  // namespace
}  // namespace kvdiff::harness
