// Scenario parsing and validation: valid files, and every refusal naming the step and field.
#include "harness/scenario/scenario.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>

#include "format/error.h"
#include "format/model_files.h"
#include "harness/campaign/campaign.h"
#include "harness/scenario/conversations.h"
#include "tests/harness/harness_test_util.h"

namespace kvdiff::harness {
namespace {

using ::testing::HasSubstr;

const char* kExample = R"({"model": {"preset": "tiny", "seed": 3}, "driver": "session",
  "tolerance": {"abs": 1e-4},
  "steps": [{"op": "prefill", "tokens": [5, 17, 3, 99, 42], "chunks": [3, 2]},
            {"op": "decode", "n": 10},
            {"op": "new_conversation", "name": "second"},
            {"op": "prefill", "conversation": "second", "tokens": [7]},
            {"op": "truncate", "conversation": "main", "length": 4},
            {"op": "fork", "from": "main", "to": "side"},
            {"op": "reset", "conversation": "side"}]})";

// The message of the InputError that parsing text throws ("" when it does not throw).
std::string ParseError(const std::string& text) {
  try {
    ParseScenario(text);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

std::string StepsError(const std::string& steps) {
  return ParseError(R"({"model": {"preset": "tiny", "seed": 1}, "steps": )" + steps + "}");
}

format::LlamaConfig TinyConfig() { return format::PresetConfig("tiny"); }

std::string ValidateError(const std::string& steps) {
  try {
    ValidateScenario(
        ParseScenario(R"({"model": {"preset": "tiny", "seed": 1}, "steps": )" + steps + "}"),
        TinyConfig());
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(ScenarioParse, ReadsEveryStepOfTheExample) {
  const Scenario sc = ParseScenario(kExample);
  ASSERT_TRUE(sc.model.preset.has_value());
  EXPECT_EQ(*sc.model.preset, "tiny");
  EXPECT_EQ(sc.model.seed, 3u);
  EXPECT_EQ(sc.driver, DriverKind::kSession);
  EXPECT_DOUBLE_EQ(sc.gate.abs, 1e-4);
  ASSERT_EQ(sc.steps.size(), 7u);
  EXPECT_EQ(sc.steps[0].op, Op::kPrefill);
  EXPECT_EQ(sc.steps[0].conversation, "main");
  EXPECT_EQ(sc.steps[0].tokens, (Tokens{5, 17, 3, 99, 42}));
  EXPECT_EQ(sc.steps[0].chunks, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(sc.steps[1].n, 10);
  EXPECT_EQ(sc.steps[2].name, "second");
  EXPECT_EQ(sc.steps[3].conversation, "second");
  EXPECT_EQ(sc.steps[4].length, 4);
  EXPECT_EQ(sc.steps[5].from, "main");
  EXPECT_EQ(sc.steps[5].to, "side");
  EXPECT_EQ(sc.steps[6].op, Op::kReset);
  EXPECT_NO_THROW(ValidateScenario(sc, TinyConfig()));
}

TEST(ScenarioParse, ParameterStrings) {
  const Scenario sc = ParseScenario(kExample);
  EXPECT_EQ(sc.steps[0].ParamString(), "prefill(main,n=5,chunks=3+2)");
  EXPECT_EQ(sc.steps[1].ParamString(), "decode(main,n=10)");
  EXPECT_EQ(sc.steps[2].ParamString(), "new_conversation(second)");
  EXPECT_EQ(sc.steps[3].ParamString(), "prefill(second,n=1)");
  EXPECT_EQ(sc.steps[4].ParamString(), "truncate(main,length=4)");
  EXPECT_EQ(sc.steps[5].ParamString(), "fork(main->side)");
  EXPECT_EQ(sc.steps[6].ParamString(), "reset(side)");
}

TEST(ScenarioParse, DefaultsWhenFieldsAreLeftOut) {
  const Scenario sc = ParseScenario(
      R"({"model": {"preset": "tiny"}, "steps": [{"op": "prefill", "tokens": [1]}]})");
  EXPECT_EQ(sc.model.seed, 0u);
  EXPECT_DOUBLE_EQ(sc.gate.abs, 1e-4);
  EXPECT_TRUE(sc.backends.empty());
  EXPECT_EQ(sc.driver, DriverKind::kSession);
  EXPECT_TRUE(sc.steps[0].chunks.empty());
}

TEST(ScenarioParse, ModelSeedTakesTheWholeUnsignedRange) {
  EXPECT_EQ(ParseScenario(R"({"model": {"preset": "tiny", "seed": 18446744073709551615},
                              "steps": [{"op": "reset"}]})")
                .model.seed,
            18446744073709551615ull);
  EXPECT_THAT(
      ParseError(R"({"model": {"preset": "tiny", "seed": -1}, "steps": [{"op": "reset"}]})"),
      HasSubstr("model.seed: expected an integer >= 0, got -1"));
  EXPECT_THAT(
      ParseError(R"({"model": {"preset": "tiny", "seed": 1.5}, "steps": [{"op": "reset"}]})"),
      HasSubstr("model.seed: expected an integer >= 0, got 1.5"));
}

TEST(ScenarioParse, RelativeModelPathIsResolvedAgainstTheFilesFolder) {
  const Scenario sc = ParseScenario(
      R"({"model": {"path": "../models/tiny"}, "steps": [{"op": "prefill", "tokens": [1]}]})",
      "/data/scenarios");
  ASSERT_TRUE(sc.model.path.has_value());
  EXPECT_EQ(sc.model.path->string(), "/data/models/tiny");
  const Scenario abs = ParseScenario(
      R"({"model": {"path": "/m/x"}, "steps": [{"op": "prefill", "tokens": [1]}]})", "/data");
  EXPECT_EQ(abs.model.path->string(), "/m/x");
}

TEST(ScenarioParse, ToJsonReadsBackTheSame) {
  const Scenario sc = ParseScenario(kExample);
  const Scenario back = ParseScenario(sc.ToJson().dump());
  ASSERT_EQ(back.steps.size(), sc.steps.size());
  for (size_t i = 0; i < sc.steps.size(); ++i) {
    EXPECT_EQ(back.steps[i].ParamString(), sc.steps[i].ParamString());
    EXPECT_EQ(back.steps[i].tokens, sc.steps[i].tokens);
  }
  EXPECT_EQ(back.model.Describe(), sc.model.Describe());
}

std::string ModelError(const std::string& model) {
  return ParseError(R"({"model": )" + model + R"(, "steps": [{"op": "reset"}]})");
}

TEST(ScenarioParse, Llama2cModelResolvesBothFilesAgainstTheFilesFolder) {
  const Scenario sc = ParseScenario(
      R"({"model": {"llama2c": {"checkpoint": "../../shared/s.bin", "tokenizer": "tok.bin"}},
          "steps": [{"op": "prefill", "text": "Once"}]})",
      "/repo/golden/x");
  ASSERT_TRUE(sc.model.llama2c.has_value());
  EXPECT_FALSE(sc.model.path.has_value());
  EXPECT_FALSE(sc.model.preset.has_value());
  EXPECT_EQ(sc.model.llama2c->checkpoint.string(), "/repo/shared/s.bin");
  ASSERT_TRUE(sc.model.llama2c->tokenizer.has_value());
  EXPECT_EQ(sc.model.llama2c->tokenizer->string(), "/repo/golden/x/tok.bin");
  EXPECT_EQ(sc.model.Describe(), "llama2c /repo/shared/s.bin, tokenizer /repo/golden/x/tok.bin");
  // Absolute paths are kept; the tokenizer may be left out (token-id prompts need none).
  const Scenario bare = ParseScenario(
      R"({"model": {"llama2c": {"checkpoint": "/m/s.bin"}}, "steps": [{"op": "reset"}]})", "/r");
  EXPECT_EQ(bare.model.llama2c->checkpoint.string(), "/m/s.bin");
  EXPECT_FALSE(bare.model.llama2c->tokenizer.has_value());
  EXPECT_EQ(bare.model.Describe(), "llama2c /m/s.bin, no tokenizer");
}

TEST(ScenarioParse, Llama2cModelRoundTripsThroughToJsonAndToText) {
  for (const char* model : {R"({"llama2c": {"checkpoint": "a/s.bin", "tokenizer": "t.bin"}})",
                            R"({"llama2c": {"checkpoint": "a/s.bin"}})"}) {
    SCOPED_TRACE(model);
    const Scenario sc = ParseScenario(
        std::string(R"({"model": )") + model + R"(, "steps": [{"op": "prefill", "tokens": [1]}]})",
        "/base");
    const nlohmann::json j = sc.model.ToJson();
    ASSERT_TRUE(j.contains("llama2c")) << j.dump();
    EXPECT_EQ(j.at("llama2c").at("checkpoint"), "/base/a/s.bin");
    EXPECT_EQ(j.at("llama2c").contains("tokenizer"), sc.model.llama2c->tokenizer.has_value());
    for (const std::string& text : {sc.ToJson().dump(), sc.ToText()}) {
      const Scenario back = ParseScenario(text, "/elsewhere");  // absolute now: base ignored
      ASSERT_TRUE(back.model.llama2c.has_value());
      EXPECT_EQ(back.model.llama2c->checkpoint, sc.model.llama2c->checkpoint);
      EXPECT_EQ(back.model.llama2c->tokenizer, sc.model.llama2c->tokenizer);
      EXPECT_EQ(back.model.Describe(), sc.model.Describe());
    }
  }
}

TEST(ScenarioParse, Llama2cModelErrorsNameTheField) {
  EXPECT_THAT(ModelError(R"({"llama2c": {"tokenizer": "t.bin"}})"),
              HasSubstr("model.llama2c: missing field \"checkpoint\""));
  EXPECT_THAT(ModelError(R"({"llama2c": {"checkpoint": "s.bin", "vocab": 512}})"),
              HasSubstr("model.llama2c: unknown field \"vocab\" (expected one of: checkpoint, "
                        "tokenizer)"));
  EXPECT_THAT(ModelError(R"({"llama2c": {"checkpoint": "s.bin"}, "seed": 3})"),
              HasSubstr("model: unknown field \"seed\" (expected one of: llama2c)"));
  EXPECT_THAT(ModelError(R"({"llama2c": {"checkpoint": 7}})"),
              HasSubstr("model.llama2c.checkpoint: expected a string, got number 7"));
  EXPECT_THAT(ModelError(R"({"llama2c": {"checkpoint": "s.bin", "tokenizer": ["t.bin"]}})"),
              HasSubstr("model.llama2c.tokenizer: expected a string, got array"));
  EXPECT_THAT(ModelError(R"({"llama2c": {"checkpoint": ""}})"),
              HasSubstr("model.llama2c.checkpoint: must not be empty"));
  EXPECT_THAT(ModelError(R"({"llama2c": "s.bin"})"),
              HasSubstr("model.llama2c: expected an object like {\"checkpoint\": \"FILE.bin\""));
  EXPECT_THAT(
      ModelError(R"({"seed": 3})"),
      HasSubstr("model: needs \"preset\" (with \"seed\"), \"path\", \"llama2c\" or \"config\""));
  EXPECT_THAT(ModelError(R"("tiny")"), HasSubstr("{\"llama2c\": {\"checkpoint\": \"FILE.bin\""));
}

TEST(ScenarioParse, ModelScaleRoundTripsAndErrorsNameTheField) {
  const Scenario a = ParseScenario(
      R"({"model": {"preset": "tiny", "seed": 3, "scale": "demanding"}, "steps": [{"op": "reset"}]})");
  EXPECT_EQ(a.model.scale, format::RandomModelScale::Demanding());
  EXPECT_EQ(a.model.Describe(), "preset tiny, seed 3, scale demanding");
  const Scenario b = ParseScenario(
      R"({"model": {"preset": "tiny", "scale": {"scores": 4, "logits": 30}},
          "tolerance": {"abs": 1e-4, "rel": 2e-5}, "steps": [{"op": "reset"}]})");
  EXPECT_EQ(b.model.scale.scores, 4);
  EXPECT_EQ(b.model.scale.activations, 1);
  EXPECT_EQ(b.gate.rel, 2e-5);
  for (const Scenario& sc : {a, b}) {
    const Scenario back = ParseScenario(sc.ToJson().dump());
    EXPECT_EQ(back.model.scale, sc.model.scale);
    EXPECT_EQ(back.model.Describe(), sc.model.Describe());
    EXPECT_EQ(back.gate.rel, sc.gate.rel);
    EXPECT_EQ(ParseScenario(sc.ToText()).ToJson(), sc.ToJson());
  }
  EXPECT_FALSE(ParseScenario(R"({"model": {"preset": "tiny"}, "steps": [{"op": "reset"}]})")
                   .ToJson()
                   .at("model")
                   .contains("scale"))
      << "a default model's file does not change";
  EXPECT_THAT(ModelError(R"({"preset": "tiny", "scale": "hard"})"),
              HasSubstr("model.scale: expected \"default\", \"demanding\""));
  EXPECT_THAT(ModelError(R"({"preset": "tiny", "scale": {"score": 2}})"),
              HasSubstr("model.scale: unknown field \"score\" (expected one of: activations, "
                        "logits, scores)"));
  EXPECT_THAT(ModelError(R"({"preset": "tiny", "scale": {"scores": "2"}})"),
              HasSubstr("model.scale.scores: expected a number, got"));
  EXPECT_THAT(ModelError(R"({"preset": "tiny", "scale": {"logits": 0}})"),
              HasSubstr("model.scale: logits must be a finite number > 0"));
  EXPECT_THAT(ModelError(R"({"preset": "tiny", "scale": 3})"),
              HasSubstr("model.scale: expected \"demanding\""));
  EXPECT_THAT(ModelError(R"({"path": "m", "scale": "demanding"})"),
              HasSubstr("model: unknown field \"scale\" (expected one of: path)"));
  EXPECT_THAT(ParseError(R"({"model": {"preset": "tiny"}, "tolerance": {"rel": 2},
                             "steps": [{"op": "reset"}]})"),
              HasSubstr("tolerance.rel: expected a number >= 0 and < 1"));
}

