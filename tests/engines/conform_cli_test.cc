// `kvdiff conform` through the binary: the example engine passes every check; the same engine
// behind an injected bug (tests/engines/broken_plugin.c: a truncate that keeps the cache, a fork
// without the parent's cache) fails the check that names the bug, and `kvdiff check` catches it
// too with a replay file; what cannot be loaded is bad input (exit 2). The batch checks pass on the
// example and on llama.cpp (also split into micro-batches of two tokens), and fail on each
// llama.cpp batch fault. The shift checks pass on the example and fail on its
// fault=shift-not-rerotated, and are skipped (saying why) for an engine that does not shift. The
// library call on in-process backends is in conform_library_test.cc.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "harness/backend/registry.h"
#include "tests/engines/conform_table.h"
#include "tests/harness/harness_test_util.h"
#include "tests/test_support.h"

namespace kvdiff::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Every check of `kvdiff conform`, in the order of its table.
const char* const kEveryCheck[] = {"prefill",
                                   "chunks",
                                   "truncate",
                                   "fork",
                                   "reset",
                                   "sessions",
                                   "deterministic",
                                   "token-out-of-range",
                                   "truncate-beyond",
                                   "empty-append",
                                   "capacity",
                                   "batch",
                                   "batch-fork-truncate",
                                   "batch-refusals",
                                   "shift",
                                   "shift-beyond",
                                   "after-shift",
                                   "truncate-by-one",
                                   "after-reset",
                                   "many-sessions",
                                   "long-history",
                                   "campaign"};

TEST(ConformCli, TheExampleEnginePassesEveryCheck) {
  TempDir dir;
  const CommandResult r =
      RunKvdiff(fmt::format("conform '{}' --cases 30 --junit conform.xml --json conform.json",
                            KVDIFF_EXAMPLE_ENGINE),
                dir.path());
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  for (const char* check : kEveryCheck) {
    EXPECT_THAT(RowOf(r.out, check), HasSubstr("PASS")) << check << "\n" << r.out;
  }
  EXPECT_THAT(r.out, HasSubstr("PASS: 22 of 22 checks passed, 0 failed (against impl"));
  // The example runs a batch's items one after another: bit-identical to the items alone.
  EXPECT_THAT(RowOf(r.out, "batch"), HasSubstr("against the items alone max |a-b| 0.0e+00"));
  EXPECT_THAT(RowOf(r.out, "batch-refusals"),
              HasSubstr("4 batches refused: example: batch item 1: token id 256"));
  // Rows after a shift are held to ref64 (with LibTorch), else to impl, which shifts too.
  EXPECT_THAT(
      RowOf(r.out, "shift"),
      HasSubstr(fmt::format("10 rows after a shift against {}, max |a-b| ",
                            harness::BackendRegistry::Global().Has("ref64") ? "ref64" : "impl")));
  EXPECT_THAT(RowOf(r.out, "shift-beyond"),
              HasSubstr("refused: example: shift(keep=7, discard=7): expected 0 <= keep"));
  const std::string xml = ReadFile(dir / "conform.xml");
  EXPECT_EQ(XmlProblem(xml, nullptr), "");
  EXPECT_THAT(xml, HasSubstr("tests=\"22\""));
  const auto json = nlohmann::json::parse(ReadFile(dir / "conform.json"));
  EXPECT_EQ(json["passed"], true);
  EXPECT_EQ(json["checks"].size(), 22u);
  EXPECT_EQ(json["shift_arbiter"],
            harness::BackendRegistry::Global().Has("ref64") ? "ref64" : "impl");
}

// The proof of power: moved keys left with their old rotation fail the shift checks (shift at the
// first row after the first shift, after-shift at the first row after its shift), and nothing else.
TEST(ConformCli, TheExamplesShiftFaultFailsTheShiftChecksOnly) {
  TempDir dir;
  const CommandResult r = RunKvdiff(
      fmt::format("conform '{}?fault=shift-not-rerotated' --cases 0", KVDIFF_EXAMPLE_ENGINE),
      dir.path());
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_THAT(RowOf(r.out, "shift"),
              HasSubstr("FAIL   main: +3 after shift(0, 5): position 15 differs from "));
  EXPECT_THAT(RowOf(r.out, "shift"), HasSubstr("'s after the same shifts by "));
  EXPECT_THAT(RowOf(r.out, "after-shift"), HasSubstr("FAIL   child: +2 after shift(2, 6) of its"));
  EXPECT_THAT(r.out, HasSubstr("FAIL: 19 of 21 checks passed, 2 failed"));
  std::cout << "figure: conform " << RowOf(r.out, "shift") << "\n";
}

