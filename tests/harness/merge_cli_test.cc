// `kvdiff check --jobs`, shards chosen by CI fleets' environments and `kvdiff merge`, through the
// binary: the pieces of a campaign, however run, put back together give the unsharded report.
// The campaign fails some cases (impl against its own ForwardFull at a tolerance below float
// rounding), so failures are compared too, not only passes. Not shrunk (--shrink 0): each shard
// shrinks its own first failures, so a merge holds more shrunk cases than the whole run.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/harness/harness_test_util.h"
#include "tests/test_support.h"

namespace kvdiff::testing {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

constexpr const char* kCampaign =
    "check --cases 23 --seed 5 --backends impl --tolerance 1e-5 --out-dir fails --shrink 0";

using Env = std::vector<std::pair<std::string, std::string>>;

json ReadJson(const std::filesystem::path& p) { return json::parse(ReadFile(p)); }

json WithoutTimes(json j) {
  j.erase("seconds");
  return j;
}

// The unsharded campaign's report, on one job.
json Whole(const TempDir& dir) {
  const auto r = RunKvdiff(std::string(kCampaign) + " --jobs 1 --json whole.json", dir.path());
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  std::filesystem::copy_file(dir / "stdout.txt", dir / "whole-stdout.txt");
  json j = ReadJson(dir / "whole.json");
  EXPECT_GT(j.at("failures").get<int>(), 0) << "the campaign must fail some cases";
  EXPECT_LT(j.at("failures").get<int>(), 23) << "and pass others";
  return j;
}

TEST(CheckJobs, AnyNumberOfJobsGivesTheSameReport) {
  TempDir dir;
  const json whole = Whole(dir);
  const std::string whole_out = ReadFile(dir / "stdout.txt");
  for (const char* jobs : {"2", "3", "0"}) {
    const auto r =
        RunKvdiff(std::string(kCampaign) + " --jobs " + jobs + " --json j.json " + "--junit j.xml",
                  dir.path());
    EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
    EXPECT_EQ(WithoutTimes(ReadJson(dir / "j.json")), WithoutTimes(whole)) << jobs << " jobs";
    // The terminal report too, but for its time.
    const auto cut = [](const std::string& s) { return s.substr(0, s.rfind(';')); };
    EXPECT_EQ(cut(r.out), cut(whole_out)) << jobs << " jobs";
  }
}

// The coverage block of a campaign's terminal summary: its "coverage:" line and the indented
// lines under it.
std::string CoverageBlock(const std::string& out) {
  const size_t begin = out.find("\ncoverage: ");
  EXPECT_NE(begin, std::string::npos) << out;
  if (begin == std::string::npos) return "";
  size_t end = out.find('\n', begin + 1);
  while (end != std::string::npos && out.compare(end + 1, 2, "  ") == 0)
    end = out.find('\n', end + 1);
  return out.substr(begin + 1, end == std::string::npos ? std::string::npos : end - begin - 1);
}

// Runs the campaign as shards, shard i with the environment variables env[i], and merges them.
json MergeOfShards(const TempDir& dir, const std::vector<Env>& env, const std::string& extra = "") {
  std::string files;
  for (size_t i = 0; i < env.size(); ++i) {
    const std::string file = "shard" + std::to_string(i) + ".json";
    const auto r =
        RunKvdiff(std::string(kCampaign) + " --jobs 2 --json " + file + extra, dir.path(), env[i]);
    EXPECT_LE(r.exit_code, 1) << r.out << r.err;
    files += " " + file;
  }
  const auto m = RunKvdiff("merge" + files + " --json merged.json --junit merged.xml", dir.path());
  EXPECT_EQ(m.exit_code, 1) << "the campaign fails some cases: " << m.out << m.err;
  EXPECT_THAT(m.out, HasSubstr(std::to_string(env.size()) + " of " + std::to_string(env.size()) +
                               " shards present"));
  // The terminal summary's coverage block is the whole campaign's too, not only the JSON's.
  EXPECT_EQ(CoverageBlock(m.out), CoverageBlock(ReadFile(dir / "whole-stdout.txt")));
  return ReadJson(dir / "merged.json");
}

void ExpectMergeIsTheWhole(json merged, const json& whole) {
  EXPECT_EQ(merged.at("merge").at("missing"), json::array());
  EXPECT_EQ(merged.at("merge").at("missing_count"), 0);
  EXPECT_EQ(merged.at("merge").at("duplicated"), json::array());
  merged.erase("merge");
  EXPECT_EQ(WithoutTimes(merged), WithoutTimes(whole));
}

TEST(MergeShards, BazelShardsMergeIntoTheWholeCampaign) {
  TempDir dir;
  const json whole = Whole(dir);
  std::vector<Env> env;
  for (int i = 0; i < 3; ++i) {
    env.push_back({{"TEST_SHARD_INDEX", std::to_string(i)},
                   {"TEST_TOTAL_SHARDS", "3"},
                   {"TEST_SHARD_STATUS_FILE", (dir / ("status" + std::to_string(i))).string()}});
  }
  ExpectMergeIsTheWhole(MergeOfShards(dir, env), whole);
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(std::filesystem::exists(dir / ("status" + std::to_string(i))))
        << "the Bazel handshake file of shard " << i;
  }
  const json shard = ReadJson(dir / "shard1.json");
  EXPECT_EQ(shard.at("shard"), json({{"index", 2}, {"count", 3}}));
  EXPECT_THAT(ReadFile(dir / "stdout.txt"), HasSubstr("FAIL case"));
}

