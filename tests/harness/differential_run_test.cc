// The differential run on the tiny model (impl backend, in process): the session driver agrees with
// the oracle, the misuse drivers diverge exactly where the seed says, errors are outcomes, and the
// JSON / JUnit / terminal reports carry it all.
#include "harness/run/differential_run.h"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>

#include "format/error.h"
#include "format/llama2c.h"
#include "format/machine_memory.h"
#include "harness/backend/backend.h"
#include "harness/backend/registry.h"
#include "harness/replay/drivers.h"
#include "harness/report/run_report.h"
#include "harness/scenario/scenario.h"
#include "tests/harness/harness_test_util.h"
#include "tests/harness/wrapped_backend.h"
#include "tests/test_support.h"

namespace kvdiff::harness {
namespace {

using ::testing::HasSubstr;

class RunnerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const ModelSpec spec = testing::TinyModel(3);
    weights_ = new std::shared_ptr<const format::ModelWeights>(LoadModelFor(spec));
    impl_ = MakeBackend("impl", *weights_, 1).release();
  }
  static void TearDownTestSuite() {
    delete impl_;
    delete weights_;
  }

  RunReport Run(const std::string& json, bool localize = false) {
    Scenario sc = ParseScenario(json);
    sc.name = "test";
    PrepareScenario(sc, **weights_);
    RunOptions options;
    options.localize = localize;
    return RunScenario(sc, {impl_}, options);
  }

  static std::shared_ptr<const format::ModelWeights>* weights_;
  static Backend* impl_;
};
std::shared_ptr<const format::ModelWeights>* RunnerTest::weights_ = nullptr;
Backend* RunnerTest::impl_ = nullptr;

std::string Scenario5Then10(const std::string& driver) {
  return R"({"model": {"preset": "tiny", "seed": 3}, "driver": ")" + driver + R"(",
    "steps": [{"op": "prefill", "tokens": [5, 17, 3, 99, 42]}, {"op": "decode", "n": 10}]})";
}

TEST_F(RunnerTest, SessionDriverAgreesWithTheOracleOnEveryRow) {
  const RunReport r = Run(R"({"model": {"preset": "tiny", "seed": 3},
    "steps": [{"op": "prefill", "tokens": [5, 17, 3, 99, 42], "chunks": [3, 2]},
              {"op": "decode", "n": 10},
              {"op": "fork", "from": "main", "to": "f"},
              {"op": "truncate", "conversation": "f", "length": 7},
              {"op": "prefill", "conversation": "f", "tokens": [1, 2, 3], "chunks": [1, 1, 1]},
              {"op": "decode", "conversation": "f", "n": 3},
              {"op": "reset"},
              {"op": "prefill", "tokens": [9]},
              {"op": "new_conversation", "name": "second"},
              {"op": "prefill", "conversation": "second", "tokens": [7]}]})");
  EXPECT_TRUE(r.Passed());
  EXPECT_EQ(r.ExitCode(), 0);
  EXPECT_EQ(r.rows_compared, 5 + 10 + 3 + 3 + 1 + 1);
  EXPECT_LE(r.worst_diff, 1e-4);
  ASSERT_EQ(r.steps.size(), 10u);
  EXPECT_EQ(r.steps[0].outcomes[0].status, PathStatus::kPass);
  EXPECT_EQ(r.steps[0].outcomes[0].rows.size(), 5u);
  EXPECT_EQ(r.steps[2].outcomes[0].status, PathStatus::kNoRows);
  // Positions follow each conversation's own history.
  EXPECT_EQ(r.steps[4].outcomes[0].rows[0].position, 7);
  EXPECT_EQ(r.steps[7].outcomes[0].rows[0].position, 0);
  // The decode rows' inputs are the argmaxes of the rows before them.
  const auto& decode = r.steps[1].outcomes[0].rows;
  for (size_t k = 1; k < decode.size(); ++k) EXPECT_EQ(decode[k].token, decode[k - 1].cmp.argmax_a);
  EXPECT_EQ(decode[0].token, r.steps[0].outcomes[0].rows[4].cmp.argmax_a);
}

