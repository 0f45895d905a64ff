// config.json parsing and validation: real configs, defaults, llama3 rope scaling, and every
// refusal with the field named in the message.
#include "format/config.h"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "format/error.h"
#include "format/model_files.h"
#include "tests/test_support.h"

namespace kvdiff::format {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// HuggingFaceTB/SmolLM2-135M-Instruct's config.json, verbatim.
constexpr const char* kSmolLm2Config = R"({
  "_name_or_path": "HuggingFaceTB/smollm2-135M-8k-lc100k-mix1-ep2",
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 576,
  "initializer_range": 0.041666666666666664,
  "intermediate_size": 1536,
  "is_llama_config": true,
  "max_position_embeddings": 8192,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 9,
  "num_hidden_layers": 30,
  "num_key_value_heads": 3,
  "pad_token_id": 2,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_interleaved": false,
  "rope_scaling": null,
  "rope_theta": 100000,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.42.3",
  "use_cache": true,
  "vocab_size": 49152
})";

// Llama 3.2 1B's config.json (shape fields and rope_scaling as published).
constexpr const char* kLlama32Config = R"({
  "architectures": ["LlamaForCausalLM"],
  "bos_token_id": 128000,
  "eos_token_id": [128001, 128008, 128009],
  "head_dim": 64,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "intermediate_size": 8192,
  "max_position_embeddings": 131072,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 16,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "factor": 32.0,
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3"
  },
  "rope_theta": 500000.0,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "vocab_size": 128256
})";

// A minimal valid config; tests replace one field at a time.
nlohmann::json Minimal() {
  return {{"hidden_size", 64},
          {"intermediate_size", 128},
          {"num_hidden_layers", 2},
          {"num_attention_heads", 4},
          {"num_key_value_heads", 2},
          {"vocab_size", 256},
          {"max_position_embeddings", 512}};
}

std::string ErrorOf(const std::string& text) {
  try {
    ParseConfig(text);
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no error)";
}

std::string ErrorWith(const char* field, const nlohmann::json& value) {
  nlohmann::json j = Minimal();
  j[field] = value;
  return ErrorOf(j.dump());
}

std::string ErrorWithout(const char* field) {
  nlohmann::json j = Minimal();
  j.erase(field);
  return ErrorOf(j.dump());
}

TEST(Config, ParsesSmolLm2) {
  const LlamaConfig c = ParseConfig(kSmolLm2Config);
  EXPECT_EQ(c.hidden_size, 576);
  EXPECT_EQ(c.intermediate_size, 1536);
  EXPECT_EQ(c.num_hidden_layers, 30);
  EXPECT_EQ(c.num_attention_heads, 9);
  EXPECT_EQ(c.num_key_value_heads, 3);
  EXPECT_EQ(c.head_dim, 64);  // implicit: 576 / 9
  EXPECT_EQ(c.vocab_size, 49152);
  EXPECT_EQ(c.max_position_embeddings, 8192);
  EXPECT_EQ(c.rope_theta, 100000.0);  // an integer in the file, accepted as a number
  EXPECT_FALSE(c.rope_scaling.has_value());
  EXPECT_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_id, 2);
  EXPECT_EQ(c.torch_dtype, "bfloat16");
  EXPECT_EQ(c.QDim(), 576);
  EXPECT_EQ(c.KvDim(), 192);
  EXPECT_EQ(c.NumRep(), 3);
}

TEST(Config, ParsesLlama3RopeScalingAndEosList) {
  const LlamaConfig c = ParseConfig(kLlama32Config);
  ASSERT_TRUE(c.rope_scaling.has_value());
  EXPECT_EQ(c.rope_scaling->type, "llama3");
  EXPECT_EQ(c.rope_scaling->factor, 32.0);
  EXPECT_EQ(c.rope_scaling->low_freq_factor, 1.0);
  EXPECT_EQ(c.rope_scaling->high_freq_factor, 4.0);
  EXPECT_EQ(c.rope_scaling->original_max_position_embeddings, 8192);
  EXPECT_EQ(c.eos_token_id, 128001);  // the first of the list
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.rope_theta, 500000.0);
}

