// The one JUnit XML writer: `run`, `check` and `golden verify` describe their results as suites of
// cases, and CI systems read the same shape from all three.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace kvdiff::harness {

enum class JUnitOutcome { kPassed, kFailure, kError, kSkipped };

struct JUnitCase {
  std::string name;
  JUnitOutcome outcome = JUnitOutcome::kPassed;
  std::string type;     // failure/error type: "divergence", "backend_error", "mismatch", ...
  std::string message;  // one line; empty: the first line of text
  std::string text;     // the whole story (failure and error bodies; the skip reason)
};

struct JUnitSuite {
  std::string name;
  std::string classname;  // dotted, as CI systems group cases by the dots
  double seconds = 0;
  std::vector<std::pair<std::string, std::string>> properties;
  std::vector<JUnitCase> cases;
};

// <testsuites name=...> with every suite, counts of tests, failures, errors and skips computed.
std::string ToJUnitXml(const std::string& name, double seconds,
                       const std::vector<JUnitSuite>& suites);

}  // namespace kvdiff::harness