// An engine that does not shift (a version-2 plugin) passes, its shift checks skipped saying why.
TEST(ConformCli, TheShiftChecksAreSkippedForAnEngineThatDoesNotShift) {
  TempDir dir;
  const CommandResult r =
      RunKvdiff(fmt::format("conform '{}' --cases 0", KVDIFF_BROKEN_V2_ENGINE), dir.path());
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  for (const char* check : {"shift", "shift-beyond", "after-shift"}) {
    EXPECT_THAT(RowOf(r.out, check),
                HasSubstr("skip   the engine does not shift (a plugin of ABI 1 or 2, or whose "
                          "shift is NULL"))
        << r.out;
  }
  EXPECT_THAT(r.out, HasSubstr("PASS: 18 of 21 checks passed, 0 failed, 3 skipped"));
}

TEST(ConformCli, TheWrapperWithoutABugPassesToo) {
  TempDir dir;
  const CommandResult r =
      RunKvdiff(fmt::format("conform '{}?bug=none' --cases 10", KVDIFF_BROKEN_ENGINE), dir.path());
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
}

TEST(ConformCli, ATruncateThatKeepsTheCacheIsCaughtByConformAndByCheck) {
  TempDir dir;
  const CommandResult r = RunKvdiff(
      fmt::format("conform '{}?bug=truncate' --cases 50", KVDIFF_BROKEN_ENGINE), dir.path());
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_THAT(RowOf(r.out, "truncate"), HasSubstr("FAIL"));
  EXPECT_THAT(RowOf(r.out, "truncate"), HasSubstr("append of 4 after truncate to 6: position 6 "
                                                  "differs from impl's uncached forward"));
  EXPECT_THAT(RowOf(r.out, "prefill"), HasSubstr("PASS"));  // it names the bug, nothing else
  EXPECT_THAT(RowOf(r.out, "fork"), HasSubstr("PASS"));
  EXPECT_THAT(RowOf(r.out, "campaign"), HasSubstr("FAIL"));
  EXPECT_THAT(RowOf(r.out, "campaign"), HasSubstr("replay: kvdiff run"));
  EXPECT_THAT(RowOf(r.out, "campaign"), HasSubstr("-shrunk.json"));  // its smallest reproduction

  const CommandResult check =
      RunKvdiff(fmt::format("check --backends 'impl,plugin:{}?bug=truncate' --cases 50 --shrink 0",
                            KVDIFF_BROKEN_ENGINE),
                dir.path());
  EXPECT_EQ(check.exit_code, 1) << check.out << check.err;
  EXPECT_THAT(check.out, HasSubstr("kvdiff-failures/"));
  // A version-1 plugin has no shift: the campaign draws none, and says so by name.
  EXPECT_THAT(check.out, HasSubstr("  shifts:        none drawn: backend plugin:"));
  EXPECT_THAT(check.out, HasSubstr("?bug=truncate does not shift"));
}

TEST(ConformCli, AForkWithoutTheParentsCacheIsCaughtByConformAndByCheck) {
  TempDir dir;
  const CommandResult r =
      RunKvdiff(fmt::format("conform '{}?bug=fork' --cases 50", KVDIFF_BROKEN_ENGINE), dir.path());
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_THAT(RowOf(r.out, "fork"), HasSubstr("FAIL"));
  EXPECT_THAT(RowOf(r.out, "fork"), HasSubstr("child +2 after the fork: position 8 differs"));
  EXPECT_THAT(RowOf(r.out, "truncate"), HasSubstr("PASS"));

  const CommandResult check =
      RunKvdiff(fmt::format("check --backends 'impl,plugin:{}?bug=fork' --cases 100 --shrink 0",
                            KVDIFF_BROKEN_ENGINE),
                dir.path());
  EXPECT_EQ(check.exit_code, 1) << check.out << check.err;
}