TEST(Config, OldSpellingOfRopeType) {
  nlohmann::json j = Minimal();
  j["rope_scaling"] = {{"type", "llama3"},
                       {"factor", 8.0},
                       {"low_freq_factor", 1.0},
                       {"high_freq_factor", 4.0},
                       {"original_max_position_embeddings", 8192}};
  EXPECT_EQ(ParseConfig(j.dump()).rope_scaling->factor, 8.0);
  j["rope_scaling"] = {{"rope_type", "default"}};
  EXPECT_FALSE(ParseConfig(j.dump()).rope_scaling.has_value());
}

TEST(Config, ExplicitHeadDimNeedNotDivideHidden) {
  nlohmann::json j = Minimal();
  j["num_attention_heads"] = 3;  // 64 / 3 is not whole, but head_dim is given
  j["num_key_value_heads"] = 1;
  j["head_dim"] = 32;
  const LlamaConfig c = ParseConfig(j.dump());
  EXPECT_EQ(c.head_dim, 32);
  EXPECT_EQ(c.QDim(), 96);
}

TEST(Config, DefaultsFollowTransformers) {
  nlohmann::json j = Minimal();
  j.erase("num_key_value_heads");
  const LlamaConfig c = ParseConfig(j.dump());
  EXPECT_EQ(c.num_key_value_heads, 4);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_id, 2);
  EXPECT_EQ(c.torch_dtype, "float32");
  j["bos_token_id"] = nullptr;
  j["dtype"] = "float16";  // transformers >= 4.56 spelling
  const LlamaConfig d = ParseConfig(j.dump());
  EXPECT_EQ(d.bos_token_id, -1);
  EXPECT_EQ(d.torch_dtype, "float16");
}

TEST(Config, RefusesOtherRopeScalingTypes) {
  for (const char* type : {"linear", "dynamic", "yarn", "longrope"}) {
    EXPECT_THAT(ErrorWith("rope_scaling", {{"rope_type", type}, {"factor", 2.0}}),
                AllOf(HasSubstr("rope_scaling"), HasSubstr(std::string("\"") + type + "\""),
                      HasSubstr("only \"llama3\"")))
        << type;
  }
  EXPECT_THAT(ErrorWith("rope_scaling", {{"type", "linear"}, {"factor", 2.0}}),
              HasSubstr("unsupported rope scaling type \"linear\""));
  EXPECT_THAT(ErrorWith("rope_scaling", {{"factor", 2.0}}), HasSubstr("rope_scaling.rope_type"));
  EXPECT_THAT(ErrorWith("rope_scaling", "llama3"), HasSubstr("expected null or an object"));
  EXPECT_THAT(ErrorWith("rope_scaling", {{"rope_type", "llama3"}, {"factor", 8.0}}),
              HasSubstr("rope_scaling.low_freq_factor\": missing"));
  EXPECT_THAT(ErrorWith("rope_scaling", {{"rope_type", "llama3"},
                                         {"factor", 8.0},
                                         {"low_freq_factor", 4.0},
                                         {"high_freq_factor", 4.0},
                                         {"original_max_position_embeddings", 8192}}),
              HasSubstr("rope_scaling.high_freq_factor\": expected a number greater than"));
}

TEST(Config, MissingFieldNamesFieldAndType) {
  for (const char* field : {"hidden_size", "intermediate_size", "num_hidden_layers",
                            "num_attention_heads", "vocab_size", "max_position_embeddings"}) {
    EXPECT_THAT(ErrorWithout(field),
                AllOf(HasSubstr(std::string("missing required field \"") + field + "\""),
                      HasSubstr("expected an integer")))
        << field;
  }
}