TEST(ScenarioParse, ChunksMustSumToTheTokenCount) {
  EXPECT_EQ(StepsError(R"([{"op": "prefill", "tokens": [1, 2, 3, 4, 5], "chunks": [2, 2]}])"),
            "steps[0].chunks: sizes sum to 4 but tokens has 5");
  EXPECT_THAT(StepsError(R"([{"op": "prefill", "tokens": [1, 2], "chunks": [2, 0]}])"),
              HasSubstr("steps[0].chunks[1]: expected a chunk size >= 1, got 0"));
}

TEST(ScenarioParse, StepErrorsNameTheIndexAndField) {
  EXPECT_THAT(StepsError(R"([{"op": "prefill", "tokens": [1]}, {"op": "jump"}])"),
              HasSubstr("steps[1].op: unknown op \"jump\""));
  EXPECT_THAT(StepsError(R"([{"op": "prefill", "tokenz": [1]}])"),
              HasSubstr("steps[0]: unknown field \"tokenz\""));
  EXPECT_THAT(StepsError(R"([{"op": "prefill", "tokens": [1]}, {"op": "decode"}])"),
              HasSubstr("steps[1]: \"decode\" needs the field \"n\""));
  EXPECT_THAT(StepsError(R"([{"op": "prefill", "tokens": [1]}, {"op": "decode", "n": 0}])"),
              HasSubstr("steps[1].n: expected an integer >= 1, got 0"));
  EXPECT_THAT(StepsError(R"([{"op": "prefill", "tokens": [1]}, {"op": "decode", "n": "3"}])"),
              HasSubstr("steps[1].n: expected an integer, got string \"3\""));
  EXPECT_THAT(StepsError(R"([{"op": "prefill", "tokens": [1, -2]}])"),
              HasSubstr("steps[0].tokens[1]: expected a non-negative integer token id, got -2"));
  EXPECT_THAT(StepsError(R"([{"op": "prefill", "tokens": []}])"),
              HasSubstr("steps[0].tokens: must not be empty"));
  EXPECT_THAT(
      StepsError(R"([{"op": "prefill", "tokens": [1], "text": "hi"}])"),
      HasSubstr("steps[0]: \"prefill\" needs exactly one of \"tokens\", \"text\" or \"messages\""));
  EXPECT_THAT(StepsError(R"([{"op": "fork", "from": "main"}])"),
              HasSubstr("steps[0]: \"fork\" needs the field \"to\""));
  EXPECT_THAT(StepsError(R"([{"op": "truncate", "length": -1}])"),
              HasSubstr("steps[0].length: expected an integer >= 0, got -1"));
  EXPECT_THAT(StepsError(R"([{"op": "reset", "conversation": ""}])"),
              HasSubstr("steps[0].conversation: a conversation name must not be empty"));
  EXPECT_THAT(StepsError(R"([{"op": "new_conversation", "conversation": "x"}])"),
              HasSubstr("steps[0]: unknown field \"conversation\""));
  EXPECT_THAT(StepsError(R"([7])"), HasSubstr("steps[0]: expected an object, got number 7"));
  EXPECT_THAT(StepsError(R"([{"tokens": [1]}])"), HasSubstr("steps[0]: missing field \"op\""));
  EXPECT_THAT(StepsError(R"([])"), HasSubstr("steps: expected a non-empty array"));
}

