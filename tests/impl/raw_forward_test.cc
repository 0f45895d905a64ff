// The raw candle-style Model::Forward(tokens, index_pos, cache): unchecked on purpose, it must
// reproduce the three behaviours of candle llama.rs the seed describes (pos0, reuse, reuse1), and
// only refuse what would read or write out of bounds.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "format/error.h"
#include "impl/kernels.h"
#include "impl/model.h"
#include "impl/session.h"
#include "tests/impl/impl_test_util.h"

namespace kvdiff::impl {
namespace {

using ::testing::HasSubstr;
using testing::kTolerance;
using testing::RandomTokens;
using testing::RowDiff;

// A wrong position or a stale cache must move the logits by far more than the tolerance.
constexpr double kClearlyDifferent = 100 * kTolerance;

class RawForwardTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = new Model(testing::RandomModel(testing::NineHeadConfig(), 3), 2);
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }
  static Model* model_;
  // A 24-position conversation fed the correct way (prefill at 0, then each decode at its
  // position), as candle's `ok` driver does.
  KvCache Conversation24() const {
    KvCache cache = model_->NewCache();
    const Tokens prompt = RandomTokens(5, 256, 21);
    model_->Forward(prompt, 0, cache);
    const Tokens replies = RandomTokens(19, 256, 22);
    for (int i = 0; i < 19; ++i) model_->Forward({replies[i]}, 5 + i, cache);
    EXPECT_EQ(cache.Length(), 24);
    return cache;
  }
};
Model* RawForwardTest::model_ = nullptr;

TEST_F(RawForwardTest, CorrectPositionsEqualTheSessionAndTheOracle) {
  const Tokens tokens = RandomTokens(10, 256, 1);
  KvCache cache = model_->NewCache();
  Logits raw(10, 256);
  raw.topRows(6) = model_->Forward(Tokens(tokens.begin(), tokens.begin() + 6), 0, cache);
  for (int i = 6; i < 10; ++i) raw.row(i) = model_->Forward({tokens[i]}, i, cache);
  Session session = model_->NewSession();
  Logits via_session(10, 256);
  via_session.topRows(6) = session.Append(Tokens(tokens.begin(), tokens.begin() + 6));
  for (int i = 6; i < 10; ++i) via_session.row(i) = session.Append({tokens[i]});
  EXPECT_TRUE(raw == via_session);  // the session is the raw call with index_pos = Length()
  const Logits full = model_->ForwardFull(tokens);
  for (int i = 0; i < 10; ++i) EXPECT_LE(RowDiff(raw, i, full, i), kTolerance) << "row " << i;
}

// candle `pos0`: index_pos 0 on every decode step. No error; the first decode step at position 0
// is rotated as position 0 while the prompt's keys sit at 0..4: the output differs silently.
TEST_F(RawForwardTest, Pos0DecodeIsSilentAndWrong) {
  const Tokens prompt = RandomTokens(5, 256, 2);
  const Tokens decoded = {17, 99, 3};
  KvCache wrong = model_->NewCache(), right = model_->NewCache();
  model_->Forward(prompt, 0, wrong);
  model_->Forward(prompt, 0, right);
  Tokens history = prompt;
  for (size_t i = 0; i < decoded.size(); ++i) {
    const Logits w = model_->Forward({decoded[i]}, 0, wrong);  // no throw
    const Logits r = model_->Forward({decoded[i]}, 5 + static_cast<int64_t>(i), right);
    history.push_back(decoded[i]);
    const Logits full = model_->ForwardFull(history);
    EXPECT_LE(RowDiff(r, 0, full, full.rows() - 1), kTolerance);
    EXPECT_GT(RowDiff(w, 0, full, full.rows() - 1), kClearlyDifferent) << "decode step " << i;
  }
  EXPECT_EQ(wrong.Length(), 8);  // K/V appended every time, whatever index_pos said
}

// candle `reuse`: the cache of a 24-position conversation reused for a new 5-token prompt at
// index_pos 0. The mask is (5, 5), the scores (1, 9, 5, 29): candle's broadcast error, verbatim.
TEST_F(RawForwardTest, ReuseWithAMultiTokenPromptThrowsCandlesBroadcastError) {
  KvCache cache = Conversation24();
  try {
    model_->Forward(RandomTokens(5, 256, 23), 0, cache);
    ADD_FAILURE() << "expected ShapeError";
  } catch (const ShapeError& e) {
    EXPECT_STREQ(e.what(), "cannot broadcast [5, 5] to [1, 9, 5, 29]");
  }
  EXPECT_EQ(cache.Length(), 24);  // documented: unlike candle, the cache is left as it was
  // Any other wrong index_pos with s > 1 fails the same way, with its own numbers.
  try {
    model_->Forward(RandomTokens(3, 256, 24), 7, cache);
    ADD_FAILURE() << "expected ShapeError";
  } catch (const ShapeError& e) {
    EXPECT_STREQ(e.what(), "cannot broadcast [3, 10] to [1, 9, 3, 27]");
  }
}

// candle `reuse1`: the same with a one-token prompt: no mask, no error; the token attends to the
// old conversation (it "keeps talking about France").
TEST_F(RawForwardTest, ReuseWithOneTokenSilentlyContinuesTheOldConversation) {
  KvCache cache = Conversation24();
  const Logits reused = model_->Forward({42}, 0, cache);
  EXPECT_EQ(cache.Length(), 25);
  const Logits fresh = model_->ForwardFull({42});
  EXPECT_GT(RowDiff(reused, 0, fresh, 0), kClearlyDifferent);
}

