// Running properties from GoogleTest with a case count of their own.
//
// RC_GTEST_PROP runs RapidCheck's default 100 cases (RC_PARAMS="max_success=N" changes it).
// The expensive properties (stateful, smollm2-sized) declare a smaller default with KVDIFF_PROP;
// RC_PARAMS="max_success=N" scales those by N/100 too, so one knob deepens the whole campaign.
// Failures are reported exactly like RC_GTEST_PROP's: the counterexample, and at exit the
// RC_PARAMS="reproduce=..." line that replays it (the test id is "Suite/Name", as RapidCheck's).
#pragma once

#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <sstream>
#include <string>

namespace kvdiff::props {

inline int ScaledCases(int default_cases) {
  const int configured = rc::detail::configuration().testParams.maxSuccess;
  const int rapidcheck_default = rc::detail::TestParams().maxSuccess;
  return std::max(1, default_cases * configured / rapidcheck_default);
}

template <typename Testable>
void CheckGTestWithCases(int default_cases, Testable&& testable) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  rc::detail::TestMetadata metadata;
  metadata.id = std::string(info->test_suite_name()) + "/" + info->name();
  metadata.description = info->name();
  rc::detail::TestParams params = rc::detail::configuration().testParams;
  params.maxSuccess = ScaledCases(default_cases);
  const auto result = rc::detail::checkTestable(std::forward<Testable>(testable), metadata, params);
  if (!result.template is<rc::detail::SuccessResult>()) {
    std::ostringstream message;
    rc::detail::printResultMessage(result, message);
    FAIL() << message.str();
  }
}

}  // namespace kvdiff::props

// A property test with its own default case count (scaled by RC_PARAMS max_success / 100).
#define KVDIFF_PROP(Suite, Name, default_cases)                                        \
  void kvdiffProp_##Suite##_##Name();                                                  \
  TEST(Suite, Name) {                                                                  \
    ::kvdiff::props::CheckGTestWithCases(default_cases, &kvdiffProp_##Suite##_##Name); \
  }                                                                                    \
  void kvdiffProp_##Suite##_##Name()