TEST(ScenarioParse, TopLevelErrors) {
  EXPECT_THAT(ParseError("{"), HasSubstr("scenario: invalid JSON"));
  EXPECT_THAT(ParseError("[1]"), HasSubstr("expected a JSON object at the top, got array"));
  EXPECT_THAT(ParseError(R"({"steps": [{"op": "reset"}]})"),
              HasSubstr("scenario: missing field \"model\""));
  EXPECT_THAT(ParseError(R"({"model": {"preset": "tiny"}, "steps": [{"op": "reset"}],
                              "colour": 1})"),
              HasSubstr("scenario: unknown field \"colour\""));
  EXPECT_THAT(
      ParseError(R"({"model": {"preset": "tiny", "path": "x"}, "steps": [{"op": "reset"}]})"),
      HasSubstr("model: unknown field \"preset\""));
  EXPECT_THAT(ParseError(R"({"model": {"preset": "tiny"}, "driver": "pos1",
                              "steps": [{"op": "reset"}]})"),
              HasSubstr("driver: unknown driver \"pos1\" (expected one of session, uncached, raw, "
                        "pos0, reuse, quantized, stale-position)"));
  EXPECT_THAT(ParseError(R"({"model": {"preset": "tiny"}, "tolerance": {"abs": -1},
                              "steps": [{"op": "reset"}]})"),
              HasSubstr("tolerance.abs: expected a finite number >= 0, got -1"));
  EXPECT_THAT(ParseError(R"({"model": {"preset": "tiny"}, "tolerance": {"rel": 1},
                              "steps": [{"op": "reset"}]})"),
              HasSubstr("tolerance.rel: expected a number >= 0 and < 1"));
  EXPECT_THAT(ParseError(R"({"model": {"preset": "tiny"}, "tolerance": {"rtol": 1e-3},
                              "steps": [{"op": "reset"}]})"),
              HasSubstr("tolerance: unknown field \"rtol\" (expected one of: abs, rel)"));
  EXPECT_THAT(ParseError(R"({"model": {"preset": "tiny"}, "backends": ["impl", "cuda"],
                              "steps": [{"op": "reset"}]})"),
              HasSubstr("backends[1]: unknown backend \"cuda\""));
  EXPECT_THAT(ParseError(R"({"model": {"preset": "tiny"}, "backends": ["impl", "impl"],
                              "steps": [{"op": "reset"}]})"),
              HasSubstr("backends[1]: \"impl\" is listed twice"));
}

