// kvdiff run and kvdiff check through the binary: exit codes 0/1/2 and the reports on disk.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "harness/backend/registry.h"
#include "harness/campaign/case_generator.h"
#include "harness/compare/tolerance_profile.h"
#include "tests/harness/harness_test_util.h"
#include "tests/test_support.h"

namespace kvdiff::testing {
namespace {

using ::testing::HasSubstr;

std::string Steps5Then10(const std::string& driver) {
  return R"({"model": {"preset": "tiny", "seed": 3}, "driver": ")" + driver + R"(",
    "backends": ["impl"],
    "steps": [{"op": "prefill", "tokens": [5, 17, 3, 99, 42]}, {"op": "decode", "n": 10}]})";
}

TEST(RunCli, PassingScenarioExitsZeroAndWritesReports) {
  TempDir dir;
  WriteFile(dir / "ok.json", Steps5Then10("session"));
  const auto r = RunKvdiff("run ok.json --threads 1 --json out.json --junit out.xml", dir.path());
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("PASS"));
  EXPECT_THAT(r.out, HasSubstr("decode(main,n=10)"));
  EXPECT_EQ(r.out.find('\033'), std::string::npos) << "no colour when stdout is not a terminal";
  const auto j = nlohmann::json::parse(ReadFile(dir / "out.json"));
  EXPECT_EQ(j.at("passed"), true);
  EXPECT_EQ(j.at("first_divergence"), nullptr);
  EXPECT_EQ(j.at("scenario"), "ok");
  const std::string xml = ReadFile(dir / "out.xml");
  EXPECT_EQ(XmlProblem(xml, nullptr), "") << xml;
  EXPECT_EQ(XmlAttribute(xml, "testsuite", "failures"), "0");
}

TEST(RunCli, Pos0ExitsOneAtTheFirstDecodeStep) {
  TempDir dir;
  WriteFile(dir / "pos0.json", Steps5Then10("pos0"));
  const auto r = RunKvdiff("run pos0.json --threads 1 --json out.json --localize", dir.path());
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("first divergence: step 1 decode(main,n=10)"));
  EXPECT_THAT(r.out, HasSubstr("localized: first beyond tolerance at layer 0 attention"));
  const auto j = nlohmann::json::parse(ReadFile(dir / "out.json"));
  EXPECT_EQ(j.at("first_divergence").at("step"), 1);
  EXPECT_EQ(j.at("first_divergence").at("row"), 0);
  EXPECT_EQ(j.at("first_divergence").at("position"), 5);
  EXPECT_EQ(j.at("localization").at("layer"), 0);
  // The layer x position map: the decode step's 10 rows, the start at the divergent position.
  const auto& map = j.at("localization").at("map");
  EXPECT_EQ(map.at("columns").size(), 10u);
  EXPECT_EQ(map.at("attention_max_abs_diff").size(),
            j.at("model").at("config").at("num_hidden_layers"));
  EXPECT_EQ(map.at("attention_max_abs_diff").at(0).size(), 10u);
  EXPECT_EQ(map.at("first_cell").at("layer"), 0);
  EXPECT_EQ(map.at("first_cell").at("block"), "attention");
  EXPECT_EQ(map.at("first_cell").at("position"), 5);
}

TEST(RunCli, ShippedScenariosBehaveAsTheirDescriptionsSay) {
  TempDir dir;
  const std::string s = KVDIFF_SOURCE_DIR "/examples/scenarios/";
  EXPECT_EQ(
      RunKvdiff("run " + s + "example.json --backends impl --threads 1", dir.path()).exit_code, 0);
  EXPECT_EQ(RunKvdiff("run " + s + "pos0.json --threads 1", dir.path()).exit_code, 1);
  const auto reuse = RunKvdiff("run " + s + "reuse.json --backends impl --threads 1", dir.path());
  EXPECT_EQ(reuse.exit_code, 1);
  EXPECT_THAT(reuse.out, HasSubstr("cannot broadcast [5, 5] to [1, "));
  const auto reuse1 = RunKvdiff("run " + s + "reuse1.json --backends impl --threads 1", dir.path());
  EXPECT_EQ(reuse1.exit_code, 1);
  EXPECT_THAT(reuse1.out, HasSubstr("first divergence: step 3 prefill(second,n=1)"));
  EXPECT_EQ(reuse1.out.find("error:"), std::string::npos) << "reuse1 is silent: no error";
  // shift.json names ref and ref64; without LibTorch it is refused (exit 2) for them.
  const auto shift = RunKvdiff("run " + s + "shift.json --threads 1", dir.path());
  EXPECT_EQ(shift.exit_code, harness::BackendRegistry::Global().Has("ref64") ? 0 : 2) << shift.out;
  // window.json (a ring wrapped by chunks longer than the window, a fork, a truncate back one)
  // names ref and ref64 too; impl alone passes it, and a window fault of impl fails it.
  const auto window = RunKvdiff("run " + s + "window.json --threads 1", dir.path());
  EXPECT_EQ(window.exit_code, harness::BackendRegistry::Global().Has("ref64") ? 0 : 2)
      << window.out;
  EXPECT_EQ(RunKvdiff("run " + s + "window.json --backends impl --threads 1", dir.path()).exit_code,
            0);
  EXPECT_EQ(
      RunKvdiff("run " + s + "window.json --backends 'impl?fault=window-minus-one' --threads 1",
                dir.path())
          .exit_code,
      1);
}

