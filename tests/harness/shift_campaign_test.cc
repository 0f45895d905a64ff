// The default campaign's context shifts (issue 34), from the command line: with impl and ref64,
// both of which shift, `kvdiff check` draws shift episodes (its coverage says how many) and
// passes; each test-only fault of impl's shift (impl/batch_fault.h) is caught by the same
// campaign and shrunk to a replay file of a few steps holding a shift, which fails again when
// replayed.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <iostream>
#include <string>

#include "tests/mutant_campaign_support.h"
#include "tests/test_support.h"

namespace kvdiff::testing {
namespace {

using ::testing::HasSubstr;

TEST(ShiftMutants, EachShiftFaultOfImplIsCaughtByTheDefaultCampaignAndShrunk) {
  for (const char* fault :
       {"shift-delta-overwritten", "shift-skipped-when-empty", "shift-not-rerotated"}) {
    ExpectCaughtAndShrunkTo("shift", std::string("impl?fault=") + fault + ",ref64", 6);
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