TEST(ScenarioValidate, RefusesWhatNoBackendCouldRun) {
  EXPECT_THAT(ValidateError(R"([{"op": "decode", "n": 2}])"),
              HasSubstr("steps[0]: decode on conversation \"main\" has no previous row"));
  EXPECT_THAT(ValidateError(R"([{"op": "prefill", "tokens": [1, 2]},
                                {"op": "truncate", "length": 1}, {"op": "decode", "n": 1}])"),
              HasSubstr("steps[2]: decode on conversation \"main\" has no previous row"));
  EXPECT_THAT(ValidateError(R"([{"op": "prefill", "conversation": "other", "tokens": [1]}])"),
              HasSubstr("steps[0].conversation: no conversation named \"other\""));
  EXPECT_THAT(ValidateError(R"([{"op": "fork", "from": "nope", "to": "x"}])"),
              HasSubstr("steps[0].from: no conversation named \"nope\""));
  EXPECT_THAT(ValidateError(R"([{"op": "fork", "from": "main", "to": "main"}])"),
              HasSubstr("steps[0].to: conversation \"main\" already exists"));
  EXPECT_THAT(ValidateError(R"([{"op": "new_conversation", "name": "main"}])"),
              HasSubstr("steps[0].name: conversation \"main\" already exists"));
  EXPECT_THAT(ValidateError(R"([{"op": "prefill", "tokens": [1, 2]},
                                {"op": "truncate", "length": 3}])"),
              HasSubstr("steps[1].length: cannot truncate conversation \"main\" to 3: it has 2"));
  const auto vocab = TinyConfig().vocab_size;
  EXPECT_THAT(ValidateError(R"([{"op": "prefill", "tokens": [1, )" + std::to_string(vocab) + "]}]"),
              HasSubstr("steps[0].tokens[1]: token id " + std::to_string(vocab) +
                        " is outside the vocabulary [0, " + std::to_string(vocab) + ")"));
  const auto max_pos = TinyConfig().max_position_embeddings;
  EXPECT_THAT(ValidateError(R"([{"op": "prefill", "tokens": [1]}, {"op": "decode", "n": )" +
                            std::to_string(max_pos) + "}]"),
              HasSubstr("steps[1].n: conversation \"main\" would reach 1 + " +
                        std::to_string(max_pos) + " positions"));
  EXPECT_THAT(ValidateError(R"([{"op": "prefill", "tokens": [1]},
                                {"op": "decode", "n": 9223372036854775807}])"),
              HasSubstr("steps[1].n: conversation \"main\" would reach 1 + 9223372036854775807"));
  // Truncating to the current length keeps the last row, so decode may follow.
  EXPECT_EQ(ValidateError(R"([{"op": "prefill", "tokens": [1, 2]},
                              {"op": "truncate", "length": 2}, {"op": "decode", "n": 1},
                              {"op": "fork", "from": "main", "to": "f"},
                              {"op": "decode", "conversation": "f", "n": 1}])"),
            "");
}

