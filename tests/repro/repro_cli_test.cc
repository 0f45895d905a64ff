// `kvdiff repro` through the binary (exit codes 0/1/2, the table, --save), and the scenario files
// in examples/repro/ replayed by `kvdiff run` with the outcome their descriptions document.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>

#include "format/model_files.h"
#include "harness/scenario/scenario.h"
#include "tests/repro/repro_test_util.h"
#include "tests/test_support.h"

namespace kvdiff::testing {
namespace {

using ::testing::HasSubstr;

TEST(ReproCli, AllOnTinyBehavesAsDocumentedAndExitsZero) {
  TempDir dir;
  const auto r = RunKvdiff("repro all --preset tiny --seed 3 --threads 1", dir.path());
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("first prompt:            [5 17 3 99 42] (5 tokens)"));
  for (const char* name : {"ok", "pos0", "reuse", "reuse1", "fresh", "fresh1", "reference-reuse"}) {
    EXPECT_THAT(r.out, HasSubstr(std::string("\n") + name + " ")) << name;
  }
  EXPECT_THAT(r.out, HasSubstr("Error: cannot broadcast [5, 5] to [1, 4, 5, 29]"));
  EXPECT_THAT(r.out, HasSubstr("= fresh1"));
  EXPECT_THAT(r.out, ::testing::Not(HasSubstr(" NO\n")));
}

TEST(ReproCli, OneExperimentPrintsBothConversationsAndTheVerdict) {
  TempDir dir;
  const auto r = RunKvdiff("repro reuse1 --preset tiny --seed 3 -n 6 --threads 1", dir.path());
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("reuse1: the one-token second prompt reuses the first "
                               "conversation's cache at index_pos 0"));
  EXPECT_THAT(r.out, HasSubstr("  first   = ok"));
  EXPECT_THAT(r.out, HasSubstr("  second  departs from fresh1 at token"));
  EXPECT_THAT(r.out, HasSubstr("as documented:   yes"));
}

TEST(ReproCli, ExitsOneWhenAnExperimentDoesNotBehaveAsDocumented) {
  TempDir dir;
  format::SaveModel(dir / "blind", PositionBlindTiny(), format::DType::kF32);
  const auto r = RunKvdiff("repro pos0 --model blind --threads 1", dir.path());
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("observed:        no error; equal to ok"));
  EXPECT_THAT(r.out, HasSubstr("as documented:   NO"));
}

TEST(ReproCli, BadInputExitsTwoWithAMessage) {
  TempDir dir;
  const std::map<std::string, std::string> cases = {
      {"repro reuse2 --preset tiny", "experiment \"reuse2\": expected one of ok, pos0"},
      {"repro ok",
       "repro: give one of --model DIR, --llama2c FILE.bin or --preset NAME (with "
       "--seed), not neither"},
      {"repro ok --preset tiny --llama2c x.bin", "not several"},
      {"repro ok --llama2c missing.bin", "model.llama2c.checkpoint: missing.bin does not exist"},
      {"repro ok --preset tiny --prompt hello", "text prompts need a tokenizer"},
      {"repro ok --preset tiny --tokens 1,x",
       "--tokens: expected non-negative integers separated by commas or spaces, like 1,2,3; "
       "item 1 is \"x\""},
      {"repro ok --preset tiny --second-tokens 9", "the second prompt has 1 token"},
      {"repro ok --preset tiny -n 1", "-n: expected at least 2 generated tokens"},
      {"repro all --preset tiny --save x.json", "--save: writes one experiment's scenario"},
      {"repro ok --preset huge", "huge"},
  };
  for (const auto& [args, message] : cases) {
    const auto r = RunKvdiff(args, dir.path());
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.out << r.err;
    EXPECT_THAT(r.err, HasSubstr(message)) << args;
  }
}

