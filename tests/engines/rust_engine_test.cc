// The Rust example engine (engines/rust_example: the source document's candle port, in Rust):
// `kvdiff conform` and `kvdiff check` pass it; its two injected bugs, the document's own, are
// caught by both, with the document's symptoms (bug=pos0: silent and wrong from the second token
// of a decode; bug=reuse: `cannot broadcast [5, 5] to [1, 9, 5, 29]` for a 5-token prompt after
// 24 positions, a silent continuation for a one-token prompt); bad options and models it cannot
// read are bad input (exit 2) with a message saying what it expected.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <iostream>
#include <string>

#include "format/model_files.h"
#include "impl/model.h"
#include "plugin_host/plugin_loader.h"
#include "tests/engines/conformance.h"
#include "tests/test_support.h"

namespace kvdiff::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

const std::string kEngine = KVDIFF_RUST_EXAMPLE_ENGINE;

// The row of conform's table for one check: "  name   RESULT  detail".
std::string RowOf(const std::string& table, const std::string& check) {
  const size_t at = table.find("\n  " + check + " ");
  if (at == std::string::npos) return "";
  const size_t end = table.find('\n', at + 1);
  return table.substr(at + 1, end - at - 1);
}

// The line of `text` that starts with `prefix`, or "".
std::string LineStarting(const std::string& text, const std::string& prefix) {
  const size_t at = text.find("\n" + prefix);
  if (at == std::string::npos) return "";
  return text.substr(at + 1, text.find('\n', at + 1) - at - 1);
}

TEST(RustEngine, PassesEveryConformCheck) {
  TempDir dir;
  const CommandResult r = RunKvdiff(fmt::format("conform '{}' --cases 30", kEngine), dir.path());
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("(engine plugin rust_example 1.0, f32 cache, isolated)"));
  EXPECT_THAT(r.out, HasSubstr("PASS: 22 of 22 checks passed, 0 failed (against impl"));
  // ABI 3: its shift runs, rows after it held to the arbiter; bad shifts refused.
  EXPECT_THAT(RowOf(r.out, "shift"), HasSubstr("PASS   10 rows after a shift against "));
  EXPECT_THAT(RowOf(r.out, "shift-beyond"),
              HasSubstr("rust_example: shift(keep=7, discard=7): expected 0 <= keep"));
  // One item after another through the same forward: bit-identical to the items alone.
  EXPECT_THAT(RowOf(r.out, "batch"), HasSubstr("against the items alone max |a-b| 0.0e+00"));
  EXPECT_THAT(RowOf(r.out, "token-out-of-range"),
              HasSubstr("rust_example: token id -1 at index 0 is out of range for vocab_size"));
}

TEST(RustEngine, PassesACheckCampaignOnTheTinyPreset) {
  TempDir dir;
  const CommandResult r =
      RunKvdiff(fmt::format("check --backends 'impl,plugin:{}' --cases 40", kEngine), dir.path());
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, Not(HasSubstr("kvdiff-failures/")));
}

#ifdef KVDIFF_TEST_WITH_TORCH
// Three ways: the engine, impl and the LibTorch reference (transformers' semantics), every row of
// each held to the others at the default gate (ref's float32 RoPE under its measured profile).
TEST(RustEngine, PassesACheckCampaignAgainstImplAndTheReference) {
  TempDir dir;
  const CommandResult r = RunKvdiff(
      fmt::format("check --backends 'impl,ref,plugin:{}' --cases 40", kEngine), dir.path());
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("PASS: 40 of 40 cases run"));
}
#endif

TEST(RustEngine, PassesACheckCampaignOnStories260K) {
  KVDIFF_REQUIRE_SHARED_DATA(data);
  TempDir dir;
  const CommandResult convert = ConvertStories260K(data, dir.path(), "st");
  ASSERT_EQ(convert.exit_code, 0) << convert.err;
  const CommandResult r = RunKvdiff(
      fmt::format("check --model st --backends 'impl,plugin:{}' --cases 30", kEngine), dir.path());
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
}

