// The models kvdiff makes itself (format/random_model.cc): the presets, the deterministic random
// weights (the PRNG re-implemented here from its published definition, and the weight scales
// measured) and the scale knob.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <Eigen/Dense>
#include <cmath>
#include <iostream>

#include "format/error.h"
#include "format/model_files.h"
#include "format/prng.h"

namespace kvdiff::format {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// --- the PRNG, written again from the papers, independent of format/prng.h ---------------
namespace independent {
uint64_t splitmix_next(uint64_t* x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9;
  z = (z ^ (z >> 27)) * 0x94d049bb133111eb;
  return z ^ (z >> 31);
}
uint64_t rotl(const uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
struct Xoshiro {
  uint64_t s[4];
  uint64_t next() {
    const uint64_t result = rotl(s[1] * 5, 7) * 9;
    const uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
  }
};
uint64_t fnv1a(const std::string& s) {
  uint64_t h = 14695981039346656037ull;
  for (char c : s) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h;
}
// The documented recipe: stream seed = seed ^ FNV-1a(name); state = 4 SplitMix64 outputs; a
// sample = (sum of twelve 24-bit uniforms - 6 (2^24 - 1)) / 2^24.
std::vector<double> Samples(uint64_t seed, const std::string& name, int n) {
  uint64_t sm = seed ^ fnv1a(name);
  Xoshiro x;
  for (auto& w : x.s) w = splitmix_next(&sm);
  std::vector<double> out;
  for (int i = 0; i < n; ++i) {
    int64_t sum = 0;
    for (int j = 0; j < 6; ++j) {
      const uint64_t r = x.next();
      sum += static_cast<int64_t>(r >> 40) + static_cast<int64_t>((r >> 16) & 0xFFFFFF);
    }
    out.push_back((static_cast<double>(sum) - 6.0 * 16777215.0) / 16777216.0);
  }
  return out;
}
}  // namespace independent

TEST(Prng, PublishedTestVectors) {
  // SplitMix64 from seed 1234567 (the reference splitmix64.c test vector).
  uint64_t state = 1234567;
  EXPECT_EQ(SplitMix64(state), 6457827717110365317ull);
  EXPECT_EQ(SplitMix64(state), 3203168211198807973ull);
  // FNV-1a 64 of "", "a" and "foobar" (the FNV reference test suite).
  EXPECT_EQ(Fnv1a64(""), 0xcbf29ce484222325ull);
  EXPECT_EQ(Fnv1a64("a"), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(Fnv1a64("foobar"), 0x85944171f73967e8ull);
}

TEST(Prng, NormalMatchesIndependentImplementationAndMoments) {
  Xoshiro256 rng = Xoshiro256::ForStream(42, "some.tensor");
  const std::vector<double> expected = independent::Samples(42, "some.tensor", 100000);
  double sum = 0, sum_sq = 0;
  for (double e : expected) {
    const double z = rng.Normal();
    ASSERT_EQ(z, e);
    sum += z;
    sum_sq += z * z;
  }
  const double mean = sum / expected.size(), var = sum_sq / expected.size() - mean * mean;
  EXPECT_NEAR(mean, 0.0, 0.02);
  EXPECT_NEAR(var, 1.0, 0.02);
}

TEST(Presets, Shapes) {
  const LlamaConfig tiny = PresetConfig("tiny");
  EXPECT_EQ(tiny.hidden_size, 64);
  EXPECT_EQ(tiny.num_hidden_layers, 2);
  EXPECT_EQ(tiny.num_attention_heads, 4);
  EXPECT_EQ(tiny.num_key_value_heads, 2);
  EXPECT_EQ(tiny.head_dim, 16);
  EXPECT_EQ(tiny.intermediate_size, 128);
  EXPECT_EQ(tiny.vocab_size, 256);
  EXPECT_EQ(tiny.max_position_embeddings, 512);
  EXPECT_EQ(tiny.rope_theta, 10000.0);
  EXPECT_EQ(tiny.rms_norm_eps, 1e-5);
  EXPECT_FALSE(tiny.tie_word_embeddings);
  EXPECT_EQ(tiny.torch_dtype, "float32");

  const LlamaConfig smol = PresetConfig("smollm2-135m");
  EXPECT_EQ(smol.hidden_size, 576);
  EXPECT_EQ(smol.num_hidden_layers, 30);
  EXPECT_EQ(smol.num_attention_heads, 9);
  EXPECT_EQ(smol.num_key_value_heads, 3);
  EXPECT_EQ(smol.head_dim, 64);
  EXPECT_EQ(smol.vocab_size, 49152);
  EXPECT_TRUE(smol.tie_word_embeddings);

  try {
    PresetConfig("huge");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr("unknown preset \"huge\""), HasSubstr("tiny"),
                                HasSubstr("smollm2-135m")));
  }
}

TEST(RandomModel, DeterministicPerSeedAndPerTensorStreams) {
  const LlamaConfig tiny = PresetConfig("tiny");
  const ModelWeights a = MakeRandomModel(tiny, 7);
  const ModelWeights b = MakeRandomModel(tiny, 7);
  const ModelWeights c = MakeRandomModel(tiny, 8);
  for (const auto& [name, t] : a.tensors) {
    EXPECT_EQ(t.data, b.Get(name).data) << name;
    EXPECT_NE(t.data, c.Get(name).data) << name;
  }
  // Adding a layer does not shift the other tensors' values.
  LlamaConfig deeper = tiny;
  deeper.num_hidden_layers = 3;
  const ModelWeights d = MakeRandomModel(deeper, 7);
  EXPECT_EQ(d.Get("model.norm.weight").data, a.Get("model.norm.weight").data);
  EXPECT_EQ(d.Get("lm_head.weight").data, a.Get("lm_head.weight").data);
  EXPECT_EQ(d.Get("model.layers.1.mlp.up_proj.weight").data,
            a.Get("model.layers.1.mlp.up_proj.weight").data);
  EXPECT_EQ(a.NumParameters(), 106816);
}

TEST(RandomModel, SampleValuesFollowTheDocumentedRecipe) {
  const ModelWeights m = MakeRandomModel(PresetConfig("tiny"), 7);
  // Untied tiny: embedding N(0, 1); q_proj N(0, (2/sqrt(64))^2); norms 1 + 0.1 z.
  const auto embed = independent::Samples(7, "model.embed_tokens.weight", 4);
  const auto q = independent::Samples(7, "model.layers.1.self_attn.q_proj.weight", 4);
  const auto norm = independent::Samples(7, "model.norm.weight", 4);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(m.Get("model.embed_tokens.weight").data[i], static_cast<float>(embed[i]));
    EXPECT_EQ(m.Get("model.layers.1.self_attn.q_proj.weight").data[i],
              static_cast<float>(q[i] * 0.25));
    EXPECT_NEAR(m.Get("model.norm.weight").data[i], 1.0 + 0.1 * norm[i], 1e-7);
  }
}