TEST_F(RawForwardTest, OnlyOutOfBoundsAccessIsRefused) {
  KvCache cache = model_->NewCache(/*capacity=*/6);
  auto expect_error = [&](auto call, const std::string& text) {
    try {
      call();
      ADD_FAILURE() << "expected InputError containing: " << text;
    } catch (const InputError& e) {
      EXPECT_THAT(e.what(), HasSubstr(text));
    }
  };
  expect_error(
      [&] {
        model_->Forward({1, 256}, 0, cache);
      },
      "token id 256 at index 1 is out of range for vocab_size 256");
  expect_error([&] { model_->Forward({}, 0, cache); }, "tokens is empty");
  expect_error([&] { model_->Forward({1}, 512, cache); },
               "index_pos 512 with 1 tokens runs past max_position_embeddings 512");
  expect_error([&] { model_->Forward({1}, -1, cache); }, "index_pos -1");
  model_->Forward({1, 2, 3, 4}, 0, cache);
  expect_error(
      [&] {
        model_->Forward({1, 2, 3}, 4, cache);
      },
      "cache holds 4 positions of capacity 6: 3 more tokens do not fit");
  // A wrong index_pos is fine as long as it stays inside the RoPE table (candle's pos0).
  model_->Forward({5}, 400, cache);
  EXPECT_EQ(cache.Length(), 5);
  KvCache other = KvCache(format::PresetConfig("tiny"));
  expect_error([&] { model_->Forward({1}, 0, other); },
               "cache has 2 layers of kv_dim 32, the model needs 2 layers of kv_dim 48");
}

// Issue 2: random weights must make a wrong position visible. The logits of a random prompt span
// several units, and attention is peaked, not uniform.
TEST(RandomModelScaleTest, TinyLogitsSpreadAndAttentionIsPeaked) {
  auto weights = testing::PresetModel("tiny", 7);
  Model model(weights, 1);
  const format::LlamaConfig& c = model.config();
  const Tokens prompt = RandomTokens(32, c.vocab_size, 5);
  const Logits logits = model.ForwardFull(prompt);
  const double spread = logits.row(31).maxCoeff() - logits.row(31).minCoeff();
  EXPECT_GT(spread, 1.0);
  std::printf("tiny logit spread (max - min of the last row) = %.2f\n", spread);

  // Layer-0 attention of the last position, recomputed here in double from the weights.
  const int64_t n = 32, hidden = c.hidden_size, d = c.head_dim, nh = c.num_attention_heads;
  const int64_t n_rep = c.NumRep();
  const auto& embed = weights->Get("model.embed_tokens.weight").data;
  const auto& norm = weights->Get("model.layers.0.input_layernorm.weight").data;
  const auto& wq = weights->Get("model.layers.0.self_attn.q_proj.weight").data;
  const auto& wk = weights->Get("model.layers.0.self_attn.k_proj.weight").data;
  const RopeTable rope = BuildRopeTable(c);
  auto project = [&](const std::vector<float>& w, int64_t rows, int64_t pos, int64_t heads) {
    std::vector<double> x(hidden), out(rows);
    double ms = 0;
    for (int64_t i = 0; i < hidden; ++i) ms += std::pow(embed[prompt[pos] * hidden + i], 2);
    for (int64_t i = 0; i < hidden; ++i)
      x[i] = embed[prompt[pos] * hidden + i] / std::sqrt(ms / hidden + c.rms_norm_eps) * norm[i];
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < hidden; ++i) out[r] += w[r * hidden + i] * x[i];
    std::vector<double> rotated(out);
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t j = 0; j < d / 2; ++j) {
        const double cs = rope.Cos(pos)[j], sn = rope.Sin(pos)[j];
        rotated[h * d + j] = out[h * d + j] * cs - out[h * d + j + d / 2] * sn;
        rotated[h * d + j + d / 2] = out[h * d + j + d / 2] * cs + out[h * d + j] * sn;
      }
    return rotated;
  };
  const std::vector<double> q = project(wq, c.QDim(), n - 1, nh);
  std::vector<std::vector<double>> keys;
  for (int64_t p = 0; p < n; ++p) keys.push_back(project(wk, c.KvDim(), p, c.num_key_value_heads));
  double mean_max_weight = 0;
  for (int64_t h = 0; h < nh; ++h) {
    std::vector<double> w(n);
    double max = -1e300, sum = 0;
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t k = 0; k < d; ++k) w[j] += q[h * d + k] * keys[j][(h / n_rep) * d + k];
      w[j] /= std::sqrt(static_cast<double>(d));
      max = std::max(max, w[j]);
    }
    for (double& v : w) sum += v = std::exp(v - max);
    mean_max_weight += *std::max_element(w.begin(), w.end()) / sum / nh;
  }
  std::printf("tiny layer-0 attention: mean max weight %.3f over %ld keys (uniform %.3f)\n",
              mean_max_weight, static_cast<long>(n), 1.0 / n);
  EXPECT_GT(mean_max_weight, 4.0 / n);  // at least 4x the uniform weight on the favourite key
}

}  // namespace
}  // namespace kvdiff::impl