// bug=pos0: index_pos 0 on every call. A first prompt is right; a decode step is silently wrong
// (RoPE at 0, keys of every cached position still read); a multi-token append on a non-empty
// cache trips candle's mask, sized for index_pos 0.
TEST(RustEngine, ForgettingThePositionIsCaughtByConformAndByCheck) {
  TempDir dir;
  const CommandResult r =
      RunKvdiff(fmt::format("conform '{}?bug=pos0' --cases 20", kEngine), dir.path());
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_THAT(RowOf(r.out, "prefill"), HasSubstr("PASS"));
  EXPECT_THAT(RowOf(r.out, "chunks"),
              HasSubstr("FAIL   chunk of 1: position 7 differs from impl's uncached forward"));
  EXPECT_THAT(RowOf(r.out, "truncate"), HasSubstr("rust_example: cannot broadcast [4, 4] to"));
  EXPECT_THAT(RowOf(r.out, "campaign"), HasSubstr("FAIL"));

  const CommandResult check = RunKvdiff(
      fmt::format("check --backends 'impl,plugin:{}?bug=pos0' --cases 20 --shrink 0", kEngine),
      dir.path());
  EXPECT_EQ(check.exit_code, 1) << check.out << check.err;
  EXPECT_THAT(check.out, HasSubstr("replay: kvdiff run kvdiff-failures/"));
}

// bug=reuse: one cache for every session, index_pos from 0 for each new conversation.
TEST(RustEngine, ReusingOneCacheIsCaughtByConformAndByCheck) {
  TempDir dir;
  const CommandResult r =
      RunKvdiff(fmt::format("conform '{}?bug=reuse' --cases 20", kEngine), dir.path());
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_THAT(RowOf(r.out, "prefill"), HasSubstr("PASS"));  // the engine's first conversation
  EXPECT_THAT(RowOf(r.out, "reset"), HasSubstr("FAIL   prefill of 10: rust_example: cannot "
                                               "broadcast [10, 10] to [1, 4, 10, "));
  EXPECT_THAT(RowOf(r.out, "campaign"), HasSubstr("FAIL"));

  const CommandResult check = RunKvdiff(
      fmt::format("check --backends 'impl,plugin:{}?bug=reuse' --cases 20 --shrink 0", kEngine),
      dir.path());
  EXPECT_EQ(check.exit_code, 1) << check.out << check.err;
  EXPECT_THAT(check.out, HasSubstr("replay: kvdiff run kvdiff-failures/"));
}

// bug=shift-not-rerotated (test-only): a shift moves the cached rows but leaves the keys rotated
// for their old positions. conform's shift check fails at the first row after the first shift, held
// to the arbiter (ref64 with LibTorch), and so does after-shift; nothing else does.
TEST(RustEngine, AShiftThatForgetsToRerotateIsCaughtByConform) {
  TempDir dir;
  const CommandResult r =
      RunKvdiff(fmt::format("conform '{}?bug=shift-not-rerotated' --cases 0", kEngine), dir.path());
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_THAT(RowOf(r.out, "shift"),
              HasSubstr("FAIL   main: +3 after shift(0, 5): position 15 differs from "));
  EXPECT_THAT(RowOf(r.out, "after-shift"), HasSubstr("FAIL"));
  EXPECT_THAT(r.out, HasSubstr("FAIL: 19 of 21 checks passed, 2 failed"));
}

// examples/scenarios/rust-reuse{,1}.json (docs/rust-engine.md runs them): the document's lengths
// and SmolLM2-135M's 9 query heads (3 KV heads) on a small model; a first conversation of 5 + 19
// positions, then a second one on a new session of the same engine.
const std::string kScenarios = KVDIFF_SOURCE_DIR "/examples/scenarios/";