TEST_F(RunnerTest, Pos0DivergesAtTheRowThatChoosesTheSecondGeneratedToken) {
  const RunReport r = Run(Scenario5Then10("pos0"), /*localize=*/true);
  EXPECT_FALSE(r.Passed());
  EXPECT_EQ(r.ExitCode(), 1);
  EXPECT_EQ(r.steps[0].outcomes[0].status, PathStatus::kPass)
      << "index_pos 0 is right for the prompt";
  ASSERT_TRUE(r.first_divergence.has_value());
  const Divergence& d = *r.first_divergence;
  EXPECT_EQ(d.step, 1);
  EXPECT_EQ(d.row.row, 0);
  EXPECT_EQ(d.row.position, 5);
  EXPECT_EQ(d.kind, PathKind::kOracle);
  // Its input is the first generated token (the prompt's last row's argmax), and the row picks
  // the second.
  EXPECT_EQ(d.row.token, r.steps[0].outcomes[0].rows[4].cmp.argmax_a);
  EXPECT_GT(d.row.cmp.max_abs_diff, 1e-2) << "a wrong position moves logits far beyond 1e-4";
  ASSERT_TRUE(r.localization.has_value());
  EXPECT_TRUE(r.localization->found);
  EXPECT_EQ(r.localization->layer, 0);
  EXPECT_EQ(r.localization->block, "attention") << "RoPE at the wrong position: attention first";
  EXPECT_EQ(r.localization->attention_diffs.size(),
            static_cast<size_t>((*weights_)->config.num_hidden_layers));
}

// The layer x position map on a fault that starts at a known cell: under pos0 a prompt fed in
// chunks 3, 1, 1 gets its first chunk right (index_pos 0 is its position) and its second at
// position 0 instead of 3, so RoPE is wrong from row 3 on: the map must be within the tolerance at
// rows 0-2 in every layer and block, and beyond it first at layer 0 attention, position 3.
TEST_F(RunnerTest, LocalizationMapStartsWhereThePositionFirstGoesWrong) {
  const RunReport r = Run(R"({"model": {"preset": "tiny", "seed": 3}, "driver": "pos0",
    "steps": [{"op": "prefill", "tokens": [5, 17, 3, 99, 42], "chunks": [3, 1, 1]}]})",
                          /*localize=*/true);
  ASSERT_TRUE(r.first_divergence.has_value());
  EXPECT_EQ(r.first_divergence->row.position, 3);
  ASSERT_TRUE(r.localization.has_value());
  const Localization& loc = *r.localization;
  const auto layers = static_cast<size_t>((*weights_)->config.num_hidden_layers);
  ASSERT_EQ(loc.columns.size(), 5u) << "one column per row of the step, from all three calls";
  for (size_t c = 0; c < loc.columns.size(); ++c) {
    EXPECT_EQ(loc.columns[c].position, static_cast<int64_t>(c));
    EXPECT_EQ(loc.columns[c].row, static_cast<int64_t>(c));
  }
  EXPECT_EQ(loc.divergent_column, 3u);
  ASSERT_EQ(loc.attention_map.size(), layers);
  ASSERT_EQ(loc.mlp_map.size(), layers);
  for (size_t l = 0; l < layers; ++l) {
    ASSERT_EQ(loc.attention_map[l].size(), 5u);
    ASSERT_EQ(loc.mlp_map[l].size(), 5u);
    for (size_t c = 0; c < 3; ++c) {
      EXPECT_LE(loc.attention_map[l][c], r.gate.abs) << "layer " << l << ", position " << c;
      EXPECT_LE(loc.mlp_map[l][c], r.gate.abs) << "layer " << l << ", position " << c;
    }
    for (size_t c = 3; c < 5; ++c) {
      EXPECT_GT(loc.attention_map[l][c], 1e-2) << "layer " << l << ", position " << c;
    }
    // The per-layer figures at the divergent row are the map's column.
    EXPECT_EQ(loc.attention_diffs[l], loc.attention_map[l][3]);
    EXPECT_EQ(loc.mlp_diffs[l], loc.mlp_map[l][3]);
  }
  ASSERT_TRUE(loc.first_cell.has_value());
  EXPECT_EQ(loc.first_cell->layer, 0);
  EXPECT_EQ(loc.first_cell->block, "attention");
  EXPECT_EQ(loc.first_cell->column, 3u);
  EXPECT_TRUE(loc.found);
  EXPECT_EQ(loc.layer, 0);
  EXPECT_EQ(loc.block, "attention");
}