TEST(ConformCli, WhatCannotBeLoadedIsBadInput) {
  TempDir dir;
  const CommandResult missing = RunKvdiff("conform no/such/libengine.so", dir.path());
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_THAT(missing.err, HasSubstr("neither a backend"));
  const CommandResult bad_option =
      RunKvdiff(fmt::format("conform '{}?bug=sometimes'", KVDIFF_BROKEN_ENGINE), dir.path());
  EXPECT_EQ(bad_option.exit_code, 2) << bad_option.out << bad_option.err;
  EXPECT_THAT(bad_option.err, HasSubstr("option bug"));
}

#ifdef KVDIFF_LLAMACPP_ENGINE
// llama.cpp through conform: every op and error path within the gate; the broken wrapper around
// it (inner=) stands for a llama.cpp plugin that forgets llama_memory_seq_rm on truncate, or
// llama_memory_seq_cp on fork, and is caught by conform and by check with a replay file.
// The capacity check fills a session to all 512 positions: llama.cpp computes RoPE angles in
// float32, as transformers does, and drifts from impl's exact angles (1.3e-4 at position 504, past
// the flat gate); it is held to the measured rope-f32 profile, which the report names. With
// --tolerance 1e-4 (a flag wins over any profile) the same check fails at the top positions.
TEST(ConformCli, LlamaCppConformsWithItsFloat32RopeHeldToTheMeasuredProfile) {
  TempDir dir;
  const CommandResult r = RunKvdiff("conform llama.cpp --cases 30", dir.path());
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("tolerance profile rope-f32 (+2.0e-06 per position, across "
                               "backends) for llama.cpp"));
  for (const std::string check : kEveryCheck) {
    if (check == "many-sessions") continue;  // below
    EXPECT_THAT(RowOf(r.out, check), HasSubstr("PASS")) << check << "\n" << r.out << r.err;
  }
  // Its default sessions=8 holds no ninth conversation.
  EXPECT_THAT(RowOf(r.out, "many-sessions"),
              HasSubstr("skip   9 sessions alive at once are needed (more than a table of eight); "
                        "the engine holds 8 (max_sessions)"));
  for (const char* check : {"batch", "batch-fork-truncate"})
    std::cout << "figure: llama.cpp conform " << RowOf(r.out, check) << "\n";
  const CommandResult flat = RunKvdiff("conform llama.cpp --cases 0 --tolerance 1e-4", dir.path());
  std::cout << "figure: llama.cpp conform capacity at the flat gate: "
            << RowOf(flat.out, "capacity") << "\n";
  EXPECT_THAT(flat.out, Not(HasSubstr("tolerance profile rope-f32")));
  EXPECT_THAT(RowOf(flat.out, "capacity"), HasSubstr("FAIL"));  // 1.4e-4 at position 504
}

// ubatch=2: llama.cpp splits every batch into micro-batches of two tokens, across items; the rows
// must not move.
TEST(ConformCli, LlamaCppPassesTheBatchChecksWithMicroBatchesOfTwoTokens) {
  TempDir dir;
  const CommandResult r = RunKvdiff("conform 'llama.cpp?ubatch=2' --cases 0", dir.path());
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  for (const char* check : {"batch", "batch-fork-truncate", "batch-refusals"}) {
    EXPECT_THAT(RowOf(r.out, check), HasSubstr("PASS")) << check << "\n" << r.out << r.err;
    std::cout << "figure: llama.cpp?ubatch=2 conform " << RowOf(r.out, check) << "\n";
  }
}