TEST(RustEngine, AReusedCacheGivesTheDocumentsSymptoms) {
  TempDir dir;
  const std::string backends = fmt::format("--backends 'impl,plugin:{}?bug=reuse'", kEngine);
  const CommandResult five =
      RunKvdiff("run " + kScenarios + "rust-reuse.json " + backends, dir.path());
  EXPECT_EQ(five.exit_code, 1) << five.out << five.err;
  EXPECT_THAT(LineStarting(five.out, "error: step 3 prefill(second,n=5)"),
              HasSubstr("rust_example: cannot broadcast [5, 5] to [1, 9, 5, 29]"))
      << five.out;

  // One token: no error from the append, only logits that continue the first conversation.
  const CommandResult one =
      RunKvdiff("run " + kScenarios + "rust-reuse1.json " + backends, dir.path());
  EXPECT_EQ(one.exit_code, 1) << one.out << one.err;
  EXPECT_THAT(one.out, HasSubstr("first divergence: step 3 prefill(second,n=1): impl vs plugin:"));
  // The step's only error is kvdiff's uncached oracle, a new session on the same shared cache.
  EXPECT_THAT(LineStarting(one.out, "error: step 3 prefill(second,n=1)"),
              HasSubstr("the oracle ForwardFull failed"));

  // The checked session on the same scenario: a new cache per conversation, nothing to report.
  for (const char* scenario : {"rust-reuse.json", "rust-reuse1.json"}) {
    const CommandResult fixed = RunKvdiff(
        fmt::format("run {}{} --backends 'impl,plugin:{}'", kScenarios, scenario, kEngine),
        dir.path());
    EXPECT_EQ(fixed.exit_code, 0) << scenario << "\n" << fixed.out << fixed.err;
  }
}

// In process (no child between the test and the Rust code), through the loader: the seeded random
// walks of the C example's test, held to impl's uncached forward.
class RustEngineInProcess : public ::testing::Test {
 protected:
  void SetUp() override {
    format::SaveModel(dir_ / "tiny", format::MakeRandomModel(format::PresetConfig("tiny"), 3),
                      format::DType::kF32);
  }
  engines::Engine Open(const std::string& options) const {
    return engines::Plugin::Load(kEngine).Open(dir_ / "tiny", options);
  }
  TempDir dir_;
};

TEST_F(RustEngineInProcess, RandomWalkSeeds1To3Steps150MaxLength64MatchesImpl) {
  const impl::Model model = impl::Model::Load(dir_ / "tiny", 1);
  const engines::Engine engine = Open("max_length=64");
  for (uint64_t seed : {1, 2, 3}) {
    const float worst = engines::conformance::RandomWalkMaxDiff(engine, model, seed, 150, 64);
    std::cout << "figure: rust_example random walk seed " << seed << ": max|diff| " << worst
              << "\n";
    EXPECT_LE(worst, 1e-4f) << "seed " << seed;
  }
}

// A call that fails changes nothing, even the buggy one: under bug=reuse a second session's
// 3-token prompt fails on the first session's 5 positions, and the shared cache is rolled back,
// so the first session goes on exactly as a checked engine's would.
TEST_F(RustEngineInProcess, TheReuseErrorLeavesTheSharedCacheAsItWas) {
  const engines::Engine reuse = Open("bug=reuse");
  engines::Session first = reuse.NewSession();
  engines::Session second = reuse.NewSession();
  first.Append({5, 17, 3, 99, 42});
  try {
    second.Append({8, 17, 3});
    ADD_FAILURE() << "expected EngineError";
  } catch (const EngineError& e) {
    EXPECT_THAT(e.what(), HasSubstr("rust_example: cannot broadcast [3, 3] to [1, 4, 3, 8]"));
  }
  EXPECT_EQ(second.Length(), 0);
  engines::Session checked = Open("").NewSession();
  checked.Append({5, 17, 3, 99, 42});
  const Logits want = checked.Append({7});
  const Logits got = first.Append({7});
  EXPECT_EQ(MaxAbsDiff(got, want), 0.0f);
}