TEST(BackendList, ParsesAndRefuses) {
  EXPECT_EQ(ParseBackendList("impl,ref64"), (std::vector<std::string>{"impl", "ref64"}));
  auto error = [](const std::string& s) {
    try {
      ParseBackendList(s);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_THAT(error("impl,,ref"), HasSubstr("--backends: empty name"));
  EXPECT_THAT(error("impl,gpu"), HasSubstr("--backends: unknown backend \"gpu\""));
  EXPECT_THAT(error("ref,ref"), HasSubstr("--backends: \"ref\" is listed twice"));
}

TEST(Shards, ParseAndPartition) {
  EXPECT_EQ(ParseShard("2/5").index, 2);
  EXPECT_EQ(ParseShard("2/5").count, 5);
  for (const char* bad : {"0/4", "5/4", "1/0", "1-4", "a/b", "1/4x", ""}) {
    try {
      ParseShard(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const InputError& e) {
      EXPECT_THAT(e.what(), HasSubstr("--shard")) << bad;
    }
  }
  std::set<int64_t> all;
  size_t total = 0;
  for (int64_t i = 1; i <= 4; ++i) {
    const auto cases = ShardCases(1000, Shard{i, 4});
    EXPECT_EQ(cases.size(), 250u);
    for (int64_t k : cases) EXPECT_EQ(k % 4, i - 1);
    total += cases.size();
    all.insert(cases.begin(), cases.end());
  }
  EXPECT_EQ(total, 1000u);       // disjoint ...
  EXPECT_EQ(all.size(), 1000u);  // ... and covering 0..999
  EXPECT_EQ(*all.rbegin(), 999);
  EXPECT_EQ(ShardCases(3, Shard{4, 4}).size(), 0u);
}

TEST(GenerateCase, IsAFunctionOfSeedAndIndexAndAlwaysValid) {
  const auto config = TinyConfig();
  const ModelSpec model = testing::TinyModel();
  EXPECT_EQ(GenerateCase(config, model, 5, 17).ToJson(),
            GenerateCase(config, model, 5, 17).ToJson());
  EXPECT_NE(GenerateCase(config, model, 5, 17).ToJson(),
            GenerateCase(config, model, 5, 18).ToJson());
  EXPECT_NE(GenerateCase(config, model, 5, 17).ToJson(),
            GenerateCase(config, model, 6, 17).ToJson());
  std::set<Op> ops;
  bool chunked = false;
  for (int64_t k = 0; k < 300; ++k) {
    const Scenario sc = GenerateCase(config, model, 1, k);
    EXPECT_NO_THROW(ValidateScenario(sc, config)) << sc.ToJson().dump();
    // A generated case replays from its file.
    EXPECT_EQ(ParseScenario(sc.ToJson().dump()).ToJson(), sc.ToJson());
    EXPECT_EQ(ParseScenario(sc.ToText()).ToJson(), sc.ToJson());
    for (const Step& s : sc.steps) {
      ops.insert(s.op);
      chunked = chunked || s.chunks.size() > 1;
    }
  }
  EXPECT_EQ(ops.size(), 8u) << "every op appears somewhere in 300 cases";
  EXPECT_TRUE(chunked);
}

// Shift episodes only when every backend shifts (GenerationOptions::shifts), from a stream of
// their own: without it a case has none; with it, cases stay valid and within the context, the
// sessions and the call size the backends hold, and draw every kind of episode.
TEST(GenerateCase, DrawsShiftsOnlyWhenEveryBackendShiftsAndStaysWithinLimits) {
  const auto config = TinyConfig();
  const ModelSpec model = testing::TinyModel();
  GenerationOptions limited;
  limited.shifts = true;
  limited.max_length = 64;
  limited.max_sessions = 3;
  limited.max_call_tokens = 16;
  int64_t shifts = 0, nothing_after_keep = 0, twice = 0;
  for (int64_t k = 0; k < 300; ++k) {
    for (const Step& s : GenerateCase(config, model, 1, k).steps) EXPECT_NE(s.op, Op::kShift);
    const Scenario sc = GenerateCase(config, model, 1, k, limited);
    EXPECT_NO_THROW(ValidateScenario(sc, config)) << sc.ToJson().dump();
    EXPECT_EQ(ParseScenario(sc.ToText()).ToJson(), sc.ToJson());
    Conversations convs;
    const Step* last = nullptr;
    for (const Step& s : sc.steps) {
      for (const ForwardCall& call : convs.CallsOf(s)) {
        if (s.op != Op::kBatch) {
          EXPECT_LE(call.size, 16) << s.ParamString();
        }
      }
      if (s.op == Op::kShift) {
        ++shifts;
        nothing_after_keep +=
            s.discard > 0 && s.keep + s.discard == convs.At(s.conversation).length;
        twice += last != nullptr && last->op == Op::kShift && s.discard > 0;
      }
      convs.Apply(s);
      EXPECT_LE(static_cast<int64_t>(convs.Names().size()), 3) << sc.ToJson().dump();
      for (const std::string& name : convs.Names()) EXPECT_LE(convs.At(name).length, 64);
      last = &s;
    }
  }
  EXPECT_GT(shifts, 300);
  EXPECT_GT(nothing_after_keep, 30);
  EXPECT_GT(twice, 30);
}

}  // namespace
}  // namespace kvdiff::harness