TEST(Config, WrongTypeNamesFieldAndBothTypes) {
  EXPECT_THAT(ErrorWith("hidden_size", "64"),
              AllOf(HasSubstr("\"hidden_size\""), HasSubstr("expected an integer"),
                    HasSubstr("found string \"64\"")));
  EXPECT_THAT(ErrorWith("vocab_size", 256.5),
              AllOf(HasSubstr("\"vocab_size\""), HasSubstr("expected an integer")));
  EXPECT_THAT(ErrorWith("rope_theta", "big"),
              AllOf(HasSubstr("\"rope_theta\""), HasSubstr("expected a number")));
  EXPECT_THAT(ErrorWith("tie_word_embeddings", 1),
              AllOf(HasSubstr("\"tie_word_embeddings\""), HasSubstr("expected a boolean")));
  EXPECT_THAT(ErrorWith("eos_token_id", "eos"),
              AllOf(HasSubstr("\"eos_token_id\""), HasSubstr("expected an integer")));
  EXPECT_THAT(ErrorWith("torch_dtype", 32),
              AllOf(HasSubstr("\"torch_dtype\""), HasSubstr("expected a string")));
}

TEST(Config, BadJsonAndNotAnObject) {
  EXPECT_THAT(ErrorOf("{\"hidden_size\": 64,"), HasSubstr("config.json: invalid JSON"));
  EXPECT_THAT(ErrorOf("[1, 2]"), HasSubstr("expected a JSON object at the top level, found array"));
  EXPECT_THAT(ErrorOf(""), HasSubstr("invalid JSON"));
}

TEST(Config, ValidateRejectsImpossibleShapes) {
  EXPECT_THAT(ErrorWith("hidden_size", 0),
              AllOf(HasSubstr("\"hidden_size\""), HasSubstr("positive integer, found 0")));
  EXPECT_THAT(ErrorWith("intermediate_size", -3),
              AllOf(HasSubstr("\"intermediate_size\""), HasSubstr("found -3")));
  EXPECT_THAT(ErrorWith("num_hidden_layers", 0), HasSubstr("\"num_hidden_layers\""));
  EXPECT_THAT(ErrorWith("vocab_size", 0), HasSubstr("\"vocab_size\""));
  EXPECT_THAT(ErrorWith("max_position_embeddings", 0), HasSubstr("\"max_position_embeddings\""));
  EXPECT_THAT(ErrorWith("num_key_value_heads", 0), HasSubstr("\"num_key_value_heads\""));
  EXPECT_THAT(ErrorWith("num_attention_heads", 0), HasSubstr("\"num_attention_heads\""));
  // heads not dividing hidden when head_dim is implicit
  EXPECT_THAT(ErrorWith("num_attention_heads", 5),
              AllOf(HasSubstr("\"num_attention_heads\": 5 does not divide hidden_size 64")));
  // kv heads not dividing heads
  EXPECT_THAT(ErrorWith("num_key_value_heads", 3),
              HasSubstr("\"num_key_value_heads\": 3 does not divide num_attention_heads 4"));
  // odd head_dim, explicit and implicit
  EXPECT_THAT(ErrorWith("head_dim", 15),
              AllOf(HasSubstr("\"head_dim\""), HasSubstr("even"), HasSubstr("found 15")));
  {
    nlohmann::json j = Minimal();
    j["hidden_size"] = 36;
    j["num_attention_heads"] = 4;  // head_dim 9
    j["num_key_value_heads"] = 4;
    EXPECT_THAT(ErrorOf(j.dump()), AllOf(HasSubstr("\"head_dim\""), HasSubstr("found 9")));
  }
  EXPECT_THAT(ErrorWith("rms_norm_eps", 0),
              AllOf(HasSubstr("\"rms_norm_eps\""), HasSubstr("positive finite")));
  EXPECT_THAT(ErrorWith("rms_norm_eps", -1e-5), HasSubstr("\"rms_norm_eps\""));
  EXPECT_THAT(ErrorWith("rope_theta", 0), HasSubstr("\"rope_theta\": expected a positive finite"));
  EXPECT_THAT(ErrorWith("rope_theta", -10000), HasSubstr("\"rope_theta\""));
  EXPECT_THAT(ErrorWith("torch_dtype", "int8"),
              AllOf(HasSubstr("\"torch_dtype\""), HasSubstr("\"int8\"")));
  EXPECT_THAT(ErrorWith("hidden_size", int64_t{1} << 40), HasSubstr("\"hidden_size\""));
}