TEST(RustEngine, ABadOptionIsBadInputNamingWhatIsAccepted) {
  TempDir dir;
  const CommandResult r = RunKvdiff(fmt::format("conform '{}?kv=f16'", kEngine), dir.path());
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("unknown option 'kv' (the Rust example engine knows: "
                               "bug=none|pos0|reuse|shift-not-rerotated, max_length=N)"));
  const CommandResult bug =
      RunKvdiff(fmt::format("conform '{}?bug=sometimes'", kEngine), dir.path());
  EXPECT_EQ(bug.exit_code, 2) << bug.out << bug.err;
  EXPECT_THAT(bug.err, HasSubstr("option bug=sometimes: expected none, pos0, reuse or "
                                 "shift-not-rerotated"));
}

TEST(RustEngine, AModelItCannotReadIsBadInput) {
  TempDir dir;
  // kvdiff hands a plugin its model as float32 safetensors it writes itself, so through the CLI the
  // engine meets only what kvdiff reads: llama3 RoPE scaling, which this plain Llama refuses.
  WriteFile(dir / "scaled.json", R"({"hidden_size": 64, "intermediate_size": 96,
    "num_hidden_layers": 1, "num_attention_heads": 4, "vocab_size": 256,
    "max_position_embeddings": 128, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
    "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}})");
  ASSERT_EQ(RunKvdiff("make-model --config scaled.json --out scaled", dir.path()).exit_code, 0);
  const CommandResult r =
      RunKvdiff(fmt::format("conform '{}' --model scaled", kEngine), dir.path());
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("config.json: rope_scaling is not supported by the Rust example "
                               "engine (only null)"));

  // Malformed files, straight through the loader (kvdiff's own reader would refuse them first).
  const engines::Plugin plugin = engines::Plugin::Load(kEngine);
  format::SaveModel(dir / "bad", format::MakeRandomModel(format::PresetConfig("tiny"), 3),
                    format::DType::kF32);
  const std::string config = ReadFile(dir / "bad" / "config.json");
  const std::string weights = ReadFile(dir / "bad" / "model.safetensors");
  struct Case {
    const char* what;
    std::string config, weights, expected;
  };
  const Case cases[] = {
      {"no files", "", "", "cannot read"},
      {"truncated", config, weights.substr(0, 5000), "data_offsets"},
      {"short", config, weights.substr(0, 4), "4 bytes, too short for the 8-byte header length"},
      {"header length", config, std::string("\xff\xff\xff\xff\0\0\0\0{}", 10),
       "header length 4294967295 does not fit the file of 10 bytes"},
      {"header JSON", config, std::string("\x04\0\0\0\0\0\0\0{\"a\"", 12),
       "header: malformed JSON at byte 4: expected ':'"},
      {"config JSON", "{\"hidden_size\": 64,}", weights, "malformed JSON at byte 19"},
  };
  format::SaveModel(dir / "bf16", format::MakeRandomModel(format::PresetConfig("tiny"), 3),
                    format::DType::kBF16);
  try {
    plugin.Open(dir / "bf16");
    ADD_FAILURE() << "bf16: expected InputError";
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(), HasSubstr("is BF16; the Rust example engine reads F32 only"));
  }
  for (const Case& c : cases) {
    const std::filesystem::path model = dir / c.what;
    std::filesystem::create_directories(model);
    if (!c.config.empty()) WriteFile(model / "config.json", c.config);
    if (!c.weights.empty()) WriteFile(model / "model.safetensors", c.weights);
    try {
      plugin.Open(model);
      ADD_FAILURE() << c.what << ": expected InputError";
    } catch (const InputError& e) {
      EXPECT_THAT(e.what(), HasSubstr(c.expected)) << c.what;
    }
  }
}

}  // namespace
}  // namespace kvdiff::testing
