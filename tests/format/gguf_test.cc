// The GGUF writer (format/gguf.h): header, metadata, tensor infos and data read back; the q/k row
// permutation against llama2.c's inverse; f16/bf16; determinism; the reader's refusals; the CLI.
#include "format/gguf.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstring>
#include <fstream>
#include <iterator>

#include "format/error.h"
#include "format/llama2c.h"
#include "format/model_files.h"
#include "format/tokenizer.h"
#include "tests/test_support.h"

namespace kvdiff::format {
namespace {

using ::testing::HasSubstr;

template <typename T>
T Value(const GgufHeader& h, const std::string& key) {
  const GgufKv* kv = h.Find(key);
  EXPECT_NE(kv, nullptr) << key;
  if (!kv) return T{};
  EXPECT_TRUE(std::holds_alternative<T>(kv->value)) << key << " has another type";
  return std::holds_alternative<T>(kv->value) ? std::get<T>(kv->value) : T{};
}

const GgufTensorInfo& TensorNamed(const GgufHeader& h, const std::string& name) {
  for (const auto& t : h.tensors) {
    if (t.name == name) return t;
  }
  throw InputError("no tensor " + name);
}

class GgufTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = MakeRandomModel(PresetConfig("tiny"), 3);
    SaveModel(dir_ / "tiny", model_, DType::kF32);
  }
  testing::TempDir dir_;
  ModelWeights model_;
};

TEST(GgufPermuteTest, InverseOfLlama2cPermutationHeads4HeadDim16) {
  std::vector<float> w(4 * 16 * 3);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i);
  const std::vector<float> gguf = PermuteRopeRowsToInterleaved(w, 4, 16, 3);
  EXPECT_EQ(PermuteRopeRows(gguf, 4, 16, 3), w);
  // Head 1, GGUF row 2i+1 = HF row i + 8 (its rotate-half partner), column 2.
  EXPECT_EQ(gguf[(16 + 2 * 3 + 1) * 3 + 2], w[(16 + 3 + 8) * 3 + 2]);
  EXPECT_EQ(gguf[(16 + 2 * 3) * 3 + 2], w[(16 + 3) * 3 + 2]);
  EXPECT_THROW(PermuteRopeRowsToInterleaved(w, 4, 15, 3), InputError);
  EXPECT_THROW(PermuteRopeRowsToInterleaved(w, 5, 16, 3), InputError);
}