TEST(MergeShards, GoogleTestShardsMergeIntoTheWholeCampaign) {
  TempDir dir;
  const json whole = Whole(dir);
  std::vector<Env> env;
  for (int i = 0; i < 4; ++i) {
    env.push_back({{"GTEST_SHARD_INDEX", std::to_string(i)}, {"GTEST_TOTAL_SHARDS", "4"}});
  }
  ExpectMergeIsTheWhole(MergeOfShards(dir, env), whole);
}

TEST(MergeShards, KubernetesIndexedJobShardsMergeIntoTheWholeCampaign) {
  TempDir dir;
  const json whole = Whole(dir);
  std::vector<Env> env;
  for (int i = 0; i < 2; ++i) {
    env.push_back({{"JOB_COMPLETION_INDEX", std::to_string(i)}, {"KVDIFF_SHARD_COUNT", "2"}});
  }
  ExpectMergeIsTheWhole(MergeOfShards(dir, env), whole);
  // The total by flag instead.
  env = {{{"JOB_COMPLETION_INDEX", "0"}}, {{"JOB_COMPLETION_INDEX", "1"}}};
  ExpectMergeIsTheWhole(MergeOfShards(dir, env, " --shard-count 2"), whole);
}

TEST(MergeShards, ExplicitShardFlagsMergeIntoTheWholeCampaignAndWinOverTheEnvironment) {
  TempDir dir;
  const json whole = Whole(dir);
  std::vector<std::string> files;
  const Env bazel = {{"TEST_SHARD_INDEX", "0"}, {"TEST_TOTAL_SHARDS", "2"}};
  for (int i = 1; i <= 5; ++i) {
    const std::string file = "s" + std::to_string(i) + ".json";
    RunKvdiff(std::string(kCampaign) + " --shard " + std::to_string(i) + "/5 --json " + file,
              dir.path(), bazel);
    files.push_back(file);
  }
  // Given out of order: the merge sorts cases, not files.
  const auto m =
      RunKvdiff("merge s3.json s1.json s5.json s2.json s4.json --json merged.json", dir.path());
  EXPECT_EQ(m.exit_code, 1) << m.out << m.err;
  ExpectMergeIsTheWhole(ReadJson(dir / "merged.json"), whole);
}