// The statistics the scales are designed for (see format/random_model.cc): attention scores with a
// standard deviation of a few units, and logits with a standard deviation of about 3.
struct Stats {
  double score_std, mean_max_attention, logit_std, logit_spread;
};

using Matrix = Eigen::MatrixXd;

Matrix Weight(const ModelWeights& m, const std::string& name) {
  const Tensor& t = m.Get(name);
  Matrix w(t.shape[0], t.shape.size() > 1 ? t.shape[1] : 1);
  for (int64_t i = 0; i < w.rows(); ++i)
    for (int64_t j = 0; j < w.cols(); ++j) w(i, j) = t.data[i * w.cols() + j];
  return w;
}

Matrix RmsNorm(const Matrix& x, const Matrix& w, double eps) {  // x (n, hidden), w (hidden, 1)
  Matrix out = x;
  for (int64_t i = 0; i < x.rows(); ++i) {
    const double rms = std::sqrt(x.row(i).squaredNorm() / x.cols() + eps);
    out.row(i) = (x.row(i) / rms).cwiseProduct(w.col(0).transpose());
  }
  return out;
}

Stats Measure(const ModelWeights& m, int n_tokens) {
  const LlamaConfig& c = m.config;
  const Matrix embed = Weight(m, "model.embed_tokens.weight");
  Matrix x(n_tokens, c.hidden_size);  // a random prompt (fixed tokens), no RoPE: statistics only
  for (int i = 0; i < n_tokens; ++i) x.row(i) = embed.row((i * 37 + 11) % c.vocab_size);
  const Matrix h = RmsNorm(x, Weight(m, "model.layers.0.input_layernorm.weight"), c.rms_norm_eps);
  const Matrix q = h * Weight(m, "model.layers.0.self_attn.q_proj.weight").transpose();
  const Matrix k = h * Weight(m, "model.layers.0.self_attn.k_proj.weight").transpose();
  double sum_sq = 0, max_attention = 0;
  int64_t count = 0;
  for (int64_t head = 0; head < c.num_attention_heads; ++head) {
    const int64_t kv = head / c.NumRep();
    const Matrix qh = q.middleCols(head * c.head_dim, c.head_dim);
    const Matrix kh = k.middleCols(kv * c.head_dim, c.head_dim);
    const Matrix scores = qh * kh.transpose() / std::sqrt(static_cast<double>(c.head_dim));
    for (int i = 0; i < n_tokens; ++i) {
      const Eigen::RowVectorXd row = scores.row(i);
      sum_sq += row.squaredNorm();
      count += row.size();
      const Eigen::RowVectorXd p = (row.array() - row.maxCoeff()).exp().matrix();
      max_attention += p.maxCoeff() / p.sum();
    }
  }
  // Logits of the normalized prompt through the head (what the final norm feeds it).
  const Matrix final_h = RmsNorm(x, Weight(m, "model.norm.weight"), c.rms_norm_eps);
  const Matrix head = c.tie_word_embeddings ? embed : Weight(m, "lm_head.weight");
  const Matrix logits = final_h * head.transpose();
  const double logit_std = std::sqrt(logits.squaredNorm() / logits.size());
  double spread = 0;
  for (int i = 0; i < n_tokens; ++i) spread += logits.row(i).maxCoeff() - logits.row(i).minCoeff();
  return {std::sqrt(sum_sq / count), max_attention / (n_tokens * c.num_attention_heads), logit_std,
          spread / n_tokens};
}

