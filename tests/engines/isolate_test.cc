// --isolate: an engine plugin in a child process. A plugin that dies (SIGSEGV) or hangs fails the
// case it happened in, naming the signal or the time-out, and the campaign goes on to the end and
// reports; a plugin that hung is not called again, so its time-out is paid once a job, not once a
// call. Without a fault it reports exactly what the in-process plugin reports.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>

#include "tests/harness/harness_test_util.h"
#include "tests/test_support.h"

namespace kvdiff::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string Broken(const std::string& bug) {
  return fmt::format("'impl,plugin:{}?bug={}'", KVDIFF_BROKEN_ENGINE, bug);
}

// The closing line without its timing ("...; 1.23 s").
std::string Summary(const std::string& out) {
  const size_t at =
      out.rfind("\nPASS: ") != std::string::npos ? out.rfind("\nPASS: ") : out.rfind("\nFAIL: ");
  if (at == std::string::npos) return "";
  std::string line = out.substr(at + 1, out.find('\n', at + 1) - at - 1);
  return std::regex_replace(line, std::regex("; [0-9.]+ s$"), "");
}

TEST(Isolate, ACrashingPluginFailsItsCasesNamingTheSignalAndTheCampaignReports) {
  TempDir dir;
  const CommandResult r = RunKvdiff(
      "check --cases 20 --shrink 0 --isolate --json report.json --backends " + Broken("crash"),
      dir.path());
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  // SIGSEGV (11); under AddressSanitizer its handler turns the crash into SIGABRT (6).
  EXPECT_THAT(r.out, HasSubstr("the isolated engine process was killed by signal "));
  EXPECT_THAT(r.out, HasSubstr("during append of"));
  EXPECT_THAT(Summary(r.out), HasSubstr("FAIL: 20 of 20 cases run"));
  // The bug strikes past 24 positions only: the cases that stay shorter pass, on fresh processes.
  const auto json = nlohmann::json::parse(ReadFile(dir.path() / "report.json"));
  int failed = 0;
  for (const auto& c : json["results"]) failed += c["passed"] == false;
  EXPECT_GT(failed, 0);
  EXPECT_LT(failed, 20);
  EXPECT_TRUE(std::filesystem::is_directory(dir.path() / "kvdiff-failures"));
}

int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// One job: the plugin hangs once (past 24 positions), is killed after 1 s, and no later case of
// the campaign runs on it, the demanding part's included (whose backends are built anew), instead
// of starting a process that would hang again. Without that each of the 10 cases waited, then
// (an engine called no more once it hung) each part once.
TEST(Isolate, AHangingPluginIsKilledAfterTheTimeoutAndNotCalledAgain) {
  TempDir dir;
  const CommandResult r = RunKvdiff(
      "check --cases 10 --jobs 1 --isolate --isolate-timeout 1 --json report.json --backends " +
          Broken("hang"),
      dir.path());
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_THAT(Summary(r.out), HasSubstr("FAIL: 10 of 10 cases run (shard 1/1, seed 0), 10 failed "
                                        "(9 not run: a backend hung before them)"));
  const auto json = nlohmann::json::parse(ReadFile(dir.path() / "report.json"));
  int waited = 0, refused = 0, not_shrunk = 0, demanding = 0;
  for (const auto& c : json["results"]) {
    ASSERT_EQ(c["passed"], false) << c.dump();
    const std::string failure = c["failure"];
    waited += Count(failure, "example: the isolated engine process did not answer within 1 s");
    refused += Count(failure, "did not answer within its time-out in case ");
    EXPECT_EQ(c.value("not_run", false), failure.rfind("not run: backend", 0) == 0) << failure;
    demanding += c.contains("demanding") ? 1 : 0;
    // Shrinking would replay the hang for every candidate.
    if (c.contains("not_shrunk")) {
      EXPECT_THAT(c["not_shrunk"].get<std::string>(),
                  HasSubstr("not shrunk: a backend did not answer within its time-out"));
      ++not_shrunk;
    }
    EXPECT_FALSE(c.contains("shrunk")) << c.dump();
  }
  EXPECT_EQ(waited, 1) << r.out;  // one process hung: the first
  EXPECT_EQ(refused, 9) << r.out;
#ifdef KVDIFF_HAVE_TORCH  // the demanding part's cases are among them (it needs ref64: LibTorch)
  EXPECT_GT(demanding, 0) << r.out;
#endif
  EXPECT_EQ(not_shrunk, 3) << r.out;  // the first three failing cases (--shrink 3)
  // The merge reads them back as not run.
  const CommandResult merged = RunKvdiff("merge report.json", dir.path());
  EXPECT_EQ(merged.exit_code, 1) << merged.out << merged.err;
  EXPECT_THAT(merged.out, HasSubstr("10 failed (9 not run: a backend hung before them)"));
}

// --shapes random builds every case's backends anew: after the hang, the later cases do not start
// the engine (each new process would hang as long), and say in which case it hung. Without that
// 3 of these 6 cases waited for the time-out.
TEST(Isolate, ARandomShapeCampaignStartsAHungEngineNoMore) {
  TempDir dir;
  const CommandResult r = RunKvdiff(
      "check --shapes random --cases 6 --jobs 1 --isolate-timeout 1 --json report.json "
      "--backends " +
          Broken("hang"),
      dir.path());
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  const auto json = nlohmann::json::parse(ReadFile(dir.path() / "report.json"));
  int64_t hung_in = -1, waited = 0, not_started = 0;
  for (const auto& c : json["results"]) {
    if (c["passed"] == true) continue;
    const std::string failure = c["failure"];
    if (failure.find("the isolated engine process did not answer within 1 s") !=
        std::string::npos) {
      ++waited;
      hung_in = c["case"];
    } else if (failure.find("not run: backend plugin:") == 0) {
      EXPECT_THAT(failure, HasSubstr(fmt::format(
                               "did not answer within its time-out in case {} (--isolate-timeout), "
                               "and is not started again",
                               hung_in)));
      EXPECT_GT(c["case"].get<int64_t>(), hung_in);
      ++not_started;
    }
  }
  EXPECT_EQ(waited, 1) << r.out;
  EXPECT_GT(not_started, 0) << r.out;
}

TEST(Isolate, WithoutAFaultTheReportIsTheInProcessReport) {
  TempDir dir;
  const CommandResult in_process =
      RunKvdiff("check --cases 40 --backends " + Broken("none"), dir.path());
  const CommandResult isolated =
      RunKvdiff("check --cases 40 --isolate --backends " + Broken("none"), dir.path());
  EXPECT_EQ(in_process.exit_code, 0) << in_process.out << in_process.err;
  EXPECT_EQ(isolated.exit_code, 0) << isolated.out << isolated.err;
  EXPECT_THAT(Summary(isolated.out), HasSubstr("PASS: 40 of 40"));
  EXPECT_EQ(Summary(isolated.out), Summary(in_process.out));
}

TEST(Isolate, ThePluginsOwnErrorsComeBackAsTheyAre) {
  TempDir dir;
  const CommandResult r =
      RunKvdiff(fmt::format("check --cases 2 --isolate --backends 'impl,plugin:{}?bug=sometimes'",
                            KVDIFF_BROKEN_ENGINE),
                dir.path());
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;  // bad input, as without --isolate
  EXPECT_THAT(r.err, HasSubstr("option bug: expected truncate, fork, crash, hang, shift or none"));
}

}  // namespace
}  // namespace kvdiff::testing
