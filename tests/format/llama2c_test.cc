// llama2.c checkpoints: header checks, refusal of inconsistent files, the wq/wk RoPE permutation
// (proved on a synthetic checkpoint against llama2.c's own interleaved RoPE), and the conversion
// of the real stories260K.
#include "format/llama2c.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "format/error.h"
#include "format/tokenizer.h"
#include "tests/test_support.h"

namespace kvdiff::format {
namespace {

using ::testing::HasSubstr;

// The arrays of a llama2.c checkpoint as the file stores them, so tests can compare against them.
struct RawCheckpoint {
  Llama2cHeader header;
  std::vector<float> embedding, rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3, rms_final, freq, wcls;
};

RawCheckpoint MakeRaw(const Llama2cHeader& h, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.5f);
  auto fill = [&](int64_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = normal(rng);
    return v;
  };
  const int64_t vocab = std::abs(h.vocab_size), d = h.dim, l = h.n_layers, hid = h.hidden_dim;
  const int64_t kv = h.n_kv_heads * (d / h.n_heads);
  RawCheckpoint raw;
  raw.header = h;
  raw.embedding = fill(vocab * d);
  raw.rms_att = fill(l * d);
  raw.wq = fill(l * d * d);
  raw.wk = fill(l * kv * d);
  raw.wv = fill(l * kv * d);
  raw.wo = fill(l * d * d);
  raw.rms_ffn = fill(l * d);
  raw.w1 = fill(l * hid * d);
  raw.w2 = fill(l * d * hid);
  raw.w3 = fill(l * hid * d);
  raw.rms_final = fill(d);
  raw.freq = fill(h.seq_len * (d / h.n_heads));
  if (h.vocab_size < 0) raw.wcls = fill(vocab * d);
  return raw;
}

std::string Serialize(const RawCheckpoint& raw) {
  std::string out(reinterpret_cast<const char*>(&raw.header), sizeof(int32_t) * 7);
  for (const auto* v :
       {&raw.embedding, &raw.rms_att, &raw.wq, &raw.wk, &raw.wv, &raw.wo, &raw.rms_ffn, &raw.w1,
        &raw.w2, &raw.w3, &raw.rms_final, &raw.freq, &raw.wcls}) {
    out.append(reinterpret_cast<const char*>(v->data()), v->size() * sizeof(float));
  }
  return out;
}

void WriteBytes(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
}

std::string ErrorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no InputError)";
}

// (rows, cols) row-major times x.
std::vector<double> MatVec(const std::vector<float>& w, int64_t offset, int64_t rows, int64_t cols,
                           const std::vector<double>& x) {
  std::vector<double> y(rows, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) y[r] += w[offset + r * cols + c] * x[c];
  }
  return y;
}

// llama2.c's RoPE: pairs (2i, 2i+1) of each head rotate by pos / 10000^(2i / head_dim).
void RopeInterleaved(std::vector<double>& v, int64_t head_dim, int64_t pos) {
  for (size_t i = 0; i < v.size(); i += 2) {
    const double freq = 1.0 / std::pow(10000.0, static_cast<double>(i % head_dim) / head_dim);
    const double c = std::cos(pos * freq), s = std::sin(pos * freq);
    const double v0 = v[i], v1 = v[i + 1];
    v[i] = v0 * c - v1 * s;
    v[i + 1] = v0 * s + v1 * c;
  }
}

// HF's rotate-half RoPE (spec step 3): j pairs with j + head_dim/2.
void RopeHalf(std::vector<double>& v, int64_t head_dim, int64_t pos) {
  const int64_t half = head_dim / 2;
  for (size_t base = 0; base < v.size(); base += head_dim) {
    for (int64_t j = 0; j < half; ++j) {
      const double freq = 1.0 / std::pow(10000.0, 2.0 * j / head_dim);
      const double c = std::cos(pos * freq), s = std::sin(pos * freq);
      const double a = v[base + j], b = v[base + j + half];
      v[base + j] = a * c - b * s;
      v[base + j + half] = b * c + a * s;
    }
  }
}