// A decode step makes one call per token: the map has a column for each of them.
TEST_F(RunnerTest, LocalizationMapOfADecodeStepCoversEveryGeneratedRow) {
  const RunReport r = Run(Scenario5Then10("pos0"), /*localize=*/true);
  ASSERT_TRUE(r.localization.has_value());
  const Localization& loc = *r.localization;
  ASSERT_EQ(loc.columns.size(), 10u);
  EXPECT_EQ(loc.columns.front().position, 5);
  EXPECT_EQ(loc.columns.back().position, 14);
  EXPECT_EQ(loc.divergent_column, 0u);
  ASSERT_TRUE(loc.first_cell.has_value());
  EXPECT_EQ(loc.first_cell->layer, 0);
  EXPECT_EQ(loc.first_cell->block, "attention");
  EXPECT_EQ(loc.first_cell->column, 0u);
}

TEST_F(RunnerTest, SessionDriverOnTheSameStepsPasses) {
  EXPECT_TRUE(Run(Scenario5Then10("session")).Passed());
}

TEST_F(RunnerTest, ReuseWithAFiveTokenPromptThrowsAndTheRunGoesOn) {
  const auto nh = (*weights_)->config.num_attention_heads;
  const RunReport r = Run(R"({"model": {"preset": "tiny", "seed": 3}, "driver": "reuse",
    "steps": [{"op": "prefill", "tokens": [5, 17, 3, 99, 42]}, {"op": "decode", "n": 19},
              {"op": "new_conversation", "name": "second"},
              {"op": "prefill", "conversation": "second", "tokens": [8, 17, 3, 120, 42]},
              {"op": "decode", "conversation": "second", "n": 3},
              {"op": "new_conversation", "name": "third"},
              {"op": "prefill", "conversation": "third", "tokens": [4, 4]}]})");
  EXPECT_EQ(r.ExitCode(), 1);
  EXPECT_EQ(r.steps[1].outcomes[0].status, PathStatus::kPass);
  EXPECT_EQ(r.steps[3].outcomes[0].status, PathStatus::kError);
  EXPECT_EQ(r.steps[3].outcomes[0].message,
            "cannot broadcast [5, 5] to [1, " + std::to_string(nh) + ", 5, 29]");
  EXPECT_EQ(r.steps[4].outcomes[0].status, PathStatus::kSkipped);
  EXPECT_THAT(r.steps[4].outcomes[0].message,
              HasSubstr("conversation \"second\" failed at step 3"));
  EXPECT_NE(r.steps[6].outcomes[0].status, PathStatus::kSkipped) << "the next conversation runs";
  ASSERT_TRUE(r.first_error.has_value());
  EXPECT_EQ(r.first_error->step, 3);
  EXPECT_EQ(r.first_error->backend, "impl");
}