TEST(Config, ValidateOnStructNamesField) {
  LlamaConfig c = PresetConfig("tiny");
  c.Validate();
  c.num_key_value_heads = 3;
  EXPECT_THROW(
      {
        try {
          c.Validate();
        } catch (const InputError& e) {
          EXPECT_THAT(e.what(), HasSubstr("num_key_value_heads"));
          throw;
        }
      },
      InputError);
}

TEST(Config, RefusesOtherArchitectures) {
  EXPECT_THAT(ErrorWith("attention_bias", true), HasSubstr("\"attention_bias\": true is not"));
  EXPECT_THAT(ErrorWith("mlp_bias", true), HasSubstr("\"mlp_bias\""));
  EXPECT_THAT(ErrorWith("hidden_act", "gelu"), HasSubstr("\"hidden_act\""));
  EXPECT_THAT(ErrorWith("model_type", "gemma"),
              AllOf(HasSubstr("\"model_type\""), HasSubstr("\"gemma\"")));
}

// sliding_window (issue 34): Mistral's key, null or absent for none, Qwen2's use_sliding_window
// false for none; a window < 1 or larger than the context refused naming the field and numbers.
TEST(Config, SlidingWindow) {
  nlohmann::json j = Minimal();
  EXPECT_EQ(ParseConfig(j.dump()).sliding_window, 0);
  j["sliding_window"] = nullptr;
  EXPECT_EQ(ParseConfig(j.dump()).sliding_window, 0);
  j["sliding_window"] = 32;
  j["model_type"] = "mistral";
  const LlamaConfig c = ParseConfig(j.dump());
  EXPECT_EQ(c.sliding_window, 32);
  EXPECT_TRUE(c.Windowed());
  j["use_sliding_window"] = false;
  EXPECT_EQ(ParseConfig(j.dump()).sliding_window, 0);
  j["use_sliding_window"] = true;
  EXPECT_EQ(ParseConfig(j.dump()).sliding_window, 32);
  EXPECT_THAT(ErrorWith("sliding_window", 0),
              HasSubstr("\"sliding_window\": expected a positive integer (or null for none), "
                        "found 0"));
  EXPECT_THAT(ErrorWith("sliding_window", "x"), HasSubstr("\"sliding_window\""));
  const int64_t context = ParseConfig(Minimal().dump()).max_position_embeddings;
  EXPECT_THAT(ErrorWith("sliding_window", context + 1),
              HasSubstr(fmt::format("\"sliding_window\": {} is larger than "
                                    "max_position_embeddings {} (a window larger than the "
                                    "context)",
                                    context + 1, context)));
  EXPECT_NO_THROW(ParseConfig([&] {
    nlohmann::json k = Minimal();
    k["sliding_window"] = context;
    return k.dump();
  }()));
}

// Written only when set, as a Mistral model (transformers' LlamaConfig would ignore the key), so a
// full-attention model's config.json is byte-identical to what it was; read back the same.
TEST(Config, SlidingWindowIsWrittenOnlyWhenSet) {
  LlamaConfig c = PresetConfig("tiny");
  const std::string plain = ConfigToJson(c);
  EXPECT_THAT(plain, ::testing::Not(HasSubstr("sliding_window")));
  EXPECT_THAT(plain, HasSubstr("\"model_type\": \"llama\""));
  c.sliding_window = 32;
  const std::string windowed = ConfigToJson(c);
  EXPECT_THAT(windowed, HasSubstr("\"sliding_window\": 32"));
  EXPECT_THAT(windowed, HasSubstr("\"model_type\": \"mistral\""));
  EXPECT_THAT(windowed, HasSubstr("MistralForCausalLM"));
  EXPECT_EQ(ParseConfigStrict(windowed, "inline").sliding_window, 32);
  EXPECT_EQ(PresetConfig("tiny-swa").sliding_window, 32);
}

TEST(Config, UnknownKeysIgnored) {
  nlohmann::json j = Minimal();
  j["some_future_key"] = {{"nested", true}};
  j["pretraining_tp"] = 1;
  EXPECT_EQ(ParseConfig(j.dump()).hidden_size, 64);
}

