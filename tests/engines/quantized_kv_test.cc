// Quantized KV caches (issue 34), from the command line. A kv= type an engine refuses is bad input
// through run, check and conform: exit 2, the option named, nothing written. A q8_0 or q4_0 cache
// (llama.cpp's; the example engine's q8_0) passes the default campaign under its measured tolerance
// profile, which the report names with its KL gate, and fails the flat 1e-4 gate; the profile
// still catches cache bugs (the broken wrapper over llama.cpp, and the example's q8_0 row scale
// misapplied, fault=q8-scale, shrunk to a replay file that fails again). Quantized blocks are 32
// values, so these run on a head_dim-32 variant of the tiny preset (tiny's head_dim is 16). Last,
// the compute-dtype profile of llama.cpp over bf16 weights.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <iostream>
#include <string>

#include "format/model_files.h"
#include "tests/mutant_campaign_support.h"
#include "tests/test_support.h"

namespace kvdiff::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// tiny with head_dim 32 (and hidden 128, so 4 query heads still fill it): q8_0 and q4_0 blocks
// fit a head. Written once per process.
const std::filesystem::path& TinyHd32() {
  static const TempDir dir;  // removed when the process exits
  static const std::filesystem::path path = [] {
    format::LlamaConfig c = format::PresetConfig("tiny");
    c.hidden_size = 128;
    c.head_dim = 32;
    format::SaveModel(dir / "tiny-hd32", format::MakeRandomModel(c, 3), format::DType::kF32);
    return dir / "tiny-hd32";
  }();
  return path;
}

// A small scenario on the tiny preset (head_dim 16), written into `dir` as s.json.
void WriteTinyScenario(const TempDir& dir) {
  WriteFile(dir.path() / "s.json",
            R"({"model": {"preset": "tiny", "seed": 3}, "steps": [)"
            R"({"op": "prefill", "tokens": [5, 17, 3, 99], "chunks": [3, 1]}, )"
            R"({"op": "decode", "n": 3}]})");
}

std::string Example(const std::string& options) {
  return fmt::format("plugin:{}?{}", KVDIFF_EXAMPLE_ENGINE, options);
}

// `backend` is refused by run, check and conform alike: exit 2, `message` on stderr, and no report
// or failures folder written.
void ExpectRefusedByEveryCommand(const TempDir& dir, const std::string& backend,
                                 const std::string& message) {
  const std::string commands[] = {
      fmt::format("run s.json --backends 'impl,{}' --json out.json", backend),
      fmt::format("check --cases 5 --backends 'impl,{}' --json out.json", backend),
      fmt::format("conform '{}' --cases 5 --json out.json", backend),
  };
  for (const std::string& command : commands) {
    const CommandResult r = RunKvdiff(command, dir.path());
    EXPECT_EQ(r.exit_code, 2) << command << "\n" << r.out << r.err;
    EXPECT_THAT(r.err, HasSubstr(message)) << command;
    EXPECT_FALSE(std::filesystem::exists(dir.path() / "out.json")) << command;
    EXPECT_FALSE(std::filesystem::exists(dir.path() / "kvdiff-failures")) << command;
  }
}

// A kv= type the example engine does not have, and a q8_0 cache on a head_dim its blocks do not
// divide: refused through every command, exit 2, the option named, no report written.
TEST(QuantizedKv, AKvTypeTheExampleRefusesIsBadInputThroughRunCheckAndConform) {
  TempDir dir;
  WriteTinyScenario(dir);
  const std::pair<std::string, std::string> refused[] = {
      {Example("kv=q4_0"), "option kv=q4_0: expected f32 or q8_0"},
      {Example("kv=q8_0"),
       "option kv=q8_0: the model's head_dim 16 is not a multiple of q8_0's "
       "block of 32"},
      {Example("fault=q8-scale"), "option fault=q8-scale needs kv=q8_0"},
  };
  for (const auto& [backend, message] : refused) ExpectRefusedByEveryCommand(dir, backend, message);
}