TEST_F(RunnerTest, ReuseWithAOneTokenPromptIsSilentAndWrong) {
  const RunReport r = Run(R"({"model": {"preset": "tiny", "seed": 3}, "driver": "reuse",
    "steps": [{"op": "prefill", "tokens": [5, 17, 3, 99, 42]}, {"op": "decode", "n": 19},
              {"op": "new_conversation", "name": "second"},
              {"op": "prefill", "conversation": "second", "tokens": [8]}]})");
  EXPECT_FALSE(r.first_error.has_value()) << "no error: the mask is skipped for one token";
  ASSERT_TRUE(r.first_divergence.has_value());
  EXPECT_EQ(r.first_divergence->step, 3);
  EXPECT_EQ(r.first_divergence->row.position, 0);
  EXPECT_EQ(r.first_divergence->row.conversation, "second");
}

TEST(PlanBackends, Pos0IsRefusedForANamedReferenceAndLeftOutOfTheDefault) {
  if (!BackendRegistry::Global().Has("ref")) {
    GTEST_SKIP() << "needs the LibTorch reference (this build has KVDIFF_WITH_TORCH=OFF)";
  }
  Scenario sc = ParseScenario(Scenario5Then10("pos0"));
  try {
    PlanBackends({"impl", "ref"}, sc, nullptr);
    ADD_FAILURE() << "pos0 on ref was accepted";
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(), HasSubstr("driver \"pos0\" does not apply to backend \"ref\""));
  }
  std::vector<std::string> notes;
  EXPECT_EQ(PlanBackends({}, sc, &notes), (std::vector<std::string>{"impl"}));
  EXPECT_EQ(notes.size(), DefaultBackends().size() - 1);
  sc.driver = DriverKind::kReuse;
  EXPECT_EQ(PlanBackends({"impl", "ref64"}, sc, nullptr),
            (std::vector<std::string>{"impl", "ref64"}));
}

TEST_F(RunnerTest, JsonReportReadsBack) {
  const RunReport r = Run(Scenario5Then10("pos0"));
  const auto j = nlohmann::json::parse(ReportToJson(r).dump(2));
  EXPECT_EQ(j.at("kvdiff_version"), KVDIFF_VERSION);
  EXPECT_EQ(j.at("passed"), false);
  EXPECT_EQ(j.at("exit_code"), 1);
  EXPECT_EQ(j.at("driver"), "pos0");
  EXPECT_DOUBLE_EQ(j.at("tolerance").at("abs").get<double>(), 1e-4);
  EXPECT_EQ(j.at("model").at("config").at("vocab_size"), (*weights_)->config.vocab_size);
  EXPECT_THAT(j.at("model").at("source").get<std::string>(), HasSubstr("tiny"));
  EXPECT_EQ(j.at("first_divergence").at("step"), 1);
  EXPECT_EQ(j.at("first_divergence").at("position"), 5);
  EXPECT_EQ(j.at("first_divergence").at("comparison").at("within_tolerance"), false);
  ASSERT_EQ(j.at("steps").size(), 2u);
  EXPECT_EQ(j.at("steps")[1].at("params"), "decode(main,n=10)");
  EXPECT_EQ(j.at("steps")[1].at("outcomes")[0].at("status"), "FAIL");
  EXPECT_EQ(j.at("steps")[1].at("outcomes")[0].at("rows").size(), 10u);
  EXPECT_EQ(j.at("rows_compared"), 15);
}

TEST_F(RunnerTest, JUnitIsWellFormedWithOneTestcasePerStep) {
  const RunReport r = Run(Scenario5Then10("pos0"));
  const std::string xml = ReportToJUnit(r);
  std::vector<std::string> names;
  EXPECT_EQ(testing::XmlProblem(xml, &names), "") << xml;
  EXPECT_EQ(std::count(names.begin(), names.end(), "testcase"), 2);
  EXPECT_EQ(std::count(names.begin(), names.end(), "failure"), 1);
  EXPECT_EQ(testing::XmlAttribute(xml, "testsuite", "tests"), "2");
  EXPECT_EQ(testing::XmlAttribute(xml, "testsuite", "failures"), "1");
  EXPECT_THAT(xml, HasSubstr("name=\"step 01 decode(main,n=10)\""));
}