TEST(RunCli, SessionDriverOnThePos0StepsExitsZero) {
  TempDir dir;
  WriteFile(dir / "s.json", Steps5Then10("session"));
  EXPECT_EQ(RunKvdiff("run s.json --threads 1", dir.path()).exit_code, 0);
}

TEST(RunCli, BadInputExitsTwoWithTheStepAndField) {
  TempDir dir;
  WriteFile(dir / "bad.json", R"({"model": {"preset": "tiny", "seed": 3},
    "steps": [{"op": "prefill", "tokens": [5, 17, 3, 99, 42], "chunks": [3, 1]}]})");
  const auto r = RunKvdiff("run bad.json", dir.path());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("steps[0].chunks: sizes sum to 4 but tokens has 5"));
  EXPECT_THAT(r.err, HasSubstr("bad.json"));
  EXPECT_EQ(RunKvdiff("run missing.json", dir.path()).exit_code, 2);
  EXPECT_EQ(RunKvdiff("run", dir.path()).exit_code, 2);
  EXPECT_EQ(RunKvdiff("run bad.json --backends impl,gpu", dir.path()).exit_code, 2);
  WriteFile(dir / "pos0ref.json", R"({"model": {"preset": "tiny", "seed": 3}, "driver": "pos0",
    "backends": ["impl", "ref"], "steps": [{"op": "prefill", "tokens": [1]}]})");
  const auto p = RunKvdiff("run pos0ref.json", dir.path());
  EXPECT_EQ(p.exit_code, 2);
  // Refused either way: by the driver with LibTorch, for the missing reference without it.
  EXPECT_THAT(p.err, HasSubstr(harness::BackendRegistry::Global().Has("ref")
                                   ? "driver \"pos0\" does not apply to backend \"ref\""
                                   : "backend 'ref' needs a build with LibTorch"));
  WriteFile(dir / "vocab.json", R"({"model": {"preset": "tiny", "seed": 3},
    "steps": [{"op": "prefill", "tokens": [1, 100000]}]})");
  const auto v = RunKvdiff("run vocab.json", dir.path());
  EXPECT_EQ(v.exit_code, 2);
  EXPECT_THAT(v.err, HasSubstr("steps[0].tokens[1]: token id 100000 is outside the vocabulary"));
}

TEST(RunCli, ModelDirectoryOnTheCommandLineOverridesTheScenario) {
  TempDir dir;
  const auto made = RunKvdiff("make-model --preset tiny --seed 3 --out model", dir.path());
  ASSERT_EQ(made.exit_code, 0) << made.err;
  WriteFile(dir / "ok.json", Steps5Then10("session"));
  const auto r = RunKvdiff("run ok.json --threads 1 --model model --json out.json", dir.path());
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(
      nlohmann::json::parse(ReadFile(dir / "out.json")).at("model").at("source").get<std::string>(),
      HasSubstr("path model"));
  // A relative path in the file is resolved against the file's folder, not the working folder.
  std::filesystem::create_directories(dir / "sub");
  WriteFile(dir / "sub" / "rel.json", R"({"model": {"path": "../model"}, "backends": ["impl"],
    "steps": [{"op": "prefill", "tokens": [1, 2]}]})");
  EXPECT_EQ(RunKvdiff("run sub/rel.json --threads 1", dir.path()).exit_code, 0);
}

TEST(RunCli, TextPromptsNeedATokenizer) {
  TempDir dir;
  WriteFile(dir / "t.json", R"({"model": {"preset": "tiny", "seed": 3},
    "steps": [{"op": "prefill", "text": "Once upon a time"}]})");
  const auto r = RunKvdiff("run t.json", dir.path());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("steps[0].text: text prompts need a tokenizer"));
}