// Attention scores q_h . k_{h / n_rep} for every query head.
std::vector<double> Scores(const std::vector<double>& q, const std::vector<double>& k,
                           int64_t n_heads, int64_t n_kv_heads, int64_t head_dim) {
  std::vector<double> out;
  for (int64_t h = 0; h < n_heads; ++h) {
    const int64_t g = h / (n_heads / n_kv_heads);
    double dot = 0;
    for (int64_t j = 0; j < head_dim; ++j) dot += q[h * head_dim + j] * k[g * head_dim + j];
    out.push_back(dot);
  }
  return out;
}

// dim 32, 4 query heads and 2 KV heads of head_dim 8, untied classifier.
const Llama2cHeader kSmall{32, 48, 2, 4, 2, -300, 16};

TEST(Llama2cTest, ReadsSyntheticCheckpoint) {
  kvdiff::testing::TempDir dir;
  const RawCheckpoint raw = MakeRaw(kSmall, 1);
  WriteBytes(dir / "m.bin", Serialize(raw));
  const ModelWeights model = ReadLlama2cCheckpoint(dir / "m.bin");
  const LlamaConfig& c = model.config;
  EXPECT_EQ(c.hidden_size, 32);
  EXPECT_EQ(c.intermediate_size, 48);
  EXPECT_EQ(c.num_hidden_layers, 2);
  EXPECT_EQ(c.num_attention_heads, 4);
  EXPECT_EQ(c.num_key_value_heads, 2);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.vocab_size, 300);
  EXPECT_EQ(c.max_position_embeddings, 16);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_id, 2);

  // Exactly the tensors the config calls for, with their shapes.
  const auto expected = ExpectedTensors(c);
  ASSERT_EQ(model.tensors.size(), expected.size());
  for (const auto& spec : expected) {
    ASSERT_TRUE(model.tensors.count(spec.name)) << spec.name;
    EXPECT_EQ(model.tensors.at(spec.name).shape, spec.shape) << spec.name;
  }
  // Unpermuted tensors are the file's arrays; the classifier is the trailing wcls.
  EXPECT_EQ(model.Get("model.embed_tokens.weight").data, raw.embedding);
  EXPECT_EQ(model.Get("lm_head.weight").data, raw.wcls);
  EXPECT_EQ(model.Get("model.norm.weight").data, raw.rms_final);
  const int64_t d = 32, kv = 16, hid = 48;
  auto slice = [](const std::vector<float>& v, int64_t l, int64_t n) {
    return std::vector<float>(v.begin() + l * n, v.begin() + (l + 1) * n);
  };
  EXPECT_EQ(model.Get("model.layers.1.input_layernorm.weight").data, slice(raw.rms_att, 1, d));
  EXPECT_EQ(model.Get("model.layers.1.post_attention_layernorm.weight").data,
            slice(raw.rms_ffn, 1, d));
  EXPECT_EQ(model.Get("model.layers.1.self_attn.v_proj.weight").data, slice(raw.wv, 1, kv * d));
  EXPECT_EQ(model.Get("model.layers.1.self_attn.o_proj.weight").data, slice(raw.wo, 1, d * d));
  EXPECT_EQ(model.Get("model.layers.1.mlp.gate_proj.weight").data, slice(raw.w1, 1, hid * d));
  EXPECT_EQ(model.Get("model.layers.1.mlp.down_proj.weight").data, slice(raw.w2, 1, d * hid));
  EXPECT_EQ(model.Get("model.layers.1.mlp.up_proj.weight").data, slice(raw.w3, 1, hid * d));
}