TEST(XmlEscape, EscapesMarkupAndDropsWhatXmlCannotHold) {
  EXPECT_EQ(XmlEscape("a<b>&\"c'"), "a&lt;b&gt;&amp;&quot;c&apos;");
  EXPECT_EQ(XmlEscape(std::string("x\x01y\x7f", 4)), "x?y?");
  EXPECT_EQ(XmlEscape("line\nnext"), "line&#10;next");
  const std::string doc =
      "<r a=\"" + XmlEscape("<&\"\n\x02") + "\">" + XmlEscape("]]> & <") + "</r>";
  EXPECT_EQ(testing::XmlProblem(doc, nullptr), "");
  // The checker itself catches the mistakes it is there for.
  EXPECT_NE(testing::XmlProblem("<r>a & b</r>", nullptr), "");
  EXPECT_NE(testing::XmlProblem("<r><s></r></s>", nullptr), "");
  EXPECT_NE(testing::XmlProblem("<r a=x/>", nullptr), "");
}

TEST_F(RunnerTest, TerminalReportHasOneLinePerStepAndColourOnlyOnRequest) {
  const RunReport r = Run(Scenario5Then10("pos0"));
  const std::string plain = FormatTerminal(r, false);
  EXPECT_EQ(plain.find('\033'), std::string::npos);
  EXPECT_THAT(plain, HasSubstr("prefill(main,n=5)"));
  EXPECT_THAT(plain, HasSubstr("decode(main,n=10)"));
  EXPECT_THAT(plain, HasSubstr("first divergence: step 1 decode(main,n=10)"));
  EXPECT_THAT(plain, HasSubstr("position 5"));
  EXPECT_THAT(plain, HasSubstr("margin"));
  EXPECT_NE(FormatTerminal(r, true).find("\033["), std::string::npos);
}

// ---- llama2c models: a small synthetic checkpoint and tokenizer, so these run without the data.

template <typename T>
void Append(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof(T));
}

// A llama2.c checkpoint of the given header with small deterministic weights.
void WriteLlama2cCheckpoint(const std::filesystem::path& file, const format::Llama2cHeader& h) {
  std::string bytes;
  for (int32_t v :
       {h.dim, h.hidden_dim, h.n_layers, h.n_heads, h.n_kv_heads, h.vocab_size, h.seq_len}) {
    Append<int32_t>(bytes, v);
  }
  for (int64_t i = 0; static_cast<int64_t>(bytes.size()) < h.ExpectedFileBytes(); ++i) {
    Append<float>(bytes, 0.1f * static_cast<float>(std::sin(0.7 * static_cast<double>(i))));
  }
  testing::WriteFile(file, bytes);
}

// A llama2.c tokenizer.bin of 260 pieces: <unk>, BOS, EOS, the 256 byte pieces, and " a".
void WriteLlama2cTokenizer(const std::filesystem::path& file) {
  std::string bytes;
  Append<int32_t>(bytes, 6);
  std::vector<std::string> pieces = {"<unk>", "\n<s>\n", "\n</s>\n"};
  for (int b = 0; b < 256; ++b) pieces.push_back(fmt::format("<0x{:02X}>", b));
  pieces.push_back(" a");
  for (const auto& p : pieces) {
    Append<float>(bytes, 0.0f);
    Append<int32_t>(bytes, static_cast<int32_t>(p.size()));
    bytes += p;
  }
  testing::WriteFile(file, bytes);
}

const format::Llama2cHeader kSmallLlama2c{16, 32, 1, 2, 2, 260, 32};

std::string ErrorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no InputError)";
}

