// Engines as programs (`exec:COMMAND`, docs/protocol.md): examples/numpy_engine.py, a numpy Llama
// on python/kvdiff_engine.py, passes `kvdiff conform` and a check beside impl at 1e-4; its injected
// bug (bug=forgot-position) is caught by both; its refusals are bad input; a Python without numpy
// refuses clearly; a program that dies mid-call fails the case and the next case gets a fresh
// process; it conforms on the real stories260K model too. Debian's interpreter is named explicitly:
// the python3 first on PATH may have no numpy. (What a program that breaks the protocol gets is in
// the bad-input catalogue.)
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "tests/test_support.h"

namespace kvdiff::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr const char* kPython = "/usr/bin/python3";

// The backend spec of the numpy engine, with "?options" when given, quoted for the shell.
std::string NumpyEngine(const std::string& options = "", const std::string& python = kPython) {
  return ShellQuote(fmt::format("exec:{} {}/examples/numpy_engine.py{}", python, KVDIFF_SOURCE_DIR,
                                options.empty() ? "" : "?" + options));
}

// The row of conform's table for one check: "  name   RESULT  detail".
std::string RowOf(const std::string& table, const std::string& check) {
  const size_t at = table.find("\n  " + check + " ");
  if (at == std::string::npos) return "";
  return table.substr(at + 1, table.find('\n', at + 1) - at - 1);
}

TEST(ExecEngine, TheNumpyEnginePassesConform) {
  TempDir dir;
  const CommandResult r = RunKvdiff("conform " + NumpyEngine() + " --cases 4", dir.path());
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("engine program numpy-llama 1, f32 cache"));
  EXPECT_THAT(r.out, HasSubstr("PASS: 22 of 22 checks passed, 0 failed"));
  // Its append_batch runs the items one after another: bit-identical to the items alone.
  EXPECT_THAT(RowOf(r.out, "batch"), HasSubstr("PASS"));
  EXPECT_THAT(RowOf(r.out, "batch-refusals"), HasSubstr("batch item 1: token id 256"));
  // Its shift (the protocol's, ABI 3's semantics): rows after it held to the arbiter.
  EXPECT_THAT(RowOf(r.out, "shift"), HasSubstr("PASS   10 rows after a shift against "));
  EXPECT_THAT(RowOf(r.out, "shift-beyond"), HasSubstr("shift(keep=7, discard=7): expected"));
}

TEST(ExecEngine, TheNumpyEnginePassesACheckBesideImpl) {
  TempDir dir;
  const CommandResult r =
      RunKvdiff("check --cases 6 --backends " + NumpyEngine().insert(1, "impl,"), dir.path());
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("PASS: 6 of 6 cases run"));
}

// A real trained model (stories260K, converted from llama2.c): 5 layers, 8/4 heads, tied head.
TEST(ExecEngine, TheNumpyEnginePassesConformOnStories260K) {
  KVDIFF_REQUIRE_SHARED_DATA(data);
  TempDir dir;
  const CommandResult convert = ConvertStories260K(data, dir.path(), "s260k");
  ASSERT_EQ(convert.exit_code, 0) << convert.err;
  const CommandResult r =
      RunKvdiff("conform " + NumpyEngine() + " --model s260k --cases 4", dir.path());
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("5 layers, hidden 64, 8/4 heads"));
  EXPECT_THAT(r.out, HasSubstr("PASS: 22 of 22 checks passed, 0 failed"));
}

TEST(ExecEngine, AForgottenPositionUpdateIsCaughtByConformAndByCheck) {
  TempDir dir;
  const CommandResult conform =
      RunKvdiff("conform " + NumpyEngine("bug=forgot-position") + " --cases 4", dir.path());
  EXPECT_EQ(conform.exit_code, 1) << conform.out << conform.err;
  EXPECT_THAT(RowOf(conform.out, "prefill"), HasSubstr("PASS"));  // one append from 0 is right
  EXPECT_THAT(RowOf(conform.out, "chunks"), HasSubstr("FAIL"));
  EXPECT_THAT(RowOf(conform.out, "chunks"), HasSubstr("differs from impl's uncached forward"));

  const CommandResult check = RunKvdiff("check --cases 4 --shrink 0 --backends " +
                                            NumpyEngine("bug=forgot-position").insert(1, "impl,"),
                                        dir.path());
  EXPECT_EQ(check.exit_code, 1) << check.out << check.err;
  EXPECT_THAT(check.out, HasSubstr("replay: kvdiff run kvdiff-failures/"));
}

TEST(ExecEngine, TheEnginesRefusalsAreBadInput) {
  TempDir dir;
  const CommandResult r = RunKvdiff(
      "check --cases 2 --backends " + NumpyEngine("bug=sometimes").insert(1, "impl,"), dir.path());
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("option bug=sometimes: expected none or forgot-position"));
  EXPECT_THAT(r.err, Not(HasSubstr("Traceback")));
}

// -S leaves out site-packages, where Debian's numpy lives: an interpreter without numpy.
TEST(ExecEngine, APythonWithoutNumpyRefusesClearly) {
  TempDir dir;
  const CommandResult r = RunKvdiff(
      "check --cases 2 --backends " + NumpyEngine("", "/usr/bin/python3 -S").insert(1, "impl,"),
      dir.path());
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("numpy is not installed for /usr/bin/python3: apt-get install "
                               "python3-numpy"));
  EXPECT_THAT(r.err, Not(HasSubstr("Traceback")));
}

TEST(ExecEngine, AProgramThatDiesMidCallFailsEveryCaseOnAFreshProcess) {
  TempDir dir;
  const std::string engine =
      ShellQuote(fmt::format("impl,exec:{} {}/tests/engines/misbehaving_engine.py exit-mid-call",
                             kPython, KVDIFF_SOURCE_DIR));
  const CommandResult r = RunKvdiff("check --cases 3 --shrink 0 --backends " + engine, dir.path());
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  // Each case meets a new process that dies in its first append, so each names the exit.
  size_t named = 0;
  for (size_t at = 0; (at = r.out.find("the engine program exited with code 3 during append",
                                       at)) != std::string::npos;
       ++at) {
    ++named;
  }
  EXPECT_GE(named, 3u) << r.out;
  EXPECT_THAT(r.out, HasSubstr("FAIL: 3 of 3 cases run"));
}

}  // namespace
}  // namespace kvdiff::testing