TEST(Llama2cTest, PermutationTurnsInterleavedRopeIntoRotateHalf) {
  kvdiff::testing::TempDir dir;
  const RawCheckpoint raw = MakeRaw(kSmall, 2);
  WriteBytes(dir / "m.bin", Serialize(raw));
  const ModelWeights model = ReadLlama2cCheckpoint(dir / "m.bin");
  const int64_t d = 32, nh = 4, nkv = 2, hd = 8, kv = nkv * hd;

  std::mt19937 rng(3);
  std::normal_distribution<double> normal;
  for (int64_t layer = 0; layer < 2; ++layer) {
    const auto& q_hf_w =
        model.Get(fmt::format("model.layers.{}.self_attn.q_proj.weight", layer)).data;
    const auto& k_hf_w =
        model.Get(fmt::format("model.layers.{}.self_attn.k_proj.weight", layer)).data;
    for (int64_t pos_q : {0, 1, 5, 15}) {
      for (int64_t pos_k : {int64_t{0}, int64_t{3}, pos_q}) {
        std::vector<double> xq(d), xk(d);
        for (auto& v : xq) v = normal(rng);
        for (auto& v : xk) v = normal(rng);
        // llama2.c: original rows, interleaved RoPE.
        auto q_l2c = MatVec(raw.wq, layer * d * d, d, d, xq);
        auto k_l2c = MatVec(raw.wk, layer * kv * d, kv, d, xk);
        RopeInterleaved(q_l2c, hd, pos_q);
        RopeInterleaved(k_l2c, hd, pos_k);
        // HF: permuted rows, rotate-half RoPE.
        auto q_hf = MatVec(q_hf_w, 0, d, d, xq);
        auto k_hf = MatVec(k_hf_w, 0, kv, d, xk);
        RopeHalf(q_hf, hd, pos_q);
        RopeHalf(k_hf, hd, pos_k);
        // Same rotated vectors up to the per-head reordering...
        for (int64_t h = 0; h < nh; ++h) {
          for (int64_t r = 0; r < hd / 2; ++r) {
            EXPECT_NEAR(q_hf[h * hd + r], q_l2c[h * hd + 2 * r], 1e-9);
            EXPECT_NEAR(q_hf[h * hd + hd / 2 + r], q_l2c[h * hd + 2 * r + 1], 1e-9);
          }
        }
        // ...hence the same attention scores, which is all attention sees of q and k.
        const auto s_l2c = Scores(q_l2c, k_l2c, nh, nkv, hd);
        const auto s_hf = Scores(q_hf, k_hf, nh, nkv, hd);
        for (int64_t h = 0; h < nh; ++h) {
          EXPECT_NEAR(s_hf[h], s_l2c[h], 1e-9)
              << "layer " << layer << " head " << h << " pos_q " << pos_q << " pos_k " << pos_k;
        }
        // Not vacuous: the unpermuted rows under rotate-half RoPE give other scores once the
        // positions differ.
        if (pos_q != pos_k) {
          auto q_raw = MatVec(raw.wq, layer * d * d, d, d, xq);
          auto k_raw = MatVec(raw.wk, layer * kv * d, kv, d, xk);
          RopeHalf(q_raw, hd, pos_q);
          RopeHalf(k_raw, hd, pos_k);
          const auto s_wrong = Scores(q_raw, k_raw, nh, nkv, hd);
          double max_diff = 0;
          for (int64_t h = 0; h < nh; ++h)
            max_diff = std::max(max_diff, std::abs(s_wrong[h] - s_l2c[h]));
          EXPECT_GT(max_diff, 1e-3) << "pos_q " << pos_q << " pos_k " << pos_k;
        }
      }
    }
  }
}

TEST(Llama2cTest, PermuteRopeRowsMapsRows) {
  // 2 heads of head_dim 4, 1 input feature: row i holds the value i.
  std::vector<float> w = {0, 1, 2, 3, 4, 5, 6, 7};
  EXPECT_EQ(PermuteRopeRows(w, 2, 4, 1), (std::vector<float>{0, 2, 1, 3, 4, 6, 5, 7}));
  EXPECT_THAT(ErrorOf([&] { PermuteRopeRows(w, 2, 4, 2); }),
              HasSubstr("weight has 8 values, expected 2 x 4 x 2 = 16"));
}