TEST(ModelFor, Llama2cCheckpointIsConvertedInMemoryAndRuns) {
  testing::TempDir dir;
  std::filesystem::create_directories(dir / "data");
  std::filesystem::create_directories(dir / "scenarios");
  WriteLlama2cCheckpoint(dir / "data" / "m.bin", kSmallLlama2c);
  WriteLlama2cTokenizer(dir / "data" / "tok.bin");
  testing::WriteFile(dir / "scenarios" / "s.json",
                     R"({"model": {"llama2c": {"checkpoint": "../data/m.bin",
                                               "tokenizer": "../data/tok.bin"}},
                         "backends": ["impl"],
                         "steps": [{"op": "prefill", "text": " a a"},
                                   {"op": "decode", "n": 3}]})");
  Scenario sc = LoadScenario(dir / "scenarios" / "s.json");
  EXPECT_EQ(MissingModelData(sc.model), "");
  EXPECT_EQ(ModelDataFiles(sc.model),
            (std::vector<std::filesystem::path>{dir / "data" / "m.bin", dir / "data" / "tok.bin"}));
  auto weights = LoadModelFor(sc.model);
  EXPECT_EQ(weights->config.vocab_size, 260);
  EXPECT_EQ(weights->config.num_hidden_layers, 1);
  EXPECT_EQ(weights->config.max_position_embeddings, 32);
  const auto tokenizer = LoadTokenizerFor(sc.model, weights->config.vocab_size);
  ASSERT_TRUE(tokenizer);
  EXPECT_EQ(tokenizer->VocabSize(), 260);
  PrepareScenario(sc, *weights);
  EXPECT_EQ(sc.steps[0].tokens, tokenizer->Encode(" a a", true));
  EXPECT_EQ(sc.steps[0].tokens.at(0), 1) << "a prompt on an empty conversation starts with BOS";
  // Nothing was written beside the files (the conversion is in memory).
  int files = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir.path()))
    files += e.is_regular_file();
  EXPECT_EQ(files, 3);
  auto impl = MakeBackend("impl", weights, 1);
  const RunReport report = RunScenario(sc, {impl.get()}, {});
  EXPECT_TRUE(report.Passed()) << FormatTerminal(report, false);
  EXPECT_EQ(report.model_source, "llama2c " + (dir / "data" / "m.bin").string() + ", tokenizer " +
                                     (dir / "data" / "tok.bin").string());
}

TEST(ModelFor, MissingLlama2cFilesAreNamed) {
  testing::TempDir dir;
  const Scenario sc = ParseScenario(
      R"({"model": {"llama2c": {"checkpoint": "none.bin", "tokenizer": "tok.bin"}},
          "steps": [{"op": "reset"}]})",
      dir.path());
  const std::string checkpoint = (dir / "none.bin").string();
  EXPECT_EQ(ErrorOf([&] { LoadModelFor(sc.model); }),
            "model.llama2c.checkpoint: " + checkpoint +
                " does not exist (the llama2.c model file, e.g. stories260K.bin; a scenario "
                "file's relative paths are read from its folder)");
  EXPECT_THAT(MissingModelData(sc.model), HasSubstr("model data not found: " + checkpoint));
  // The checkpoint present, the tokenizer it names absent.
  WriteLlama2cCheckpoint(dir / "none.bin", kSmallLlama2c);
  EXPECT_THAT(
      ErrorOf([&] { LoadModelFor(sc.model); }),
      HasSubstr("model.llama2c.tokenizer: " + (dir / "tok.bin").string() + " does not exist"));
  EXPECT_THAT(MissingModelData(sc.model),
              HasSubstr("model data not found: " + (dir / "tok.bin").string()));
  // A checkpoint that is not one is the reader's error, not a crash.
  testing::WriteFile(dir / "bad.bin", "not a checkpoint");
  EXPECT_THAT(ErrorOf([&] {
                LoadModelFor(ParseScenario(R"({"model": {"llama2c": {"checkpoint": "bad.bin"}},
                                              "steps": [{"op": "reset"}]})",
                                           dir.path())
                                 .model);
              }),
              HasSubstr("bad.bin"));
}

