// What the mutant tests of the default campaign share (tests/harness/shift_campaign_test.cc,
// tests/engines/serving_campaign_test.cc): `kvdiff check` on a faulty backend must fail, and its
// first failing case be shrunk to a replay file of a few steps holding the op the fault lives in,
// which `kvdiff run` fails again.
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <iostream>
#include <string>

#include "tests/test_support.h"

namespace kvdiff::testing {

// The default campaign (200 cases, the first failure shrunk) on `backends` fails; its shrunk file
// holds at most `max_steps` steps, one of them an `op` step, and fails again on `kvdiff run`
// (exit 1). `failing_step` not empty: the shrunk case's first failure is at such a step (e.g.
// "batch(": the batch itself diverged, not a later step). `check_flags` go to `kvdiff check` too:
// the campaign's model (e.g. "--preset tiny-swa", or "--model DIR" for an engine the default
// preset's shape does not fit); empty: check's default. Prints the figures (the campaign's
// summary, the shrunk line and file) for the docs.
inline void ExpectCaughtAndShrunkTo(const std::string& op, const std::string& backends,
                                    size_t max_steps, const std::string& failing_step = "",
                                    const std::string& check_flags = "") {
  TempDir dir;
  const CommandResult r = RunKvdiff(
      "check --cases 200 --shrink 1 --backends '" + backends + "' " + check_flags, dir.path());
  EXPECT_EQ(r.exit_code, 1) << backends << "\n" << r.out << r.err;
  const size_t first = r.out.find("FAIL case ");
  ASSERT_NE(first, std::string::npos) << backends << "\n" << r.out;
  const size_t shrunk = r.out.find("  shrunk to ", first);
  ASSERT_NE(shrunk, std::string::npos) << backends << "\n" << r.out;
  const std::string line = r.out.substr(shrunk, r.out.find('\n', shrunk) - shrunk);
  if (!failing_step.empty()) {
    EXPECT_THAT(line, ::testing::HasSubstr(failing_step)) << backends;
  }
  const size_t replay = r.out.find("replay: kvdiff run ", shrunk);
  ASSERT_NE(replay, std::string::npos) << backends;
  const std::string file = r.out.substr(replay + 19, r.out.find('\n', replay) - replay - 19);
  EXPECT_THAT(file, ::testing::HasSubstr("-shrunk.json"));
  const std::string text = ReadFile(dir.path() / file);
  EXPECT_THAT(text, ::testing::HasSubstr("\"op\":\"" + op + "\"")) << backends;
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

}  // namespace kvdiff::testing