TEST(Llama2cTest, RefusesFilesInconsistentWithTheHeader) {
  kvdiff::testing::TempDir dir;
  const Llama2cHeader tied{32, 48, 2, 4, 2, 300, 16};
  const std::string good = Serialize(MakeRaw(tied, 4));
  const int64_t size = static_cast<int64_t>(good.size());
  EXPECT_EQ(tied.ExpectedFileBytes(), size);

  WriteBytes(dir / "short.bin", good.substr(0, good.size() - 4));
  EXPECT_THAT(ErrorOf([&] { ReadLlama2cCheckpoint(dir / "short.bin"); }),
              HasSubstr(fmt::format("implies {} bytes (tied classifier), the file has {} bytes",
                                    size, size - 4)));
  WriteBytes(dir / "long.bin", good + std::string(8, '\0'));
  EXPECT_THAT(ErrorOf([&] { ReadLlama2cCheckpoint(dir / "long.bin"); }),
              HasSubstr(fmt::format("implies {} bytes (tied classifier), the file has {} bytes",
                                    size, size + 8)));
  // A tied file whose header claims an untied classifier misses vocab * dim floats.
  std::string flipped = good;
  const int32_t untied = -300;
  std::memcpy(flipped.data() + 5 * 4, &untied, 4);
  WriteBytes(dir / "flipped.bin", flipped);
  EXPECT_THAT(ErrorOf([&] { ReadLlama2cCheckpoint(dir / "flipped.bin"); }),
              HasSubstr(fmt::format("implies {} bytes (untied classifier at the end), the file "
                                    "has {} bytes",
                                    size + 300 * 32 * 4, size)));
  WriteBytes(dir / "tiny.bin", good.substr(0, 10));
  EXPECT_THAT(
      ErrorOf([&] { ReadLlama2cCheckpoint(dir / "tiny.bin"); }),
      HasSubstr("expected at least 28 bytes for the header (7 int32), the file has 10 bytes"));
  EXPECT_THAT(ErrorOf([&] { ReadLlama2cCheckpoint(dir / "absent.bin"); }),
              HasSubstr("not a readable file"));
}

TEST(Llama2cTest, RefusesAbsurdHeaders) {
  kvdiff::testing::TempDir dir;
  auto error_for = [&](Llama2cHeader h) {
    // A header followed by a little data: the header check must fire before any allocation.
    std::string bytes(reinterpret_cast<const char*>(&h), 28);
    bytes += std::string(64, '\0');
    WriteBytes(dir / "h.bin", bytes);
    return ErrorOf([&] { ReadLlama2cCheckpoint(dir / "h.bin"); });
  };
  EXPECT_THAT(error_for({0, 48, 2, 4, 2, 300, 16}), HasSubstr("dim must be positive, got 0"));
  EXPECT_THAT(error_for({32, -1, 2, 4, 2, 300, 16}),
              HasSubstr("hidden_dim must be positive, got -1"));
  EXPECT_THAT(error_for({32, 48, 2, -4, 2, 300, 16}),
              HasSubstr("n_heads must be positive, got -4"));
  EXPECT_THAT(error_for({32, 48, 2, 4, 2, 300, 0}), HasSubstr("seq_len must be positive, got 0"));
  EXPECT_THAT(error_for({32, 48, 2, 4, 2, 0, 16}), HasSubstr("vocab_size must be non-zero"));
  EXPECT_THAT(error_for({32, 48, 2, 4, 2, 2, 16}), HasSubstr("|vocab_size| must be at least 3"));
  EXPECT_THAT(error_for({30, 48, 2, 4, 2, 300, 16}), HasSubstr("n_heads 4 must divide dim 30"));
  EXPECT_THAT(error_for({32, 48, 2, 4, 3, 300, 16}),
              HasSubstr("n_kv_heads 3 must divide n_heads 4"));
  EXPECT_THAT(error_for({12, 48, 2, 4, 2, 300, 16}),
              HasSubstr("head_dim = dim / n_heads = 3 must be even"));
  // Sizes whose byte count does not fit in 64 bits, and ones that fit but not this file.
  EXPECT_THAT(error_for({1 << 30, 1 << 30, 1 << 30, 2, 1, 300, 16}),
              HasSubstr("overflows 64 bits"));
  EXPECT_THAT(error_for({1 << 16, 1 << 16, 1 << 10, 2, 1, 300, 16}),
              HasSubstr("the file has 92 bytes"));
  // The message names every header field.
  EXPECT_THAT(
      error_for({30, 48, 2, 4, 2, 300, 16}),
      HasSubstr(
          "dim=30 hidden_dim=48 n_layers=2 n_heads=4 n_kv_heads=2 vocab_size=300 seq_len=16"));
}