// The example's q8_0 cache passes the default campaign held to the q8_0 profile, and conform.
TEST(QuantizedKv, TheExamplesQ8CachePassesTheDefaultCampaignUnderItsProfile) {
  TempDir dir;
  const std::string model = TinyHd32().string();
  const CommandResult r = RunKvdiff(
      fmt::format("check --cases 200 --model '{}' --backends 'impl,{}'", model, Example("kv=q8_0")),
      dir.path());
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("PASS: 200 of 200 cases run"));
  EXPECT_THAT(r.out, HasSubstr("tolerance profile q8_0 (max |a-b| <= "));
  EXPECT_THAT(r.out, HasSubstr(", KL <= 6.0e-02 per row; against its own uncached forward max "
                               "|a-b| <= 1.0e-01) for " +
                               Example("kv=q8_0")));
  EXPECT_THAT(r.out, HasSubstr("distribution impl~" + Example("kv=q8_0") + ": argmax agrees on"));
  const size_t summary = r.out.find("PASS: ");
  std::cout << "figure: example kv=q8_0 check: " << r.out.substr(summary, 60) << "\n";
  const CommandResult flat =
      RunKvdiff(fmt::format("check --cases 20 --model '{}' --backends 'impl,{}' --tolerance 1e-4",
                            model, Example("kv=q8_0")),
                dir.path());
  EXPECT_EQ(flat.exit_code, 1) << "a q8_0 cache meets the flat gate: the profile is not needed\n"
                               << flat.out;
  const CommandResult conform = RunKvdiff(
      fmt::format("conform '{}' --model '{}' --cases 50", Example("kv=q8_0"), model), dir.path());
  EXPECT_EQ(conform.exit_code, 0) << conform.out << conform.err;
  EXPECT_THAT(conform.out, HasSubstr("tolerance profile q8_0"));
}

// The mutant: every block of a cached row read back with the scale of the row's first block.
TEST(QuantizedKv, AQ8RowScaleMisappliedIsCaughtByTheDefaultCampaignAndShrunk) {
  ExpectCaughtAndShrunkTo("prefill", "impl," + Example("kv=q8_0&fault=q8-scale"), 3, "",
                          fmt::format("--model '{}'", TinyHd32().string()));
}

#ifdef KVDIFF_LLAMACPP_ENGINE
// llama.cpp refuses a quantized cache without flash attention or on a head_dim its block of 32
// does not divide, and a type it is not offered: exit 2 naming what is needed, through each
// command.
TEST(QuantizedKv, AKvTypeLlamaCppRefusesIsBadInputThroughRunCheckAndConform) {
  TempDir dir;
  WriteTinyScenario(dir);
  const std::pair<std::string, std::string> refused[] = {
      {"llama.cpp?kv=q5_1", "option kv=q5_1: expected f32, f16, q8_0 or q4_0"},
      {"llama.cpp?kv=q4_0", "option kv=q4_0 needs flash_attn=on"},
      {"llama.cpp?kv=q4_0&flash_attn=on",
       "option kv=q4_0: the model's head_dim 16 is not a multiple of q4_0's block of 32"},
  };
  for (const auto& [backend, message] : refused) ExpectRefusedByEveryCommand(dir, backend, message);
}

// llama.cpp behind the wrapper of ABI 2 (bug=none: no shift call, so the campaign draws no shift
// steps; see below why): held to the q8_0 or q4_0 profile.
std::string LlamaCppWithoutShift(const std::string& options) {
  return fmt::format("plugin:{}?inner={}&{}", KVDIFF_BROKEN_V2_ENGINE, KVDIFF_LLAMACPP_ENGINE,
                     options);
}

// q8_0 and q4_0 caches pass the default campaign under their profiles and fail the flat gate; a
// truncate that keeps the cache (the broken wrapper's bug) is still caught under each profile.
TEST(QuantizedKv, LlamaCppsQuantizedCachesAreHeldToTheirProfilesWhichStillCatchCacheBugs) {
  TempDir dir;
  const std::string model = TinyHd32().string();
  for (const std::string kv : {"q8_0", "q4_0"}) {
    const std::string backend =
        LlamaCppWithoutShift(fmt::format("kv={}&flash_attn=on&bug=none", kv));
    const CommandResult pass = RunKvdiff(
        fmt::format("check --cases 100 --model '{}' --backends 'impl,{}'", model, backend),
        dir.path());
    EXPECT_EQ(pass.exit_code, 0) << pass.out << pass.err;
    EXPECT_THAT(pass.out, HasSubstr(fmt::format("tolerance profile {} (max |a-b| <= ", kv)));
    const size_t d = pass.out.find("distribution impl~" + backend);
    ASSERT_NE(d, std::string::npos) << pass.out;
    std::cout << "figure: " << kv << ": " << pass.out.substr(d, pass.out.find('\n', d) - d) << "\n";
    const CommandResult flat =
        RunKvdiff(fmt::format("check --cases 20 --model '{}' --backends 'impl,{}' --tolerance 1e-4",
                              model, backend),
                  dir.path());
    EXPECT_EQ(flat.exit_code, 1) << flat.out;
    const std::string truncate_bug =
        LlamaCppWithoutShift(fmt::format("kv={}&flash_attn=on&bug=truncate", kv));
    const CommandResult broken = RunKvdiff(
        fmt::format("check --cases 100 --model '{}' --backends 'impl,{}'", model, truncate_bug),
        dir.path());
    EXPECT_EQ(broken.exit_code, 1) << broken.out << broken.err;
    EXPECT_THAT(broken.out, HasSubstr(fmt::format("tolerance profile {}", kv)));
  }
}