TEST(RunCli, TextPromptsOnAConvertedLlama2cModel) {
  KVDIFF_REQUIRE_SHARED_DATA(data);
  TempDir dir;
  const auto conv = ConvertStories260K(data, dir.path(), "stories");
  ASSERT_EQ(conv.exit_code, 0) << conv.err;
  WriteFile(dir / "t.json", R"({"model": {"path": "stories"}, "backends": ["impl"],
    "steps": [{"op": "prefill", "text": "Once upon a time", "chunks": [2, 3]},
              {"op": "decode", "n": 8}, {"op": "prefill", "text": " there was"}]})");
  const auto r = RunKvdiff("run t.json --threads 1 --json out.json", dir.path());
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto j = nlohmann::json::parse(ReadFile(dir / "out.json"));
  const auto& rows = j.at("steps")[0].at("outcomes")[0].at("rows");
  ASSERT_EQ(rows.size(), 5u) << "BOS + 4 pieces, split 2 + 3";
  EXPECT_EQ(rows[0].at("token"), 1) << "a prompt on an empty conversation starts with BOS";
  EXPECT_NE(j.at("steps")[2].at("outcomes")[0].at("rows")[0].at("token"), 1)
      << "text continuing a conversation gets no BOS";
  // Chunks are checked against the token count after encoding.
  WriteFile(dir / "bad.json", R"({"model": {"path": "stories"},
    "steps": [{"op": "prefill", "text": "Once upon a time", "chunks": [2, 2]}]})");
  const auto bad = RunKvdiff("run bad.json", dir.path());
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("steps[0].chunks: sizes sum to 4 but the text has 5 tokens"));
}

// The llama2c model kind: the golden stories scenarios (which name the shared checkpoint) run
// through `kvdiff run` as they stand.
TEST(RunCli, RunsTheGoldenStoriesScenariosOnTheirLlama2cCheckpoint) {
  KVDIFF_REQUIRE_SHARED_DATA(data);
  if (!std::filesystem::exists(KVDIFF_SOURCE_DIR "/../shared/data/stories260K/stories260K.bin")) {
    GTEST_SKIP() << "golden/stories260K reads " KVDIFF_SOURCE_DIR
                    "/../shared/data/stories260K/, which is absent";
  }
  TempDir dir;
  for (const char* name : {"greedy_bos", "text_prompt"}) {
    const auto r = RunKvdiff(std::string("run " KVDIFF_SOURCE_DIR "/golden/stories260K/") + name +
                                 ".json --backends impl --threads 1 --json out.json",
                             dir.path());
    EXPECT_EQ(r.exit_code, 0) << name << "\n" << r.out << r.err;
    EXPECT_THAT(r.out, HasSubstr("model: llama2c ")) << name;
    EXPECT_THAT(r.out, HasSubstr("vocab 512")) << name;
    const auto j = nlohmann::json::parse(ReadFile(dir / "out.json"));
    EXPECT_GT(j.at("rows_compared").get<int64_t>(), 10) << name;
  }
}

TEST(RunCli, Llama2cModelWithAMissingCheckpointExitsTwoNamingIt) {
  TempDir dir;
  WriteFile(dir / "t.json", R"({"model": {"llama2c": {"checkpoint": "data/none.bin"}},
    "steps": [{"op": "prefill", "tokens": [1, 2]}]})");
  const auto r = RunKvdiff("run t.json", dir.path());
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  // The scenario is in the working folder, so the path is reported as written.
  EXPECT_THAT(r.err, HasSubstr("model.llama2c.checkpoint: data/none.bin does not exist"));
  // An unknown field inside the kind is named with its place, as for the other kinds.
  WriteFile(dir / "u.json", R"({"model": {"llama2c": {"checkpoint": "x.bin", "tok": "t.bin"}},
    "steps": [{"op": "prefill", "tokens": [1, 2]}]})");
  const auto u = RunKvdiff("run u.json", dir.path());
  EXPECT_EQ(u.exit_code, 2);
  EXPECT_THAT(u.err, HasSubstr("u.json: model.llama2c: unknown field \"tok\""));
}