TEST(RandomModel, ScalesGivePeakedAttentionAndSpreadLogits) {
  for (uint64_t seed : {1, 7}) {
    const Stats s = Measure(MakeRandomModel(PresetConfig("tiny"), seed), 32);
    SCOPED_TRACE(::testing::Message() << "tiny seed " << seed);
    EXPECT_GT(s.score_std, 2.5);  // designed: 4
    EXPECT_LT(s.score_std, 6.5);
    EXPECT_GT(s.mean_max_attention, 0.3);  // uniform over 32 keys would be 0.03
    EXPECT_GT(s.logit_std, 2.0);           // designed: 3
    EXPECT_LT(s.logit_std, 4.5);
    EXPECT_GT(s.logit_spread, 5.0);
  }
  LlamaConfig tied = PresetConfig("tiny");
  tied.tie_word_embeddings = true;
  const Stats s = Measure(MakeRandomModel(tied, 3), 32);
  EXPECT_GT(s.score_std, 2.5);
  EXPECT_GT(s.logit_std, 2.0);
  EXPECT_GT(s.logit_spread, 5.0);
}

// --- the scale knob (make-model --scale) ---------------------------------------------------------

TEST(RandomModelScale, ParsesProfilesAndFactorsAndRoundTrips) {
  EXPECT_TRUE(ParseRandomModelScale("default", "--scale").IsDefault());
  EXPECT_EQ(ParseRandomModelScale("demanding", "--scale"), RandomModelScale::Demanding());
  const RandomModelScale s = ParseRandomModelScale("logits=300,scores=2.5", "--scale");
  EXPECT_EQ(s.scores, 2.5);
  EXPECT_EQ(s.activations, 1);
  EXPECT_EQ(s.logits, 300);
  EXPECT_EQ(s.ToString(), "scores=2.5,logits=300");
  for (const RandomModelScale& x : {s, RandomModelScale::Demanding(), RandomModelScale{}}) {
    EXPECT_EQ(ParseRandomModelScale(x.ToString(), "--scale"), x) << x.ToString();
  }
  RandomModelScale odd;
  odd.activations = 1.0 / 3.0;
  EXPECT_EQ(ParseRandomModelScale(odd.ToString(), "--scale"), odd) << "shortest round-trip form";
}