// llama.cpp opened with limits (two sequences; a session of 20 positions) is a correct engine:
// conform holds it to what it declares, not to the model. The checks that need more are skipped,
// naming the step and the limit; the others pass, fork and shift in two sessions, and capacity
// fills the 20 positions declared and sees the 21st refused.
TEST(ConformCli, LlamaCppWithDeclaredLimitsPassesWithTheChecksBeyondThemSkipped) {
  TempDir dir;
  const CommandResult two = RunKvdiff("conform 'llama.cpp?sessions=2' --cases 20", dir.path());
  EXPECT_EQ(two.exit_code, 0) << two.out << two.err;
  for (const char* check : {"fork", "sessions", "shift", "batch-refusals", "campaign"})
    EXPECT_THAT(RowOf(two.out, check), HasSubstr("PASS")) << check << "\n" << two.out;
  for (const char* check : {"batch", "batch-fork-truncate"}) {
    EXPECT_THAT(RowOf(two.out, check),
                HasSubstr("skip   a batch of two conversations and an item alone need 3 sessions "
                          "at once; the engine holds 2 (max_sessions)"))
        << check << "\n"
        << two.out;
  }
  EXPECT_THAT(two.out, HasSubstr("PASS: 19 of 22 checks passed, 0 failed, 3 skipped"));
  // Four sequences, as a server with four slots: batches of three conversations.
  const CommandResult four = RunKvdiff("conform 'llama.cpp?sessions=4' --cases 0", dir.path());
  EXPECT_EQ(four.exit_code, 0) << four.out << four.err;
  for (const char* check : {"batch", "batch-fork-truncate"}) {
    EXPECT_THAT(RowOf(four.out, check), HasSubstr("PASS")) << check << "\n" << four.out;
    EXPECT_THAT(RowOf(four.out, check), HasSubstr("; 3 conversations a call (max_sessions 4)"))
        << check << "\n"
        << four.out;
  }

  const CommandResult short_ = RunKvdiff("conform 'llama.cpp?max_length=20' --cases 0", dir.path());
  EXPECT_EQ(short_.exit_code, 0) << short_.out << short_.err;
  EXPECT_THAT(RowOf(short_.out, "capacity"),
              HasSubstr("PASS   20 positions held; 21 refused: llama.cpp: session holds 20 "
                        "positions of max_length 20"));
  EXPECT_THAT(RowOf(short_.out, "prefill"), HasSubstr("PASS   20 rows"));
  EXPECT_THAT(RowOf(short_.out, "chunks"), HasSubstr("(max_length 20)"));
  EXPECT_THAT(RowOf(short_.out, "long-history"),
              HasSubstr("skip   a history of 300 positions is needed; the engine holds max_length "
                        "20"));
  EXPECT_THAT(short_.out, HasSubstr("0 failed, 5 skipped"));
}

// The plugin's test-only batching bugs (engines/llama_cpp: fault=) fail conform's batch checks and
// no check without a batched call: by a row that differs from the oracle's, or by llama.cpp
// refusing the faulty batch; also when three sequences cut the batches to two conversations.
TEST(ConformCli, EachLlamaCppBatchFaultFailsTheChecksWithBatchedCallsOnly) {
  const char* const without_batches[] = {"prefill", "chunks",          "truncate",
                                         "fork",    "reset",           "sessions",
                                         "shift",   "truncate-by-one", "capacity"};
  TempDir dir;
  for (const std::string fault :
       {"batch-shared-positions", "batch-rows-swapped", "batch-one-seq"}) {
    const CommandResult r =
        RunKvdiff(fmt::format("conform 'llama.cpp?fault={}' --cases 0", fault), dir.path());
    EXPECT_EQ(r.exit_code, 1) << fault << "\n" << r.out << r.err;
    EXPECT_THAT(RowOf(r.out, "batch"), HasSubstr("FAIL")) << fault << "\n" << r.out;
    EXPECT_THAT(RowOf(r.out, "batch-fork-truncate"), HasSubstr("FAIL")) << fault << "\n" << r.out;
    // Three sequences: batches of two conversations still catch each fault.
    const CommandResult three = RunKvdiff(
        fmt::format("conform 'llama.cpp?fault={}&sessions=3' --cases 0", fault), dir.path());
    EXPECT_EQ(three.exit_code, 1) << fault << "\n" << three.out << three.err;
    for (const CommandResult* run : {&r, &three}) {
      EXPECT_THAT(RowOf(run->out, "batch"), HasSubstr("FAIL")) << fault << "\n" << run->out;
      for (const char* check : without_batches)
        EXPECT_THAT(RowOf(run->out, check), HasSubstr("PASS")) << fault << "\n" << run->out;
    }
  }
}