TEST(MergeShards, AMissingShardFailsEvenWhenEveryCasePresentPassed) {
  TempDir dir;
  // A passing campaign: the default tolerance.
  for (int i : {1, 3}) {
    const auto r = RunKvdiff("check --cases 12 --backends impl --shard " + std::to_string(i) +
                                 "/3 --json s" + std::to_string(i) + ".json",
                             dir.path());
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  }
  const auto m =
      RunKvdiff("merge s1.json s3.json --json merged.json --junit merged.xml", dir.path());
  EXPECT_EQ(m.exit_code, 1) << m.out << m.err;
  EXPECT_THAT(m.out, HasSubstr("FAIL shard 2/3: missing (no report): its 4 cases did not run"));
  EXPECT_THAT(m.out, HasSubstr("FAIL: 2 reports merged, 2 of 3 shards present (1 missing"));
  const json merged = ReadJson(dir / "merged.json");
  EXPECT_EQ(merged.at("passed"), false);
  EXPECT_EQ(merged.at("merge").at("missing"), json::array({2}));
  EXPECT_EQ(merged.at("merge").at("missing_count"), 1);
  const std::string xml = ReadFile(dir / "merged.xml");
  EXPECT_EQ(XmlProblem(xml, nullptr), "");
  EXPECT_THAT(xml, HasSubstr("type=\"missing_shard\""));
  EXPECT_THAT(xml, HasSubstr("tests=\"9\" failures=\"1\""));
}

// check takes any shard count, past the cases too: merge lists the first missing shards and counts
// the rest, so its work (it listed all 10^15 and ran out of memory) and its report stay bounded.
TEST(MergeShards, MissingShardsOfAHugeCountAreCountedAndTheFirstListed) {
  TempDir dir;
  const std::string count = "1000000000000000";
  for (const std::string i : {"2", "150"}) {
    ASSERT_EQ(RunKvdiff("check --cases 4 --backends impl --shard " + i + "/" + count + " --json s" +
                            i + ".json",
                        dir.path())
                  .exit_code,
              0);
  }
  const auto m =
      RunKvdiff("merge s2.json s150.json --json merged.json --junit merged.xml", dir.path());
  EXPECT_EQ(m.exit_code, 1) << m.out << m.err;
  EXPECT_THAT(m.out, HasSubstr("FAIL shard 101/" + count + ": missing (no report): its 0 cases"));
  EXPECT_THAT(m.out, HasSubstr("FAIL 999999999999898 more shards missing after shard 101/" + count +
                               " (listed: the first 100)"));
  EXPECT_THAT(m.out, HasSubstr("FAIL: 2 reports merged, 2 of " + count +
                               " shards present (999999999999998 missing, 0 duplicated)"));
  const json merge = ReadJson(dir / "merged.json").at("merge");
  ASSERT_EQ(merge.at("missing").size(), 100u);
  EXPECT_EQ(merge.at("missing")[0], 1);
  EXPECT_EQ(merge.at("missing")[1], 3);  // shard 2 is present
  EXPECT_EQ(merge.at("missing")[99], 101);
  EXPECT_EQ(merge.at("missing_count"), 999999999999998);
  const std::string xml = ReadFile(dir / "merged.xml");
  EXPECT_EQ(XmlProblem(xml, nullptr), "");
  EXPECT_THAT(xml, HasSubstr("999999999999898 more shards after 101/" + count));
}

TEST(MergeShards, ADuplicatedShardFails) {
  TempDir dir;
  ASSERT_EQ(
      RunKvdiff("check --cases 6 --backends impl --shard 1/2 --json a.json", dir.path()).exit_code,
      0);
  ASSERT_EQ(
      RunKvdiff("check --cases 6 --backends impl --shard 2/2 --json b.json", dir.path()).exit_code,
      0);
  const auto m = RunKvdiff("merge a.json b.json a.json", dir.path());
  EXPECT_EQ(m.exit_code, 1) << m.out << m.err;
  EXPECT_THAT(m.out, HasSubstr("FAIL shard 1/2: given by more than one report"));
  EXPECT_EQ(RunKvdiff("merge a.json b.json", dir.path()).exit_code, 0);
}

TEST(MergeShards, ReportsOfDifferentCampaignsOrNotReportsAreBadInput) {
  TempDir dir;
  ASSERT_EQ(
      RunKvdiff("check --cases 6 --backends impl --shard 1/2 --json a.json", dir.path()).exit_code,
      0);
  ASSERT_EQ(
      RunKvdiff("check --cases 6 --seed 1 --backends impl --shard 2/2 --json b.json", dir.path())
          .exit_code,
      0);
  auto m = RunKvdiff("merge a.json b.json", dir.path());
  EXPECT_EQ(m.exit_code, 2);
  EXPECT_THAT(m.err, HasSubstr("b.json: \"seed\" is 1 but a.json has 0"));
  WriteFile(dir / "bad.json", "{\"command\": \"run\"}");
  m = RunKvdiff("merge a.json bad.json", dir.path());
  EXPECT_EQ(m.exit_code, 2);
  EXPECT_THAT(m.err, HasSubstr("bad.json: not a `kvdiff check --json` report"));
  WriteFile(dir / "cut.json", "{\"command\": \"ch");
  m = RunKvdiff("merge cut.json", dir.path());
  EXPECT_EQ(m.exit_code, 2);
  EXPECT_THAT(m.err, HasSubstr("cut.json: invalid JSON"));
  m = RunKvdiff("merge nothere.json", dir.path());
  EXPECT_EQ(m.exit_code, 2);
  EXPECT_THAT(m.err, HasSubstr("cannot open report nothere.json"));
}