TEST(ReproCli, SavedScenarioReplaysTheSameBug) {
  TempDir dir;
  auto r =
      RunKvdiff("repro reuse1 --preset tiny --seed 5 --save reuse1.json --threads 1", dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("wrote reuse1.json"));
  r = RunKvdiff("run reuse1.json --threads 1", dir.path());
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("first divergence: step 3 prefill(second,n=1)"));

  r = RunKvdiff("repro reuse --preset tiny --seed 5 -n 4 --save reuse.json --threads 1",
                dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  r = RunKvdiff("run reuse.json --threads 1", dir.path());
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  // 5 + 4 - 1 = 8 cached positions.
  EXPECT_THAT(r.out, HasSubstr("cannot broadcast [5, 5] to [1, 4, 5, 13]"));

  r = RunKvdiff("repro fresh1 --preset tiny --seed 5 --save fresh1.json --threads 1", dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  r = RunKvdiff("run fresh1.json --backends impl --threads 1", dir.path());
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
}

// The outcome each shipped preset file documents in its description.
struct Shipped {
  int exit_code;
  std::string output;  // a line `kvdiff run` must print
  bool needs_torch = false;
  bool slow = false;
};
const std::map<std::string, Shipped>& ShippedPresetFiles() {
  static const std::map<std::string, Shipped> files = {
      {"fresh-tiny.json", {0, "PASS: 0 of 5 steps failed"}},
      {"fresh1-tiny.json", {0, "PASS: 0 of 5 steps failed"}},
      {"pos0-tiny.json",
       {1, "first divergence: step 1 decode(main,n=19): impl vs impl ForwardFull"}},
      {"reuse-tiny.json",
       {1, "error: step 3 prefill(second,n=5) on impl: cannot broadcast [5, 5] to [1, 4, 5, 29]"}},
      {"reuse1-tiny.json", {1, "first divergence: step 3 prefill(second,n=1): impl vs impl"}},
      {"reference-reuse-tiny.json",
       {1, "first divergence: step 3 prefill(second,n=5): ref vs ref ForwardFull", true}},
      {"reuse-smollm2.json",
       {1, "error: step 3 prefill(second,n=5) on impl: cannot broadcast [5, 5] to [1, 9, 5, 29]",
        false, true}},
  };
  return files;
}

TEST(ReproFiles, EveryShippedFileHasADocumentedOutcomeHere) {
  const std::filesystem::path folder = KVDIFF_SOURCE_DIR "/examples/repro";
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator(folder)) {
    const std::string name = entry.path().filename().string();
    if (entry.path().extension() != ".json") continue;
    ++count;
    const bool stories = name.find("-stories.json") != std::string::npos;
    EXPECT_TRUE(stories || ShippedPresetFiles().count(name))
        << name << ": add its documented outcome to ShippedPresetFiles()";
  }
  EXPECT_GE(count, 10);
}

// The stories files read stories260K where the golden stories sets do: the shared data beside the
// repository, named relative to the file, so they run in a checkout and in CI with no conversion.
TEST(ReproFiles, StoriesFilesNameTheSharedCheckpointAsTheGoldenSetsDo) {
  const std::filesystem::path root = KVDIFF_SOURCE_DIR;
  const nlohmann::json golden_model =
      nlohmann::json::parse(ReadFile(root / "golden" / "stories260K" / "greedy_bos.json"))
          .at("model");
  const nlohmann::json expected = {
      {"llama2c",
       {{"checkpoint", "../../../shared/data/stories260K/stories260K.bin"},
        {"tokenizer", "../../../shared/data/stories260K/tok512.bin"}}}};
  EXPECT_EQ(golden_model, expected);
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator(root / "examples" / "repro")) {
    const std::string name = entry.path().filename().string();
    if (name.find("-stories.json") == std::string::npos) continue;
    ++count;
    const nlohmann::json j = nlohmann::json::parse(ReadFile(entry.path()));
    EXPECT_EQ(j.at("model"), expected) << name;
    // Both folders are two levels below the root: the same relative path names the same file.
    const harness::Scenario sc = harness::LoadScenario(entry.path());
    ASSERT_TRUE(sc.model.llama2c) << name;
    EXPECT_EQ(std::filesystem::weakly_canonical(sc.model.llama2c->checkpoint),
              std::filesystem::weakly_canonical(root / ".." / "shared" / "data" / "stories260K" /
                                                "stories260K.bin"))
        << name;
  }
  EXPECT_EQ(count, 5);
}

TEST(ReproFiles, PresetFilesReplayWithTheirDocumentedOutcome) {
  TempDir dir;
  for (const auto& [name, expect] : ShippedPresetFiles()) {
    if (expect.slow) continue;  // repro_smollm2_test
#ifndef KVDIFF_HAVE_TORCH
    if (expect.needs_torch) continue;
#endif
    const auto r =
        RunKvdiff("run " KVDIFF_SOURCE_DIR "/examples/repro/" + name + " --threads 1", dir.path());
    EXPECT_EQ(r.exit_code, expect.exit_code) << name << "\n" << r.out << r.err;
    EXPECT_THAT(r.out, HasSubstr(expect.output)) << name;
  }
}

}  // namespace
}  // namespace kvdiff::testing