TEST(Llama2cTest, ConvertsAndLoadsSynthetic) {
  kvdiff::testing::TempDir dir;
  WriteBytes(dir / "m.bin", Serialize(MakeRaw(kSmall, 5)));
  ConvertLlama2c(dir / "m.bin", "", dir / "out");
  EXPECT_FALSE(std::filesystem::exists(dir / "out" / kTokenizerFileName));
  const ModelWeights loaded = LoadModel(dir / "out");
  const ModelWeights direct = ReadLlama2cCheckpoint(dir / "m.bin");
  EXPECT_FALSE(loaded.config.tie_word_embeddings);
  ASSERT_EQ(loaded.tensors.size(), direct.tensors.size());
  for (const auto& [name, tensor] : direct.tensors) {
    EXPECT_EQ(loaded.Get(name).shape, tensor.shape) << name;
    EXPECT_EQ(loaded.Get(name).data, tensor.data) << name;
  }
}

TEST(Llama2cTest, Stories260K) {
  KVDIFF_REQUIRE_SHARED_DATA(data);
  const auto dir = data / "stories260K";
  const Llama2cHeader header = ReadLlama2cHeader(dir / "stories260K.bin");
  // The values the data README documents.
  EXPECT_EQ(header.dim, 64);
  EXPECT_EQ(header.hidden_dim, 172);
  EXPECT_EQ(header.n_layers, 5);
  EXPECT_EQ(header.n_heads, 8);
  EXPECT_EQ(header.n_kv_heads, 4);
  EXPECT_EQ(header.vocab_size, 512);
  EXPECT_EQ(header.seq_len, 512);
  EXPECT_EQ(header.ExpectedFileBytes(), 1056540);

  kvdiff::testing::TempDir out;
  ConvertLlama2c(dir / "stories260K.bin", dir / "tok512.bin", out.path());
  const ModelWeights model = LoadModel(out.path());
  EXPECT_TRUE(model.config.tie_word_embeddings);
  EXPECT_EQ(model.config.head_dim, 8);
  EXPECT_EQ(model.config.KvDim(), 32);
  EXPECT_EQ(model.config.max_position_embeddings, 512);
  EXPECT_EQ(model.tensors.size(), ExpectedTensors(model.config).size());
  EXPECT_FALSE(model.tensors.count("lm_head.weight"));
  // 260K parameters: every float of the file but the two RoPE tables, tied head counted once.
  EXPECT_EQ(model.NumParameters(), (1056540 - 28) / 4 - 512 * 8);
  const Tokenizer tok = Tokenizer::Load(out / kTokenizerFileName);
  EXPECT_EQ(tok.VocabSize(), 512);
}

// Random headers (mixing small, negative, huge and boundary values) over a small file: always a
// refusal with InputError, never a crash or a huge allocation. Seeded, so a failure replays.
TEST(Llama2cTest, RandomHeadersAreRefused) {
  kvdiff::testing::TempDir dir;
  std::mt19937 rng(7);
  const std::vector<int32_t> special = {0,  1,  2,    3,         4,         8,
                                        64, -1, -512, INT32_MAX, INT32_MIN, 1 << 20};
  for (int trial = 0; trial < 300; ++trial) {
    int32_t fields[7];
    for (int32_t& f : fields) {
      f = rng() % 2 ? special[rng() % special.size()] : static_cast<int32_t>(rng() % 128);
    }
    std::string bytes(reinterpret_cast<const char*>(fields), sizeof(fields));
    bytes += std::string(rng() % 4096, '\0');
    WriteBytes(dir / "h.bin", bytes);
    try {
      ReadLlama2cCheckpoint(dir / "h.bin");
      ADD_FAILURE() << "trial " << trial << ": a random header was accepted";
    } catch (const InputError&) {
    } catch (const std::exception& e) {
      ADD_FAILURE() << "trial " << trial << ": unexpected " << e.what();
    }
  }
}

}  // namespace
}  // namespace kvdiff::format