// Shards drawn with other options are another campaign, whatever their seed and case count; a
// shard whose own verdict disagrees with its cases was edited. Both are refused naming the field
// and both values, never merged into a verdict.
TEST(MergeShards, ShardsOfOtherOptionsOrThatContradictThemselvesAreBadInput) {
  TempDir dir;
  const std::string campaign = "check --cases 6 --backends impl --demanding-fraction 0 ";
  ASSERT_EQ(RunKvdiff(campaign + "--shard 1/2 --json a.json", dir.path()).exit_code, 0);
  const std::pair<const char*, const char*> others[] = {
      {"--long-fraction 0.5",
       "\"generation\" is "
       "{\"batch_percent\":20,\"deep_fraction\":0.3,\"follow_ups\":true,\"long_fraction\":0.5"},
      {"--max-length 40",
       "\"generation\" is "
       "{\"batch_percent\":20,\"deep_fraction\":0.3,\"follow_ups\":true,\"long_fraction\":0.1,"
       "\"max_length\":40,"
       "\"shift_percent\":25}"},
      {"--batch-percent 0", "\"generation\" is {\"batch_percent\":0,"},
      {"--deep-fraction 0", "\"generation\" is {\"batch_percent\":20,\"deep_fraction\":0"},
      {"--shift-percent 0", "\"shift_percent\":0} but a.json has"},
      {"--tolerance 1e-3", "\"tolerance\" is {\"abs\":0.001} but a.json has {\"abs\":0.0001}"},
  };
  for (const auto& [option, message] : others) {
    ASSERT_EQ(RunKvdiff(campaign + "--shard 2/2 --json b.json " + option, dir.path()).exit_code, 0);
    const auto m = RunKvdiff("merge a.json b.json", dir.path());
    EXPECT_EQ(m.exit_code, 2) << option << ": " << m.out;
    EXPECT_THAT(m.err, HasSubstr(message)) << option;
    EXPECT_THAT(m.err, HasSubstr("b.json: ")) << option;
  }
  ASSERT_EQ(RunKvdiff(campaign + "--shard 2/2 --json b.json", dir.path()).exit_code, 0);
  ASSERT_EQ(RunKvdiff("merge a.json b.json", dir.path()).exit_code, 0);
  const std::string good = ReadFile(dir / "b.json");
  const std::pair<std::pair<const char*, const char*>, const char*> edits[] = {
      {{"\"passed\": true", "\"passed\": false"},
       "b.json: \"passed\" is false but its results say true (0 of 3 cases failed)"},
      {{"\"failures\": 0", "\"failures\": 3"}, "b.json: \"failures\" is 3 but 0 of its 3 results"},
  };
  for (const auto& [edit, message] : edits) {
    std::string text = good;
    text.replace(text.find(edit.first), std::string(edit.first).size(), edit.second);
    WriteFile(dir / "b.json", text);
    const auto m = RunKvdiff("merge a.json b.json", dir.path());
    EXPECT_EQ(m.exit_code, 2) << edit.second << ": " << m.out;
    EXPECT_THAT(m.err, HasSubstr(message));
  }
}

TEST(CheckShardEnvironment, AMalformedVariableIsBadInputNamingIt) {
  TempDir dir;
  const auto r = RunKvdiff("check --cases 4 --backends impl", dir.path(),
                           {{"GTEST_SHARD_INDEX", "one"}, {"GTEST_TOTAL_SHARDS", "2"}});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("GTEST_SHARD_INDEX: expected a whole number >= 0, got \"one\""));
}

}  // namespace
}  // namespace kvdiff::testing