TEST_F(GgufTest, TinyF32HeaderMetadataAndTensorsReadBack) {
  ConvertHfToGguf(dir_ / "tiny", dir_ / "tiny.gguf", DType::kF32);
  const GgufHeader h = ReadGgufHeader(dir_ / "tiny.gguf");
  EXPECT_EQ(h.version, 3u);
  EXPECT_EQ(Value<std::string>(h, "general.architecture"), "llama");
  EXPECT_EQ(Value<uint32_t>(h, "general.file_type"), 0u);
  EXPECT_EQ(Value<uint32_t>(h, "llama.context_length"), 512u);
  EXPECT_EQ(Value<uint32_t>(h, "llama.embedding_length"), 64u);
  EXPECT_EQ(Value<uint32_t>(h, "llama.block_count"), 2u);
  EXPECT_EQ(Value<uint32_t>(h, "llama.feed_forward_length"), 128u);
  EXPECT_EQ(Value<uint32_t>(h, "llama.rope.dimension_count"), 16u);
  EXPECT_EQ(Value<uint32_t>(h, "llama.attention.head_count"), 4u);
  EXPECT_EQ(Value<uint32_t>(h, "llama.attention.head_count_kv"), 2u);
  EXPECT_FLOAT_EQ(Value<float>(h, "llama.attention.layer_norm_rms_epsilon"), 1e-5f);
  EXPECT_FLOAT_EQ(Value<float>(h, "llama.rope.freq_base"), 10000.0f);
  EXPECT_EQ(Value<uint32_t>(h, "llama.vocab_size"), 256u);
  EXPECT_EQ(Value<std::string>(h, "tokenizer.ggml.model"), "none");

  // token_embd, 9 per layer, output_norm, output (untied).
  ASSERT_EQ(h.tensors.size(), 1u + 9 * 2 + 2);
  EXPECT_EQ(h.tensors.front().name, "token_embd.weight");
  EXPECT_EQ(h.tensors.back().name, "output.weight");
  EXPECT_EQ(TensorNamed(h, "token_embd.weight").dims, (std::vector<uint64_t>{64, 256}));
  EXPECT_EQ(TensorNamed(h, "blk.1.attn_k.weight").dims, (std::vector<uint64_t>{64, 32}));
  EXPECT_EQ(TensorNamed(h, "blk.0.ffn_down.weight").dims, (std::vector<uint64_t>{128, 64}));
  EXPECT_EQ(TensorNamed(h, "blk.0.attn_norm.weight").dims, (std::vector<uint64_t>{64}));
  uint64_t previous_end = 0;
  for (const auto& t : h.tensors) {
    EXPECT_EQ(t.type, 0u) << t.name;
    EXPECT_EQ(t.offset % kGgufAlignment, 0u) << t.name;
    EXPECT_GE(t.offset, previous_end) << t.name;
    uint64_t n = 1;
    for (uint64_t d : t.dims) n *= d;
    previous_end = t.offset + n * 4;
  }
  EXPECT_EQ(h.data_offset % kGgufAlignment, 0u);
  EXPECT_GE(std::filesystem::file_size(dir_ / "tiny.gguf"), h.data_offset + previous_end);

  // The data: q rows interleaved, v as it is.
  const std::string file = testing::ReadFile(dir_ / "tiny.gguf");
  auto data_of = [&](const std::string& name, size_t count) {
    std::vector<float> v(count);
    std::memcpy(v.data(), file.data() + h.data_offset + TensorNamed(h, name).offset, count * 4);
    return v;
  };
  const Tensor& q = model_.Get("model.layers.1.self_attn.q_proj.weight");
  EXPECT_EQ(data_of("blk.1.attn_q.weight", q.data.size()),
            PermuteRopeRowsToInterleaved(q.data, 4, 16, 64));
  const Tensor& v = model_.Get("model.layers.0.self_attn.v_proj.weight");
  EXPECT_EQ(data_of("blk.0.attn_v.weight", v.data.size()), v.data);
}

TEST_F(GgufTest, F16AndBf16MatricesKeepNormsF32) {
  ConvertHfToGguf(dir_ / "tiny", dir_ / "f16.gguf", DType::kF16);
  ConvertHfToGguf(dir_ / "tiny", dir_ / "bf16.gguf", DType::kBF16);
  const GgufHeader f16 = ReadGgufHeader(dir_ / "f16.gguf");
  const GgufHeader bf16 = ReadGgufHeader(dir_ / "bf16.gguf");
  EXPECT_EQ(Value<uint32_t>(f16, "general.file_type"), 1u);
  EXPECT_EQ(Value<uint32_t>(bf16, "general.file_type"), 32u);
  EXPECT_EQ(TensorNamed(f16, "blk.0.attn_q.weight").type, 1u);
  EXPECT_EQ(TensorNamed(bf16, "blk.0.attn_q.weight").type, 30u);
  EXPECT_EQ(TensorNamed(f16, "blk.0.ffn_norm.weight").type, 0u);
  EXPECT_EQ(TensorNamed(bf16, "output_norm.weight").type, 0u);
  const std::string file = testing::ReadFile(dir_ / "f16.gguf");
  uint16_t first;
  std::memcpy(&first, file.data() + f16.data_offset + TensorNamed(f16, "token_embd.weight").offset,
              2);
  EXPECT_EQ(first, FloatToF16Bits(model_.Get("model.embed_tokens.weight").data[0]));
}

TEST_F(GgufTest, SameModelGivesByteIdenticalFiles) {
  ConvertHfToGguf(dir_ / "tiny", dir_ / "a.gguf", DType::kF32);
  ConvertHfToGguf(dir_ / "tiny", dir_ / "b.gguf", DType::kF32);
  EXPECT_EQ(testing::ReadFile(dir_ / "a.gguf"), testing::ReadFile(dir_ / "b.gguf"));
  for (const auto& entry : std::filesystem::directory_iterator(dir_.path())) {
    EXPECT_EQ(entry.path().string().find(".tmp"), std::string::npos) << entry.path();
  }
}

