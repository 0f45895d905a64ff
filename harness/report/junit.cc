#include "harness/report/junit.h"

#include <fmt/format.h>

#include <cstdint>

#include "harness/report/run_report.h"

namespace kvdiff::harness {
namespace {

struct Counts {
  int64_t tests = 0, failures = 0, errors = 0, skipped = 0;
  void Add(const Counts& o) {
    tests += o.tests;
    failures += o.failures;
    errors += o.errors;
    skipped += o.skipped;
  }
};

std::string CaseXml(const JUnitSuite& suite, const JUnitCase& c, Counts& counts) {
  ++counts.tests;
  std::string out = fmt::format("    <testcase classname=\"{}\" name=\"{}\" time=\"0\"",
                                XmlEscape(suite.classname), XmlEscape(c.name));
  const std::string message = c.message.empty() ? c.text.substr(0, c.text.find('\n')) : c.message;
  switch (c.outcome) {
    case JUnitOutcome::kPassed:
      return out + "/>\n";
    case JUnitOutcome::kSkipped:
      ++counts.skipped;
      return out + fmt::format(">\n      <skipped message=\"{}\"/>\n    </testcase>\n",
                               XmlEscape(c.text));
    case JUnitOutcome::kFailure:
    case JUnitOutcome::kError: {
      const bool failure = c.outcome == JUnitOutcome::kFailure;
      ++(failure ? counts.failures : counts.errors);
      const char* tag = failure ? "failure" : "error";
      return out + fmt::format(">\n      <{} type=\"{}\" message=\"{}\">{}</{}>\n    </testcase>\n",
                               tag, XmlEscape(c.type), XmlEscape(message), XmlEscape(c.text), tag);
    }
  }
  return out + "/>\n";
}

}  // namespace

std::string ToJUnitXml(const std::string& name, double seconds,
                       const std::vector<JUnitSuite>& suites) {
  Counts all;
  std::string body;
  for (const JUnitSuite& suite : suites) {
    Counts counts;
    std::string cases;
    for (const JUnitCase& c : suite.cases) cases += CaseXml(suite, c, counts);
    body += fmt::format(
        "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{}\" errors=\"{}\" skipped=\"{}\" "
        "time=\"{:.3f}\">\n",
        XmlEscape(suite.name), counts.tests, counts.failures, counts.errors, counts.skipped,
        suite.seconds);
    if (!suite.properties.empty()) {
      body += "    <properties>\n";
      for (const auto& [key, value] : suite.properties) {
        body += fmt::format("      <property name=\"{}\" value=\"{}\"/>\n", XmlEscape(key),
                            XmlEscape(value));
      }
      body += "    </properties>\n";
    }
    body += cases + "  </testsuite>\n";
    all.Add(counts);
  }
  return fmt::format(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites name=\"{}\" tests=\"{}\" "
      "failures=\"{}\" errors=\"{}\" time=\"{:.3f}\">\n{}</testsuites>\n",
      XmlEscape(name), all.tests, all.failures, all.errors, seconds, body);
}

}  // namespace kvdiff::harness