// What the default campaign found: llama.cpp (the pinned build) dies of SIGSEGV applying a K-shift
// to a quantized cache (llama_kv_cache::build_rope_shift), as in the trackers' reports of shifts
// with quantized caches (ggml-org/llama.cpp#5652, #9383). The isolated engine's crash fails the
// case, whose shrunk replay holds the shift. When a llama.cpp update fixes it, this test fails:
// then measure the profiles with shifts and drop the wrapper above.
TEST(QuantizedKv, LlamaCppCrashesShiftingAQuantizedCacheAndTheCampaignSaysSo) {
  TempDir dir;
  const CommandResult r =
      RunKvdiff(fmt::format("check --cases 20 --shrink 1 --model '{}' --backends "
                            "'impl,llama.cpp?kv=q8_0&flash_attn=on'",
                            TinyHd32().string()),
                dir.path());
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("killed by signal 11 (SIGSEGV"));
  const size_t replay = r.out.find("replay: kvdiff run ");
  ASSERT_NE(replay, std::string::npos) << r.out;
  const std::string file = r.out.substr(replay + 19, r.out.find('\n', replay) - replay - 19);
  EXPECT_THAT(ReadFile(dir.path() / file), HasSubstr("\"op\":\"shift\"")) << file;
}

// Compute bf16: llama.cpp over bf16 weights rounds every matrix product's inputs to bf16, which
// the registered llama.cpp backend declares from its option weights=bf16 (KnownArithmetic). The
// flat gate flags that correct engine; the measured profile passes it, names itself, and still
// catches a bug (a batched call that swaps two items' rows). weights=f32 declares float32.
TEST(ComputeProfile, LlamaCppOverBf16WeightsIsHeldToTheBf16ProfileWhichStillCatchesBugs) {
  TempDir dir;
  const CommandResult pass =
      RunKvdiff("check --cases 100 --backends 'impl,llama.cpp?weights=bf16'", dir.path());
  EXPECT_EQ(pass.exit_code, 0) << pass.out << pass.err;
  EXPECT_THAT(pass.out, HasSubstr("tolerance profile compute bf16 (max |a-b| <= 1.5e+00, KL <= "
                                  "4.0e-02 per row; against its own uncached forward max |a-b| "
                                  "<= 1.2e-01) for llama.cpp?weights=bf16"));
  const size_t d = pass.out.find("distribution impl~llama.cpp?weights=bf16: argmax agrees on ");
  ASSERT_NE(d, std::string::npos) << pass.out;
  std::cout << "figure: " << pass.out.substr(d, pass.out.find('\n', d) - d) << "\n";
  const CommandResult flat = RunKvdiff(
      "check --cases 20 --backends 'impl,llama.cpp?weights=bf16' --tolerance 1e-4", dir.path());
  EXPECT_EQ(flat.exit_code, 1) << "bf16 products meet the flat gate: the profile is not needed";
  const CommandResult bug = RunKvdiff(
      "check --cases 100 --backends 'impl,llama.cpp?weights=bf16&fault=batch-rows-swapped'",
      dir.path());
  EXPECT_EQ(bug.exit_code, 1) << bug.out << bug.err;
  EXPECT_THAT(bug.out, HasSubstr("tolerance profile compute bf16"));
  const CommandResult f32 =
      RunKvdiff("check --cases 5 --backends 'impl,llama.cpp?weights=f32'", dir.path());
  EXPECT_EQ(f32.exit_code, 0) << f32.out << f32.err;
  EXPECT_THAT(f32.out, Not(HasSubstr("tolerance profile compute")));
  // A key given twice is refused: the engine and the profile could each have taken another one.
  const CommandResult twice =
      RunKvdiff("check --cases 5 --backends 'impl,llama.cpp?weights=bf16&weights=f32'", dir.path());
  EXPECT_EQ(twice.exit_code, 2) << twice.out << twice.err;
  EXPECT_THAT(twice.err, HasSubstr("option \"weights\" is given twice"));
}
#endif

}  // namespace
}  // namespace kvdiff::testing