TEST_F(GgufTest, TiedHeadHasNoOutputTensor) {
  ModelWeights tied = model_;
  tied.config.tie_word_embeddings = true;
  tied.tensors.erase("lm_head.weight");
  SaveModel(dir_ / "tied", tied, DType::kF32);
  ConvertHfToGguf(dir_ / "tied", dir_ / "tied.gguf", DType::kF32);
  const GgufHeader h = ReadGgufHeader(dir_ / "tied.gguf");
  EXPECT_EQ(h.tensors.size(), 1u + 9 * 2 + 1);
  EXPECT_THROW(TensorNamed(h, "output.weight"), InputError);
}

TEST_F(GgufTest, ReaderRefusesBadMagicAndTruncation) {
  WriteFileAtomically(dir_ / "bad.gguf", "GGUX\x03\0\0\0");
  try {
    ReadGgufHeader(dir_ / "bad.gguf");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(), HasSubstr("expected the magic \"GGUF\""));
  }
  ConvertHfToGguf(dir_ / "tiny", dir_ / "t.gguf", DType::kF32);
  WriteFileAtomically(dir_ / "cut.gguf", testing::ReadFile(dir_ / "t.gguf").substr(0, 300));
  EXPECT_THROW(ReadGgufHeader(dir_ / "cut.gguf"), InputError);
}

TEST(GgufVocabTest, Stories260KCarriesItsSentencePieceVocabulary) {
  KVDIFF_REQUIRE_SHARED_DATA(data);
  testing::TempDir dir;
  ConvertLlama2c(data / "stories260K" / "stories260K.bin", data / "stories260K" / "tok512.bin",
                 dir / "hf");
  ConvertHfToGguf(dir / "hf", dir / "s.gguf", DType::kF32);
  const GgufHeader h = ReadGgufHeader(dir / "s.gguf");
  EXPECT_EQ(Value<std::string>(h, "tokenizer.ggml.model"), "llama");
  const auto tokens = Value<std::vector<std::string>>(h, "tokenizer.ggml.tokens");
  const auto scores = Value<std::vector<float>>(h, "tokenizer.ggml.scores");
  const auto types = Value<std::vector<int32_t>>(h, "tokenizer.ggml.token_type");
  ASSERT_EQ(tokens.size(), 512u);
  ASSERT_EQ(scores.size(), 512u);
  ASSERT_EQ(types.size(), 512u);
  EXPECT_EQ(tokens[0], "<unk>");
  EXPECT_EQ(types[0], 2);                 // unknown
  EXPECT_EQ(types[1], 3);                 // BOS: control
  EXPECT_EQ(tokens[3 + 0x0A], "<0x0A>");  // byte fallback
  EXPECT_EQ(types[3 + 0x0A], 6);
  EXPECT_EQ(Value<uint32_t>(h, "tokenizer.ggml.bos_token_id"), 1u);
  EXPECT_EQ(Value<uint32_t>(h, "llama.embedding_length"), 64u);
  EXPECT_EQ(Value<uint32_t>(h, "llama.attention.head_count_kv"), 4u);
}

TEST_F(GgufTest, CliConvertGgufWritesTheFileAndRefusesABadDtype) {
  const std::string model = testing::ShellQuote((dir_ / "tiny").string());
  auto convert = [&](const std::string& args) {
    return testing::RunKvdiff("convert gguf --model " + model + " " + args, dir_.path());
  };
  const testing::CommandResult made = convert("--out c.gguf");
  EXPECT_EQ(made.exit_code, 0) << made.err;
  ConvertHfToGguf(dir_ / "tiny", dir_ / "d.gguf", DType::kF32);
  EXPECT_EQ(testing::ReadFile(dir_ / "c.gguf"), testing::ReadFile(dir_ / "d.gguf"));
  const testing::CommandResult refused = convert("--dtype f8 --out e.gguf");
  EXPECT_EQ(refused.exit_code, 2) << refused.err;
  EXPECT_FALSE(std::filesystem::exists(dir_ / "e.gguf"));
}

}  // namespace
}  // namespace kvdiff::format
