// Sliding-window models in the default campaign (issue 34), from the command line: on the
// tiny-swa preset (a window of 32 in a context of 512) `kvdiff check` draws cases that cross and
// wrap the window (its coverage says how many), draws no shift steps (and says so), and passes on
// impl,ref64; each test-only window fault of impl's ring (impl/batch_fault.h) is caught by the
// same campaign and shrunk to a replay file of a few steps, which fails again when replayed. A
// truncate the window makes impossible, and a backend that has no window, are refused (exit 2).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <iostream>
#include <string>

#include "tests/mutant_campaign_support.h"
#include "tests/test_support.h"

namespace kvdiff::testing {
namespace {

using ::testing::HasSubstr;

TEST(WindowMutants, EachWindowFaultOfImplIsCaughtByTheDefaultCampaignAndShrunk) {
  for (const char* fault :
       {"window-plus-one", "window-minus-one", "ring-sliced-by-logical-length"}) {
    ExpectCaughtAndShrunkTo("prefill", std::string("impl?fault=") + fault + ",ref64", 6, "",
                            "--preset tiny-swa");
  }
}

TEST(WindowMutants, ImplAndRef64PassTheTinySwaCampaignWhichCrossesTheWindow) {
  TempDir dir;
  const CommandResult r =
      RunKvdiff("check --preset tiny-swa --cases 200 --backends impl,ref64", dir.path());
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("PASS: 200 of 200 cases run"));
  const size_t at = r.out.find("  windows:       ");
  ASSERT_NE(at, std::string::npos) << r.out;
  const std::string line = r.out.substr(at, r.out.find('\n', at) - at);
  // "  windows:       200 cases, 150 crossed the window, 90 twice; ..."
  const size_t crossed = line.find(" cases, ") + 8;
  EXPECT_GT(std::stol(line.substr(crossed)), 100) << line;
  EXPECT_THAT(line, HasSubstr("no shift steps"));
  EXPECT_EQ(r.out.find("  shifts:        "), std::string::npos) << r.out;
  std::cout << "figure: tiny-swa impl,ref64: " << line << "\n";
}

// A user's scenario that truncates past what the window still holds: exit 2, the rule stated.
TEST(WindowTruncate, AScenarioTruncatingPastTheWindowIsRefusedWithTheRule) {
  TempDir dir;
  WriteFile(
      dir / "t.json", R"({"model": {"preset": "tiny-swa", "seed": 1},
    "steps": [{"op": "prefill", "tokens": [)" +
                          [] {
                            std::string t;
                            for (int i = 0; i < 40; ++i)
                              t += (i ? "," : "") + std::to_string(3 + i);
                            return t;
                          }() +
                          R"(]},
              {"op": "truncate", "length": 20}]})");
  const CommandResult r = RunKvdiff("run t.json --backends impl", dir.path());
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("sliding window of 32 positions"));
  EXPECT_THAT(r.err, HasSubstr("a truncate goes back at most to 39"));
}

#ifdef KVDIFF_HAS_LLAMACPP
// llama.cpp's llama architecture has no sliding window: a windowed model is refused there.
TEST(WindowBackends, LlamaCppIsRefusedOnAWindowedModel) {
  TempDir dir;
  const CommandResult r =
      RunKvdiff("check --preset tiny-swa --cases 2 --backends impl,llama.cpp", dir.path());
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("backend 'llama.cpp' does not apply a sliding window"));
}
#endif

}  // namespace
}  // namespace kvdiff::testing
