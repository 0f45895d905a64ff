// Model directories (format/model_files.cc): the expected tensors, saving and loading, loading
// errors, sharded checkpoints.
#include "format/model_files.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "format/error.h"
#include "tests/test_support.h"

namespace kvdiff::format {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

TEST(ExpectedTensors, TinyUntiedAndSmolTied) {
  const std::vector<TensorSpec> tiny = ExpectedTensors(PresetConfig("tiny"));
  ASSERT_EQ(tiny.size(), 1u + 2 * 9 + 1 + 1);
  EXPECT_EQ(tiny.front().name, "model.embed_tokens.weight");
  EXPECT_EQ(tiny.front().shape, (std::vector<int64_t>{256, 64}));
  EXPECT_EQ(tiny.back().name, "lm_head.weight");
  std::map<std::string, std::vector<int64_t>> by_name;
  for (const auto& s : tiny) by_name[s.name] = s.shape;
  EXPECT_EQ(by_name.at("model.layers.1.self_attn.q_proj.weight"), (std::vector<int64_t>{64, 64}));
  EXPECT_EQ(by_name.at("model.layers.1.self_attn.k_proj.weight"), (std::vector<int64_t>{32, 64}));
  EXPECT_EQ(by_name.at("model.layers.0.self_attn.v_proj.weight"), (std::vector<int64_t>{32, 64}));
  EXPECT_EQ(by_name.at("model.layers.0.self_attn.o_proj.weight"), (std::vector<int64_t>{64, 64}));
  EXPECT_EQ(by_name.at("model.layers.0.mlp.gate_proj.weight"), (std::vector<int64_t>{128, 64}));
  EXPECT_EQ(by_name.at("model.layers.0.mlp.down_proj.weight"), (std::vector<int64_t>{64, 128}));
  EXPECT_EQ(by_name.at("model.norm.weight"), (std::vector<int64_t>{64}));

  const std::vector<TensorSpec> smol = ExpectedTensors(PresetConfig("smollm2-135m"));
  EXPECT_EQ(smol.size(), 1u + 30 * 9 + 1);
  int64_t params = 0;
  for (const auto& s : smol) {
    EXPECT_NE(s.name, "lm_head.weight");
    int64_t n = 1;
    for (int64_t d : s.shape) n *= d;
    params += n;
  }
  EXPECT_EQ(params, 134515008);  // SmolLM2-135M's published parameter count
}

// --- loading -------------------------------------------------------------------------------------

std::vector<TensorToWrite> ToWrite(const ModelWeights& m) {
  std::vector<TensorToWrite> out;
  for (const TensorSpec& spec : ExpectedTensors(m.config)) {
    out.push_back({spec.name, DType::kF32, spec.shape, m.Get(spec.name).data});
  }
  return out;
}

void WriteModelDir(const std::filesystem::path& dir, const LlamaConfig& config,
                   const std::vector<TensorToWrite>& tensors) {
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << ConfigToJson(config);
  WriteSafetensors(dir / "model.safetensors", tensors);
}

std::string LoadError(const std::filesystem::path& dir) {
  try {
    LoadModel(dir);
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(LoadModel, SaveThenLoadF32IsExact) {
  testing::TempDir dir;
  const ModelWeights m = MakeRandomModel(PresetConfig("tiny"), 5);
  SaveModel(dir.path(), m, DType::kF32);
  const ModelWeights back = LoadModel(dir.path());
  EXPECT_EQ(back.dtype_on_disk, DType::kF32);
  EXPECT_EQ(ConfigToJson(back.config), ConfigToJson(m.config));
  for (const auto& [name, t] : m.tensors) EXPECT_EQ(back.Get(name).data, t.data) << name;
  EXPECT_EQ(&back.LmHead(), &back.Get("lm_head.weight"));
  const ModelFileInfo info = InspectModel(dir.path());
  EXPECT_EQ(info.num_parameters, m.NumParameters());
  EXPECT_EQ(info.num_tensors, 21);
  EXPECT_EQ(info.tensors_by_dtype.at("F32"), 21);
  EXPECT_EQ(info.file_bytes, std::filesystem::file_size(dir / "model.safetensors"));
}

TEST(LoadModel, SaveThenLoadBf16AndF16RoundEachValue) {
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    testing::TempDir dir;
    const ModelWeights m = MakeRandomModel(PresetConfig("tiny"), 5);
    SaveModel(dir.path(), m, dtype);
    const ModelWeights back = LoadModel(dir.path());
    EXPECT_EQ(back.dtype_on_disk, dtype);
    EXPECT_EQ(back.config.torch_dtype, dtype == DType::kBF16 ? "bfloat16" : "float16");
    for (const auto& [name, t] : m.tensors) {
      const std::vector<float>& got = back.Get(name).data;
      for (size_t i = 0; i < t.data.size(); ++i) {
        ASSERT_EQ(got[i], RoundToDType(t.data[i], dtype)) << name << "[" << i << "]";
      }
    }
  }
}

TEST(LoadModel, MissingTensor) {
  testing::TempDir dir;
  const ModelWeights m = MakeRandomModel(PresetConfig("tiny"), 1);
  auto tensors = ToWrite(m);
  tensors.erase(
      std::remove_if(tensors.begin(), tensors.end(),
                     [](const TensorToWrite& t) { return t.name == "model.norm.weight"; }),
      tensors.end());
  WriteModelDir(dir.path(), m.config, tensors);
  EXPECT_THAT(LoadError(dir.path()),
              AllOf(HasSubstr("missing tensor \"model.norm.weight\" (expected shape [64])"),
                    HasSubstr("model.safetensors")));
}

TEST(LoadModel, MissingHeadOfUntiedModelSaysWhy) {
  testing::TempDir dir;
  const ModelWeights m = MakeRandomModel(PresetConfig("tiny"), 1);
  auto tensors = ToWrite(m);
  tensors.pop_back();  // lm_head.weight
  WriteModelDir(dir.path(), m.config, tensors);
  EXPECT_THAT(LoadError(dir.path()),
              AllOf(HasSubstr("missing tensor \"lm_head.weight\" (expected shape [256, 64])"),
                    HasSubstr("tie_word_embeddings is false")));
}

TEST(LoadModel, UnexpectedTensor) {
  testing::TempDir dir;
  const ModelWeights m = MakeRandomModel(PresetConfig("tiny"), 1);
  auto tensors = ToWrite(m);
  tensors.push_back({"model.layers.2.mlp.up_proj.weight", DType::kF32, {2, 2}, {1, 2, 3, 4}});
  WriteModelDir(dir.path(), m.config, tensors);
  EXPECT_THAT(LoadError(dir.path()),
              AllOf(HasSubstr("unexpected tensor \"model.layers.2.mlp.up_proj.weight\" of shape "
                              "[2, 2]"),
                    HasSubstr("2 layers")));
}

TEST(LoadModel, WrongShape) {
  testing::TempDir dir;
  const ModelWeights m = MakeRandomModel(PresetConfig("tiny"), 1);
  auto tensors = ToWrite(m);
  for (auto& t : tensors) {
    if (t.name == "model.layers.1.self_attn.k_proj.weight") {
      t.shape = {64, 32};  // transposed
    }
  }
  WriteModelDir(dir.path(), m.config, tensors);
  EXPECT_THAT(LoadError(dir.path()),
              HasSubstr("tensor \"model.layers.1.self_attn.k_proj.weight\" has shape [64, 32], "
                        "but config.json implies [32, 64]"));
}

TEST(LoadModel, TiedModelIgnoresStoredHeadLikeTransformers) {
  testing::TempDir dir;
  LlamaConfig tied = PresetConfig("tiny");
  tied.tie_word_embeddings = true;
  const ModelWeights m = MakeRandomModel(tied, 1);
  auto tensors = ToWrite(m);
  tensors.push_back({"lm_head.weight", DType::kF32, {256, 64}, std::vector<float>(256 * 64, 9.0f)});
  tensors.push_back({"model.layers.0.self_attn.rotary_emb.inv_freq",
                     DType::kF32,
                     {8},
                     std::vector<float>(8, 1.0f)});
  WriteModelDir(dir.path(), tied, tensors);
  const ModelWeights back = LoadModel(dir.path());
  EXPECT_EQ(back.tensors.count("lm_head.weight"), 0u);
  EXPECT_EQ(&back.LmHead(), &back.Get("model.embed_tokens.weight"));
  EXPECT_EQ(back.NumParameters(), m.NumParameters());
  const ModelFileInfo info = InspectModel(dir.path());
  EXPECT_EQ(info.ignored_tensors.size(), 2u);
}

TEST(LoadModel, DirectoryProblems) {
  testing::TempDir dir;
  EXPECT_THAT(LoadError(dir / "absent"), HasSubstr("does not exist"));
  std::ofstream(dir / "file") << "x";
  EXPECT_THAT(LoadError(dir / "file"), HasSubstr("is not a directory"));
  std::ofstream(dir / "config.json") << ConfigToJson(PresetConfig("tiny"));
  EXPECT_THAT(LoadError(dir.path()), HasSubstr("has no model.safetensors"));
  std::ofstream(dir / "config.json") << "{}";
  EXPECT_THAT(LoadError(dir.path()),
              AllOf(HasSubstr("config.json"), HasSubstr("missing required field")));
}

TEST(LoadModel, ShardedCheckpoint) {
  testing::TempDir dir;
  const ModelWeights m = MakeRandomModel(PresetConfig("tiny"), 2);
  const auto tensors = ToWrite(m);
  std::vector<TensorToWrite> first(tensors.begin(), tensors.begin() + 10);
  std::vector<TensorToWrite> second(tensors.begin() + 10, tensors.end());
  std::ofstream(dir / "config.json") << ConfigToJson(m.config);
  WriteSafetensors(dir / "model-00001-of-00002.safetensors", first);
  WriteSafetensors(dir / "model-00002-of-00002.safetensors", second);
  nlohmann::json index;
  for (const auto& t : first) index["weight_map"][t.name] = "model-00001-of-00002.safetensors";
  for (const auto& t : second) index["weight_map"][t.name] = "model-00002-of-00002.safetensors";
  std::ofstream(dir / "model.safetensors.index.json") << index.dump();
  const ModelWeights back = LoadModel(dir.path());
  for (const auto& [name, t] : m.tensors) EXPECT_EQ(back.Get(name).data, t.data) << name;
  EXPECT_EQ(InspectModel(dir.path()).safetensors_files.size(), 2u);

  // The same tensor in two shards is refused.
  second.push_back(first.front());
  WriteSafetensors(dir / "model-00002-of-00002.safetensors", second);
  EXPECT_THAT(LoadError(dir.path()),
              AllOf(HasSubstr("tensor \"model.embed_tokens.weight\" is in both")));
}

TEST(SaveModel, RefusesModelsNotMatchingTheirConfig) {
  testing::TempDir dir;
  ModelWeights m = MakeRandomModel(PresetConfig("tiny"), 1);
  m.tensors.erase("model.norm.weight");
  try {
    SaveModel(dir.path(), m, DType::kF32);
    FAIL();
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(), HasSubstr("no tensor \"model.norm.weight\""));
  }
}

}  // namespace
}  // namespace kvdiff::format
