// The default campaign's context shifts (issue 34), from the command line: with impl and ref64,
// both of which shift, `kvdiff check` draws shift episodes (its coverage says how many) and
// passes; each test-only fault of impl's shift (impl/batch_fault.h) is caught by the same
// campaign and shrunk to a replay file of a few steps holding a shift, which fails again when
// replayed.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <iostream>
#include <string>

#include "tests/test_support.h"

namespace kvdiff::testing {
namespace {

using ::testing::HasSubstr;

// The default campaign on `backends` must fail, and its first failing case be shrunk to at most
// `max_steps` steps holding a shift, which `kvdiff run` fails again (exit 1).
void ExpectCaughtAndShrunkToAShift(const std::string& backends, size_t max_steps) {
  TempDir dir;
  const CommandResult r =
      RunKvdiff("check --cases 200 --shrink 1 --backends '" + backends + "'", dir.path());
  EXPECT_EQ(r.exit_code, 1) << backends << "\n" << r.out << r.err;
  const size_t first = r.out.find("FAIL case ");
  ASSERT_NE(first, std::string::npos) << backends << "\n" << r.out;
  const size_t shrunk = r.out.find("  shrunk to ", first);
  ASSERT_NE(shrunk, std::string::npos) << backends << "\n" << r.out;
  const std::string line = r.out.substr(shrunk, r.out.find('\n', shrunk) - shrunk);
  const size_t replay = r.out.find("replay: kvdiff run ", shrunk);
  ASSERT_NE(replay, std::string::npos) << backends;
  const std::string file = r.out.substr(replay + 19, r.out.find('\n', replay) - replay - 19);
  EXPECT_THAT(file, HasSubstr("-shrunk.json"));
  const std::string text = ReadFile(dir.path() / file);
  EXPECT_THAT(text, HasSubstr("\"op\":\"shift\"")) << backends;
  size_t steps = 0;
  for (size_t at = text.find("\"op\":"); at != std::string::npos; at = text.find("\"op\":", at + 1))
    ++steps;
  EXPECT_LE(steps, max_steps) << backends << "\n" << text;
  const CommandResult again = RunKvdiff("run " + file, dir.path());
  EXPECT_EQ(again.exit_code, 1) << backends << "\n" << text << again.out << again.err;
  const size_t summary = r.out.find("FAIL: ");
  std::cout << "figure: " << backends << ": "
            << r.out.substr(summary, r.out.find('\n', summary) - summary) << "; first "
            << r.out.substr(first, r.out.find('\n', first) - first) << "; " << line << "\n"
            << text << "\n";
}

TEST(ShiftMutants, EachShiftFaultOfImplIsCaughtByTheDefaultCampaignAndShrunk) {
  for (const char* fault :
       {"shift-delta-overwritten", "shift-skipped-when-empty", "shift-not-rerotated"}) {
    ExpectCaughtAndShrunkToAShift(std::string("impl?fault=") + fault + ",ref64", 6);
  }
}

TEST(ShiftMutants, ImplAndRef64PassTheSameCampaignWithItsShifts) {
  TempDir dir;
  const CommandResult r = RunKvdiff("check --cases 200 --backends impl,ref64", dir.path());
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("PASS: 200 of 200 cases run"));
  const size_t shifts = r.out.find("  shifts:        ");
  ASSERT_NE(shifts, std::string::npos) << r.out;
  const std::string line = r.out.substr(shifts, r.out.find('\n', shifts) - shifts);
  EXPECT_GT(std::stol(line.substr(17)), 100) << line;  // "  shifts:        423 steps; ..."
  std::cout << "figure: impl,ref64: " << line << "\n";
}

}  // namespace
}  // namespace kvdiff::testing