std::string ScaleError(const std::string& text) {
  try {
    ParseRandomModelScale(text, "--scale");
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(RandomModelScale, RefusesBadFactorsNamingThem) {
  EXPECT_THAT(ScaleError(""), HasSubstr("--scale: expected \"default\", \"demanding\""));
  EXPECT_THAT(ScaleError("hard"), HasSubstr("got \"hard\""));
  EXPECT_THAT(ScaleError("temperature=2"),
              HasSubstr("unknown factor \"temperature\" (known: scores, activations, logits)"));
  EXPECT_THAT(ScaleError("scores=2,scores=3"), HasSubstr("factor \"scores\" given twice"));
  EXPECT_THAT(ScaleError("scores=abc"), HasSubstr("scores must be a number, got \"abc\""));
  EXPECT_THAT(ScaleError("scores=2x"), HasSubstr("scores must be a number, got \"2x\""));
  EXPECT_THAT(ScaleError("logits=0"), HasSubstr("logits must be a finite number > 0"));
  EXPECT_THAT(ScaleError("logits=-1"), HasSubstr("logits must be a finite number > 0"));
  EXPECT_THAT(ScaleError("activations=inf"), HasSubstr("activations must be a finite number"));
  EXPECT_THAT(ScaleError("activations=1e31"), HasSubstr("<= 1e30"));
  EXPECT_THAT(ScaleError("scores=2,"), HasSubstr("got \"\" in \"scores=2,\""));
}

// A scaled model is the default one with tensors multiplied: the same PRNG draws, so the default
// scale leaves every bit as it was, and each factor touches only its tensors.
TEST(RandomModelScale, MultipliesOnlyItsTensors) {
  const LlamaConfig tiny = PresetConfig("tiny");
  const ModelWeights base = MakeRandomModel(tiny, 7);
  EXPECT_EQ(MakeRandomModel(tiny, 7, RandomModelScale{}).Get("lm_head.weight").data,
            base.Get("lm_head.weight").data);
  const ModelWeights d = MakeRandomModel(tiny, 7, RandomModelScale::Demanding());
  auto ratio = [&](const std::string& name) {
    return d.Get(name).data[3] / base.Get(name).data[3];
  };
  EXPECT_NEAR(ratio("model.layers.0.self_attn.q_proj.weight"), 5.0, 1e-5);  // sqrt(25)
  EXPECT_NEAR(ratio("model.layers.1.self_attn.k_proj.weight"), 5.0, 1e-5);
  EXPECT_NEAR(ratio("model.embed_tokens.weight") / 1e19, 1.0, 1e-6);
  EXPECT_NEAR(ratio("model.layers.0.self_attn.o_proj.weight") / 1e19, 1.0, 1e-6);
  EXPECT_NEAR(ratio("model.layers.1.mlp.down_proj.weight") / 1e19, 1.0, 1e-6);
  EXPECT_NEAR(ratio("lm_head.weight"), 300.0, 1e-3);
  EXPECT_EQ(d.Get("model.layers.0.self_attn.v_proj.weight").data,
            base.Get("model.layers.0.self_attn.v_proj.weight").data);
  EXPECT_EQ(d.Get("model.norm.weight").data, base.Get("model.norm.weight").data);
  // Tied: the head is the embedding (x1e19), so the final norm's weight carries 300 / 1e19.
  LlamaConfig tied = tiny;
  tied.tie_word_embeddings = true;
  const ModelWeights tb = MakeRandomModel(tied, 7);
  const ModelWeights td = MakeRandomModel(tied, 7, RandomModelScale::Demanding());
  EXPECT_NEAR(td.Get("model.norm.weight").data[0] / tb.Get("model.norm.weight").data[0] / 3e-17,
              1.0, 1e-5);
}

// What the demanding scale achieves, measured like the default's statistics above (layer 0's
// scores over the embedded prompt, and the head over the normalized prompt; Measure normalizes in
// double): scores of std ~100 with a max |score| in the hundreds (float32 exp overflows past
// 88.7), logits in the thousands, and embeddings whose float32 sum of squares overflows.
TEST(RandomModelScale, DemandingReachesScoresInTheHundredsAndLogitsInTheThousands) {
  for (bool tie : {false, true}) {
    LlamaConfig c = PresetConfig("tiny");
    c.tie_word_embeddings = tie;
    const ModelWeights m = MakeRandomModel(c, 7, RandomModelScale::Demanding());
    const Stats s = Measure(m, 32);
    SCOPED_TRACE(::testing::Message() << (tie ? "tied" : "untied"));
    EXPECT_GT(s.score_std, 60);  // designed: 4 x 25 = 100
    EXPECT_LT(s.score_std, 160);
    EXPECT_GT(s.logit_std, 500);  // designed: 3 x 300 = 900
    EXPECT_LT(s.logit_std, 1400);
    EXPECT_GT(s.logit_spread, 3000);
    const Tensor& embed = m.Get("model.embed_tokens.weight");
    float naive = 0;
    for (int64_t i = 0; i < c.hidden_size; ++i) naive += embed.data[i] * embed.data[i];
    if (!tie) {
      EXPECT_TRUE(std::isinf(naive)) << "a float32 sum of squares of one embedding row";
    }
    std::cout << fmt::format(
        "demanding tiny ({}): score std {:.1f}, logit std {:.0f}, spread {:.0f}, "
        "mean max attention {:.2f}\n",
        tie ? "tied" : "untied", s.score_std, s.logit_std, s.logit_spread, s.mean_max_attention);
  }
}

}  // namespace
}  // namespace kvdiff::format