TEST(ModelFor, TextPromptsOnALlama2cModelNeedItsTokenizer) {
  testing::TempDir dir;
  WriteLlama2cCheckpoint(dir / "m.bin", kSmallLlama2c);
  Scenario sc = ParseScenario(R"({"model": {"llama2c": {"checkpoint": "m.bin"}},
                                  "steps": [{"op": "prefill", "tokens": [1, 5]},
                                            {"op": "prefill", "text": " a"}]})",
                              dir.path());
  auto weights = LoadModelFor(sc.model);
  EXPECT_FALSE(LoadTokenizerFor(sc.model, weights->config.vocab_size).has_value());
  EXPECT_EQ(ModelDataFiles(sc.model), (std::vector<std::filesystem::path>{dir / "m.bin"}));
  EXPECT_THAT(ErrorOf([&] { PrepareScenario(sc, *weights); }),
              HasSubstr("steps[1].text: text prompts need a tokenizer; add \"tokenizer\": "
                        "\"FILE.bin\" to model.llama2c"));
}

// Every backend of a run holds every live conversation's cache: a scenario whose cache fits one
// float32 backend (three quarters of this machine's memory) but not two is refused by the run,
// naming both sizes, before either backend runs a step. A model of 1024 layers of head_dim 256 and
// hidden size 2 holds 2 MiB a position in 10 MB of weights.
TEST(CacheFits, ACacheThatFitsEachBackendButNotTheRunsBackendsTogetherIsRefused) {
  const double memory = format::PhysicalMemoryBytes();
  if (memory <= 0) GTEST_SKIP() << "this machine does not say how much memory it has";
  const double per_position = 2.0 * 4 * 1024 * 256;  // float32 K and V of every layer
  const auto n = static_cast<int64_t>(0.75 * memory / per_position);
  Scenario sc = ParseScenario(fmt::format(
      R"({{"model": {{"config": {{"hidden_size": 2, "intermediate_size": 2,
        "num_hidden_layers": 1024, "num_attention_heads": 1, "num_key_value_heads": 1,
        "head_dim": 256, "vocab_size": 4, "max_position_embeddings": {}}}, "seed": 1}},
        "steps": [{{"op": "prefill", "tokens": [1]}}]}})",
      n + 1));
  sc.steps[0].tokens.assign(n, 1);
  const auto weights = LoadModelFor(sc.model);
  EXPECT_NO_THROW(ValidateScenario(sc, weights->config));  // one float32 backend: it fits
  EXPECT_NO_THROW(ValidateCacheFits(sc, weights->config, 4));
  // impl's description and config, and no call: were the run not refused, its first session
  // would fail the test here, not fill the machine's memory.
  class NeverRuns : public testing::WrappedBackend {
   public:
    using WrappedBackend::WrappedBackend;
    std::unique_ptr<BackendSession> NewSession() const override {
      ADD_FAILURE() << "the run made a session";
      throw EngineError("not run");
    }
    Logits ForwardFull(const Tokens&, ForwardTrace*) const override {
      ADD_FAILURE() << "the run called ForwardFull";
      throw EngineError("not run");
    }
  };
  const NeverRuns a(MakeBackend("impl", weights, 1), "a");
  const NeverRuns b(MakeBackend("impl", weights, 1), "b");
  try {
    RunScenario(sc, {&a, &b}, RunOptions());
    ADD_FAILURE() << "a run of two backends of " << n << " positions each was not refused";
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(), HasSubstr(fmt::format("steps[0] prefill(main,n={}): the conversations "
                                                "alive would hold {} positions",
                                                n, n)));
    EXPECT_THAT(e.what(), HasSubstr("GB of KV cache for the backends together (8 bytes a cached "
                                    "value), more than this machine's memory"));
  }
}

}  // namespace
}  // namespace kvdiff::harness
