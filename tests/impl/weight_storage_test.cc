// 16-bit weight storage (bf16, f16): a model whose values are exactly bf16 (or f16) values keeps
// its matrices in 16 bits and widens them inside the kernels. The logits must be the
// float32-storage logits bit for bit on every path: decode (one row), short forwards (the rows
// path, 2..8 rows), prefill tiles (the GEMM path, and attention past one query tile), the tied head
// and an untied one, and for any thread count.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "format/model_files.h"
#include "format/safetensors.h"
#include "impl/kernels.h"
#include "impl/model.h"
#include "impl/session.h"
#include "impl_test_util.h"

namespace kvdiff::impl {
namespace {

using format::DType;

// Bit for bit (memcmp): -0.0 against 0.0 or two different NaNs would fail, as they should.
bool SameBits(const RowMatrix& a, const RowMatrix& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() &&
         std::memcmp(a.data(), b.data(), sizeof(float) * a.size()) == 0;
}

// A random model with every value rounded to dtype and marked as loaded from dtype: what
// LoadModel gives for a checkpoint stored in that dtype.
std::shared_ptr<const format::ModelWeights> RoundedModel(bool tied, DType dtype, uint64_t seed) {
  format::LlamaConfig config = format::PresetConfig("tiny");
  config.tie_word_embeddings = tied;
  format::ModelWeights w = format::MakeRandomModel(config, seed);
  for (auto& [name, t] : w.tensors) {
    for (float& v : t.data) v = format::RoundToDType(v, dtype);
  }
  w.dtype_on_disk = dtype;
  return std::make_shared<const format::ModelWeights>(std::move(w));
}

struct Case {
  bool tied;
  DType dtype;
  const char* storage_name;
};

class WeightStorageTest : public ::testing::TestWithParam<Case> {};

TEST_P(WeightStorageTest, LogitsAreBitIdenticalToFloat32Storage) {
  const Case c = GetParam();
  const auto weights = RoundedModel(c.tied, c.dtype, 7);
  const Model f32(weights, 1, WeightStorage::kF32);
  ASSERT_STREQ(f32.StorageName(), "float32");
  const int64_t vocab = weights->config.vocab_size;
  for (int threads : {1, 2, 3}) {
    SCOPED_TRACE(::testing::Message() << "threads " << threads);
    const Model half(weights, threads);
    ASSERT_STREQ(half.StorageName(), c.storage_name);
    // Uncached: 1 row (matrix-vector), 2..8 rows (rows path), 9+ (GEMM tiles), 140 (past one
    // attention query tile of 128).
    for (int64_t n : {1, 3, 8, 9, 40, 140}) {
      const Tokens tokens = testing::RandomTokens(n, vocab, static_cast<uint32_t>(n));
      EXPECT_TRUE(SameBits(half.ForwardFull(tokens), f32.ForwardFull(tokens))) << "n " << n;
    }
    // Cached: a 20-token prefill, a 3-token chunk, then single-token decode steps.
    Session a = f32.NewSession(), b = half.NewSession();
    const Tokens history = testing::RandomTokens(28, vocab, 99);
    auto chunk = [&](int64_t begin, int64_t end) {
      return Tokens(history.begin() + begin, history.begin() + end);
    };
    EXPECT_TRUE(SameBits(b.Append(chunk(0, 20)), a.Append(chunk(0, 20))));
    EXPECT_TRUE(SameBits(b.Append(chunk(20, 23)), a.Append(chunk(20, 23))));
    for (int64_t i = 23; i < 28; ++i) {
      EXPECT_TRUE(SameBits(b.Append(chunk(i, i + 1)), a.Append(chunk(i, i + 1)))) << "step " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, WeightStorageTest,
                         ::testing::Values(Case{true, DType::kBF16, "bfloat16"},
                                           Case{false, DType::kBF16, "bfloat16"},
                                           Case{true, DType::kF16, "float16"},
                                           Case{false, DType::kF16, "float16"}));

TEST(WeightStorage, Float32CheckpointsAndInexactValuesStayFloat32) {
  // A float32 checkpoint: nothing to narrow.
  EXPECT_STREQ(Model(testing::PresetModel("tiny", 1), 1).StorageName(), "float32");
  // Marked bf16 but holding a value that bf16 cannot represent (weights edited after loading):
  // the model keeps float32 rather than round it.
  format::ModelWeights w = format::MakeRandomModel(format::PresetConfig("tiny"), 1);
  for (auto& [name, t] : w.tensors) {
    for (float& v : t.data) v = format::RoundToDType(v, DType::kBF16);
  }
  w.tensors.at("model.layers.1.mlp.down_proj.weight").data[5] = 1.0f + 1.0f / 1024;
  w.dtype_on_disk = DType::kBF16;
  EXPECT_STREQ(Model(std::make_shared<const format::ModelWeights>(std::move(w)), 1).StorageName(),
               "float32");
  // Forced float32 on a bf16 model.
  EXPECT_STREQ(Model(RoundedModel(true, DType::kBF16, 1), 1, WeightStorage::kF32).StorageName(),
               "float32");
}

TEST(WeightStorage, WideningIsExactForEvery16BitPattern) {
  for (uint32_t bits = 0; bits < 65536; ++bits) {
    const uint16_t b = static_cast<uint16_t>(bits);
    uint16_t back = 0;
    const float bf = WidenBF16(b);
    if (!std::isnan(bf)) {
      ASSERT_TRUE(NarrowExact(bf, WeightDtype::kBF16, &back)) << bits;
      ASSERT_EQ(back, b);
    }
    const float hf = WidenF16(b);
    if (!std::isnan(hf)) {
      ASSERT_TRUE(NarrowExact(hf, WeightDtype::kF16, &back)) << bits;
      ASSERT_EQ(back, b);
      ASSERT_EQ(hf, format::RoundToDType(hf, DType::kF16));
    }
  }
  uint16_t unused = 0;
  EXPECT_FALSE(NarrowExact(1.0f + 1.0f / 1024, WeightDtype::kBF16, &unused));
  EXPECT_TRUE(NarrowExact(1.0f + 1.0f / 1024, WeightDtype::kF16, &unused));
  EXPECT_FALSE(NarrowExact(1e-30f, WeightDtype::kF16, &unused));
}

}  // namespace
}  // namespace kvdiff::impl