TEST(CheckCli, SmallCampaignPassesAndReportsItsCases) {
  TempDir dir;
  const auto r =
      RunKvdiff("check --cases 40 --seed 3 --threads 1 --json c.json --junit c.xml", dir.path());
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("PASS: 40 of 40 cases run"));
  EXPECT_THAT(r.out, HasSubstr("coverage: 40 cases"));
  EXPECT_THAT(r.out, HasSubstr("  boundaries (calls of b-1..b tokens"));
  const auto j = nlohmann::json::parse(ReadFile(dir / "c.json"));
  EXPECT_EQ(j.at("case_indices").size(), 40u);
  EXPECT_EQ(j.at("coverage").at("cases"), 40);
  EXPECT_EQ(j.at("coverage").at("context"), 512);  // the tiny preset's whole context
  EXPECT_GT(j.at("rows_compared").get<int64_t>(), 40);
  // impl~ref at the last position is held to the rope-f32 profile's gate there.
  EXPECT_LE(j.at("worst_diff").get<double>(), 1e-4 + harness::RopeF32Profile().per_position * 511);
  const std::string xml = ReadFile(dir / "c.xml");
  EXPECT_EQ(XmlProblem(xml, nullptr), "");
  EXPECT_EQ(XmlAttribute(xml, "testsuite", "tests"), "40");
  EXPECT_FALSE(std::filesystem::exists(dir / "kvdiff-failures"))
      << "nothing failed, nothing written";
}

TEST(CheckCli, FailingCaseIsWrittenAsAReplayableScenario) {
  // A tolerance of 0 makes a case fail on ordinary float rounding (cached and uncached sums run
  // in different orders), which is exactly what we need to see the failure path end to end.
  TempDir dir;
  const auto r = RunKvdiff(
      "check --cases 30 --seed 1 --threads 1 --backends impl --out-dir fails "
      "--json c.json --tolerance 0",
      dir.path());
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("replay: kvdiff run "));
  const auto j = nlohmann::json::parse(ReadFile(dir / "c.json"));
  std::string file;
  for (const auto& c : j.at("results"))
    if (!c.at("passed").get<bool>()) {
      file = c.at("scenario_file");
      break;
    }
  ASSERT_FALSE(file.empty());
  const auto replay = RunKvdiff("run " + file + " --threads 1", dir.path());
  EXPECT_EQ(replay.exit_code, 1) << replay.out << replay.err;
}

// --shift-percent 0 draws no shift episode, and the coverage says why there is none; the other
// steps are the ones a campaign on backends that cannot shift draws (the episodes have their own
// random stream), so the case count and the ops apart from shifts stay comparable.
TEST(CheckCli, ShiftPercentZeroDrawsNoShiftAndSaysSo) {
  TempDir dir;
  const std::string campaign = "check --cases 20 --seed 3 --backends impl --demanding-fraction 0 ";
  const auto with = RunKvdiff(campaign + "--json a.json", dir.path());
  ASSERT_EQ(with.exit_code, 0) << with.out << with.err;
  const auto a = nlohmann::json::parse(ReadFile(dir / "a.json"));
  EXPECT_GT(a.at("coverage").at("ops").value("shift", 0), 0) << "impl shifts: the default draws";
  EXPECT_EQ(a.at("coverage").at("shift_limit"), "");
  EXPECT_EQ(a.at("generation").at("shift_percent"), harness::kDefaultShiftPercent);

  const auto without = RunKvdiff(campaign + "--shift-percent 0 --json b.json", dir.path());
  ASSERT_EQ(without.exit_code, 0) << without.out << without.err;
  EXPECT_THAT(without.out, HasSubstr("  shifts:        none drawn: --shift-percent 0\n"));
  const auto b = nlohmann::json::parse(ReadFile(dir / "b.json"));
  EXPECT_EQ(b.at("coverage").at("ops").value("shift", 0), 0);
  EXPECT_EQ(b.at("coverage").at("shift_limit"), "none drawn: --shift-percent 0");
  EXPECT_EQ(b.at("generation").at("shift_percent"), 0);

  const auto bad = RunKvdiff("check --cases 1 --shift-percent 101", dir.path());
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("--shift-percent"));
}

TEST(CheckCli, UsageErrorsExitTwo) {
  TempDir dir;
  EXPECT_EQ(RunKvdiff("check", dir.path()).exit_code, 2) << "--cases is required";
  const auto shard = RunKvdiff("check --cases 4 --shard 5/4", dir.path());
  EXPECT_EQ(shard.exit_code, 2);
  EXPECT_THAT(shard.err, HasSubstr("--shard"));
  EXPECT_EQ(RunKvdiff("check --cases 4 --preset huge", dir.path()).exit_code, 2);
  const auto fraction = RunKvdiff("check --cases 4 --long-fraction 1.5", dir.path());
  EXPECT_EQ(fraction.exit_code, 2);
  EXPECT_THAT(fraction.err, HasSubstr("--long-fraction"));
  EXPECT_EQ(RunKvdiff("check --cases 4 --max-length -3", dir.path()).exit_code, 2);
  EXPECT_EQ(RunKvdiff("check --cases 4 --model m --preset tiny", dir.path()).exit_code, 2);
}

}  // namespace
}  // namespace kvdiff::testing