TEST(Config, JsonRoundTrip) {
  for (const char* text : {kSmolLm2Config, kLlama32Config}) {
    const LlamaConfig c = ParseConfig(text);
    const std::string json = ConfigToJson(c);
    const LlamaConfig d = ParseConfig(json);
    EXPECT_EQ(ConfigToJson(d), json);  // stable text
    EXPECT_EQ(d.hidden_size, c.hidden_size);
    EXPECT_EQ(d.head_dim, c.head_dim);
    EXPECT_EQ(d.rope_theta, c.rope_theta);
    EXPECT_EQ(d.rms_norm_eps, c.rms_norm_eps);
    EXPECT_EQ(d.tie_word_embeddings, c.tie_word_embeddings);
    EXPECT_EQ(d.eos_token_id, c.eos_token_id);
    EXPECT_EQ(d.rope_scaling.has_value(), c.rope_scaling.has_value());
    if (c.rope_scaling) {
      EXPECT_EQ(d.rope_scaling->factor, c.rope_scaling->factor);
    }
  }
}

TEST(Config, LoadConfigNamesTheFile) {
  testing::TempDir dir;
  const auto path = dir / "config.json";
  std::ofstream(path) << "{\"hidden_size\": \"wide\"}";
  try {
    LoadConfig(path);
    FAIL() << "expected an InputError";
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr(path.string()), HasSubstr("\"hidden_size\"")));
  }
  EXPECT_THROW(LoadConfig(dir / "absent.json"), InputError);
}

TEST(Config, SmolLm2PresetMatchesSharedConfig) {
  KVDIFF_REQUIRE_SHARED_DATA(data);
  const LlamaConfig real = LoadConfig(data / "smollm2-135m-instruct" / "config.json");
  EXPECT_EQ(ConfigToJson(PresetConfig("smollm2-135m")), ConfigToJson(real));
}

TEST(Config, SmolLm2PresetMatchesEmbeddedConfig) {
  EXPECT_EQ(ConfigToJson(PresetConfig("smollm2-135m")), ConfigToJson(ParseConfig(kSmolLm2Config)));
}

// The strict form (a scenario's inline config): whatever ConfigToJson writes and config.json's
// parser reads is accepted; anything else is refused naming the field and the source.
TEST(Config, StrictParseAcceptsWhatTheWriterWritesAndRefusesUnknownFields) {
  for (const std::string& preset : PresetNames()) {
    LlamaConfig c = PresetConfig(preset);
    EXPECT_EQ(ConfigToJson(ParseConfigStrict(ConfigToJson(c), "inline")), ConfigToJson(c));
    c.rope_scaling = RopeScaling{};
    EXPECT_EQ(ConfigToJson(ParseConfigStrict(ConfigToJson(c), "inline")), ConfigToJson(c));
  }
  // A real checkpoint's config.json carries bookkeeping keys kvdiff does not read: strict refuses
  // them too (in a hand-written config an unknown key is likelier a typo than bookkeeping).
  EXPECT_THAT(
      [] { ParseConfigStrict(kSmolLm2Config, "inline"); },
      ::testing::ThrowsMessage<InputError>(HasSubstr("inline: unknown field \"_name_or_path\"")));
  nlohmann::json j = nlohmann::json::parse(ConfigToJson(PresetConfig("tiny")));
  j["hiden_size"] = 64;
  EXPECT_NO_THROW(ParseConfig(j.dump())) << "config.json itself ignores unknown keys";
  EXPECT_THAT([&] { ParseConfigStrict(j.dump(), "model.config"); },
              ::testing::ThrowsMessage<InputError>(
                  HasSubstr("model.config: unknown field \"hiden_size\" (expected one of: ")));
  j.erase("hiden_size");
  j["head_dim"] = 15;
  EXPECT_THAT([&] { ParseConfigStrict(j.dump(), "model.config"); },
              ::testing::ThrowsMessage<InputError>(
                  HasSubstr("model.config field \"head_dim\": expected an even number")));
}

}  // namespace
}  // namespace kvdiff::format