TEST(ConformCli, ALlamaCppThatForgetsSeqRmOrSeqCpIsCaughtByConformAndByCheck) {
  TempDir dir;
  for (const std::string bug : {"truncate", "fork"}) {
    const std::string engine =
        fmt::format("{}?inner={}&bug={}", KVDIFF_BROKEN_ENGINE, KVDIFF_LLAMACPP_ENGINE, bug);
    const CommandResult r = RunKvdiff(fmt::format("conform '{}' --cases 50", engine), dir.path());
    EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
    EXPECT_THAT(RowOf(r.out, bug), HasSubstr("FAIL")) << r.out;
    EXPECT_THAT(RowOf(r.out, "prefill"), HasSubstr("PASS")) << r.out;
    EXPECT_THAT(RowOf(r.out, "campaign"), HasSubstr("replay: kvdiff run")) << r.out;
    const CommandResult check =
        RunKvdiff(fmt::format("check --backends 'impl,plugin:{}' --cases 100", engine), dir.path());
    EXPECT_EQ(check.exit_code, 1) << check.out << check.err;
    EXPECT_THAT(check.out, HasSubstr("replay: kvdiff run kvdiff-failures/"));
  }
}

// kv=f16 cannot meet 1e-4 (2e-2 on tiny): its options select the f16 profile, named in the report;
// the profile still catches a cache bug, which moves logits by whole units.
TEST(ConformCli, AnF16CacheIsHeldToItsMeasuredProfileWhichStillCatchesCacheBugs) {
  TempDir dir;
  const std::string f16 = fmt::format("plugin:{}?kv=f16", KVDIFF_LLAMACPP_ENGINE);
  const CommandResult pass =
      RunKvdiff(fmt::format("check --backends 'impl,{}' --cases 100", f16), dir.path());
  EXPECT_EQ(pass.exit_code, 0) << pass.out << pass.err;
  EXPECT_THAT(pass.out, HasSubstr("tolerance profile f16 (max |a-b| <= 1.0e-01) for " + f16));
  EXPECT_THAT(pass.out, HasSubstr("within the tolerance 1.0e-01 in case"));
  // The profile's distribution metrics: the f16 cache moves the argmax of near-ties only, and
  // the next-token distribution by a KL far below a cache bug's.
  EXPECT_THAT(pass.out, HasSubstr("distribution impl~" + f16 + ": argmax agrees on "));
  EXPECT_THAT(pass.out, HasSubstr("top-5 overlap 5.00/5"));
  const CommandResult gate = RunKvdiff(
      fmt::format("check --backends 'impl,{}' --cases 20 --tolerance 1e-4", f16), dir.path());
  EXPECT_EQ(gate.exit_code, 1) << gate.out;  // the flag wins over the profile
  const CommandResult broken = RunKvdiff(
      fmt::format("check --backends 'impl,plugin:{}?inner={}&kv=f16&bug=truncate' --cases 100",
                  KVDIFF_BROKEN_ENGINE, KVDIFF_LLAMACPP_ENGINE),
      dir.path());
  EXPECT_EQ(broken.exit_code, 1) << broken.out << broken.err;
  EXPECT_THAT(broken.out, HasSubstr("tolerance profile f16"));
}

// The source document's experiments on a trained model, run by llama.cpp's own cache through the
// checked API: the correct runs agree with the document; the raw-call misuses do not apply.
TEST(ConformCli, ReproAllOnStories260KThroughLlamaCpp) {
  KVDIFF_REQUIRE_SHARED_DATA(data);
  TempDir dir;
  const CommandResult convert = ConvertStories260K(data, dir.path(), "st");
  ASSERT_EQ(convert.exit_code, 0) << convert.err;
  const CommandResult r = RunKvdiff("repro all --model st --backend llama.cpp", dir.path());
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  for (const char* experiment : {"ok", "fresh", "fresh1"}) {
    EXPECT_THAT(
        r.out, ::testing::ContainsRegex(fmt::format("\n{} +the correct output .* yes", experiment)))
        << r.out;
  }
  EXPECT_THAT(r.out, HasSubstr("skipped: driver \"pos0\" does not apply to backend \"llama.cpp\""));
}
#endif

}  // namespace
}  // namespace kvdiff::testing
