// The LibTorch reference on its own: against plain double loops, cached against uncached, ref
// against ref64, the DynamicCache semantics transformers has (reuse continues the conversation),
// and its errors.
#include "reference/reference_model.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <iostream>
#include <string>
#include <vector>

#include "format/error.h"
#include "tests/reference/naive_llama.h"
#include "tests/reference/reference_test_util.h"

namespace kvdiff::ref {
namespace {

using ::kvdiff::testing::ChunksString;
using ::kvdiff::testing::MakeWeights;
using ::kvdiff::testing::MaxAbsDiff;
using ::kvdiff::testing::RandomChunks;
using ::kvdiff::testing::RandomTokens;
using ::kvdiff::testing::Rows;
using ::kvdiff::testing::Slice;
using ::kvdiff::testing::TinyConfig;
using ::testing::AllOf;
using ::testing::HasSubstr;

// The cached/uncached gate of the whole project; float32 summation order alone stays ~1e-6.
constexpr double kTolerance = 1e-4;
constexpr int kThreads = 2;

const char* Name(Precision p) { return p == Precision::kFloat64 ? "ref64" : "ref"; }

// Feeds tokens in the given chunks through one cache; returns the logits of every position.
Logits ForwardChunked(const ReferenceModel& model, const Tokens& tokens,
                      const std::vector<int64_t>& chunks, DynamicCache& cache) {
  Logits all(static_cast<Eigen::Index>(tokens.size()), model.config().vocab_size);
  int64_t done = 0;
  for (int64_t c : chunks) {
    all.middleRows(done, c) = model.Forward(Slice(tokens, done, c), cache);
    done += c;
  }
  return all;
}

struct Variant {
  uint64_t seed;
  bool tied;
  bool llama3;
  std::string Label() const {
    return "seed=" + std::to_string(seed) + (tied ? ",tied" : ",untied") +
           (llama3 ? ",llama3" : "");
  }
};
const std::vector<Variant> kVariants = {
    {1, true, false}, {2, false, false}, {3, true, true}, {4, false, true}};

// ---- The reference against the spec written as double loops ----

TEST(ReferenceModel, MatchesNaiveDoubleLoopsOnTiny) {
  for (const Variant& v : kVariants) {
    SCOPED_TRACE(v.Label());
    auto weights = MakeWeights(TinyConfig(v.tied, v.llama3), v.seed);
    const Tokens tokens = RandomTokens(12, weights->config.vocab_size, v.seed + 100);
    const Eigen::MatrixXd naive = ::kvdiff::testing::NaiveForward(*weights, tokens);
    const RowMatrix naive_f = naive.cast<float>();
    for (Precision p : {Precision::kFloat32, Precision::kFloat64}) {
      ReferenceModel model(weights, p, kThreads);
      const Logits logits = model.ForwardFull(tokens);
      const double diff = MaxAbsDiff(logits, naive_f, Name(p));
      // ref64 differs from the loops only by the final cast to float (and summation order).
      EXPECT_LE(diff, p == Precision::kFloat64 ? 1e-5 : kTolerance) << Name(p);
    }
  }
}

// ---- Cached equals uncached at every position ----

TEST(ReferenceModel, CachedTokenByTokenEqualsUncached) {
  for (const Variant& v : kVariants) {
    auto weights = MakeWeights(TinyConfig(v.tied, v.llama3), v.seed);
    const Tokens tokens = RandomTokens(40, weights->config.vocab_size, v.seed + 7);
    for (Precision p : {Precision::kFloat32, Precision::kFloat64}) {
      SCOPED_TRACE(std::string(Name(p)) + " " + v.Label());
      ReferenceModel model(weights, p, kThreads);
      const Logits full = model.ForwardFull(tokens);
      DynamicCache cache;
      for (int64_t i = 0; i < static_cast<int64_t>(tokens.size()); ++i) {
        const Logits row = model.Forward({tokens[i]}, cache);
        ASSERT_EQ(cache.GetSeqLength(), i + 1);
        EXPECT_LE(MaxAbsDiff(row, Rows(full, i, 1), "position " + std::to_string(i)), kTolerance)
            << "position " << i;
      }
    }
  }
}

TEST(ReferenceModel, CachedRandomChunksEqualsUncached) {
  for (const Variant& v : kVariants) {
    auto weights = MakeWeights(TinyConfig(v.tied, v.llama3), v.seed);
    const Tokens tokens = RandomTokens(50, weights->config.vocab_size, v.seed + 11);
    for (Precision p : {Precision::kFloat32, Precision::kFloat64}) {
      ReferenceModel model(weights, p, kThreads);
      const Logits full = model.ForwardFull(tokens);
      for (uint64_t chunk_seed = 0; chunk_seed < 4; ++chunk_seed) {
        const auto chunks = RandomChunks(50, 9, 1000 * v.seed + chunk_seed);
        SCOPED_TRACE(std::string(Name(p)) + " prefill(n=50,chunks=" + ChunksString(chunks) + "," +
                     v.Label() + ")");
        DynamicCache cache;
        const Logits cached = ForwardChunked(model, tokens, chunks, cache);
        for (Eigen::Index i = 0; i < full.rows(); ++i) {
          EXPECT_LE(MaxAbsDiff(Rows(cached, i, 1), Rows(full, i, 1), "row"), kTolerance)
              << "position " << i;
        }
      }
    }
  }
}

// ---- ref (float32) against the float64 arbiter ----

TEST(ReferenceModel, RefAgreesWithRef64OnTiny) {
  double largest = 0;
  for (const Variant& v : kVariants) {
    auto weights = MakeWeights(TinyConfig(v.tied, v.llama3), v.seed);
    const Tokens tokens = RandomTokens(64, weights->config.vocab_size, v.seed + 3);
    ReferenceModel ref(weights, Precision::kFloat32, kThreads);
    ReferenceModel ref64(weights, Precision::kFloat64, kThreads);
    const double full = MaxAbsDiff(ref.ForwardFull(tokens), ref64.ForwardFull(tokens), "full");
    DynamicCache a, b;
    const auto chunks = RandomChunks(64, 7, v.seed);
    const double cached = MaxAbsDiff(ForwardChunked(ref, tokens, chunks, a),
                                     ForwardChunked(ref64, tokens, chunks, b), "cached");
    std::cout << "ref vs ref64 " << v.Label() << ": uncached " << full << ", cached " << cached
              << "\n";
    largest = std::max({largest, full, cached});
  }
  ::testing::Test::RecordProperty("max_abs_diff_ref_vs_ref64", std::to_string(largest));
  std::cout << "largest |ref - ref64| on tiny: " << largest << "\n";
  EXPECT_LT(largest, kTolerance);
}

// ---- transformers' DynamicCache semantics ----

// Positions come from the cache length: a "new" one-token prompt on a reused cache is read as
// position 10 of the old conversation, silently, exactly as transformers does.
TEST(ReferenceModel, ReusedCacheSilentlyContinuesTheOldConversation) {
  auto weights = MakeWeights(TinyConfig(true), 5);
  ReferenceModel model(weights, Precision::kFloat32, kThreads);
  const Tokens first = RandomTokens(10, weights->config.vocab_size, 1);
  const Tokens second = {42};
  DynamicCache cache;
  model.Forward(first, cache);
  const Logits reused = model.Forward(second, cache);  // no error, no warning
  EXPECT_EQ(cache.GetSeqLength(), 11);

  DynamicCache fresh;
  const Logits clean = model.Forward(second, fresh);
  const double moved = MaxAbsDiff(reused, clean, "reused vs fresh");
  std::cout << "reused-cache logits differ from a fresh cache's by " << moved << "\n";
  EXPECT_GT(moved, 1e-2) << "a stale cache must move logits far beyond the tolerance";

  // ...and what it computed is the old conversation continued.
  Tokens history = first;
  history.push_back(second[0]);
  EXPECT_LE(MaxAbsDiff(reused, Rows(model.ForwardFull(history), 10, 1), "continuation"),
            kTolerance);
}

TEST(ReferenceModel, CropThenForwardEqualsTheShorterHistoryFromScratch) {
  auto weights = MakeWeights(TinyConfig(false), 6);
  ReferenceModel model(weights, Precision::kFloat32, kThreads);
  const Tokens tokens = RandomTokens(20, weights->config.vocab_size, 2);
  DynamicCache cache;
  model.Forward(tokens, cache);
  cache.Crop(8);
  EXPECT_EQ(cache.GetSeqLength(), 8);
  const Tokens tail = {7, 9, 11};
  const Logits after = model.Forward(tail, cache);
  Tokens history = Slice(tokens, 0, 8);
  history.insert(history.end(), tail.begin(), tail.end());
  EXPECT_LE(MaxAbsDiff(after, Rows(model.ForwardFull(history), 8, 3), "crop"), kTolerance);
  cache.Crop(0);
  EXPECT_EQ(cache.GetSeqLength(), 0);
}

TEST(ReferenceModel, ForkIsADeepCopyAndResetEmpties) {
  auto weights = MakeWeights(TinyConfig(true), 7);
  ReferenceModel model(weights, Precision::kFloat64, kThreads);
  const Tokens prompt = RandomTokens(9, weights->config.vocab_size, 3);
  DynamicCache cache;
  model.Forward(prompt, cache);
  DynamicCache fork = cache.Fork();
  const Logits a1 = model.Forward({5, 6}, cache);  // the original moves on...
  EXPECT_EQ(fork.GetSeqLength(), 9);               // ...the fork does not
  const Logits b1 = model.Forward({5, 6}, fork);
  EXPECT_EQ(MaxAbsDiff(a1, b1, "fork"), 0.0);

  cache.Reset();
  EXPECT_EQ(cache.GetSeqLength(), 0);
  DynamicCache fresh;
  EXPECT_EQ(MaxAbsDiff(model.Forward(prompt, cache), model.Forward(prompt, fresh), "reset"), 0.0);
}

// A tied head is the embedding matrix itself: the same weights spelled untied give the same bits.
TEST(ReferenceModel, TiedHeadIsTheEmbeddingMatrix) {
  auto tied = MakeWeights(TinyConfig(true), 8);
  format::ModelWeights untied = *tied;
  untied.config.tie_word_embeddings = false;
  untied.tensors["lm_head.weight"] = tied->Get("model.embed_tokens.weight");
  ReferenceModel a(tied, Precision::kFloat32, kThreads);
  ReferenceModel b(std::make_shared<const format::ModelWeights>(untied), Precision::kFloat32,
                   kThreads);
  const Tokens tokens = RandomTokens(6, tied->config.vocab_size, 4);
  EXPECT_EQ(MaxAbsDiff(a.ForwardFull(tokens), b.ForwardFull(tokens), "tied"), 0.0);
}

// llama3 scaling must change the slow frequencies (and only what it should): the same weights
// without it give different logits at a late position.
TEST(ReferenceModel, Llama3RopeScalingIsApplied) {
  auto plain = MakeWeights(TinyConfig(true, false), 9);
  format::ModelWeights scaled = *plain;
  scaled.config = TinyConfig(true, true);
  ReferenceModel a(plain, Precision::kFloat64, kThreads);
  ReferenceModel b(std::make_shared<const format::ModelWeights>(scaled), Precision::kFloat64,
                   kThreads);
  const Tokens tokens = RandomTokens(100, plain->config.vocab_size, 5);
  EXPECT_GT(MaxAbsDiff(a.ForwardFull(tokens), b.ForwardFull(tokens), "llama3"), 1e-3);
}

TEST(ReferenceModel, TraceRowsAgreeCachedAndUncached) {
  auto weights = MakeWeights(TinyConfig(false), 10);
  ReferenceModel model(weights, Precision::kFloat32, kThreads);
  const auto& c = weights->config;
  const Tokens tokens = RandomTokens(12, c.vocab_size, 6);
  ForwardTrace full_trace;
  model.ForwardFull(tokens, &full_trace);
  ASSERT_EQ(static_cast<int64_t>(full_trace.layers.size()), c.num_hidden_layers);
  DynamicCache cache;
  model.Forward(Slice(tokens, 0, 5), cache);
  ForwardTrace tail_trace;
  model.Forward(Slice(tokens, 5, 7), cache, &tail_trace);
  ASSERT_EQ(static_cast<int64_t>(tail_trace.layers.size()), c.num_hidden_layers);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    SCOPED_TRACE("layer " + std::to_string(l));
    const LayerTrace& f = full_trace.layers[l];
    const LayerTrace& t = tail_trace.layers[l];
    EXPECT_EQ(f.after_attention.rows(), 12);
    EXPECT_EQ(f.after_attention.cols(), c.hidden_size);
    EXPECT_EQ(t.after_mlp.rows(), 7);
    EXPECT_LE(MaxAbsDiff(t.after_attention, Rows(f.after_attention, 5, 7), "attn"), kTolerance);
    EXPECT_LE(MaxAbsDiff(t.after_mlp, Rows(f.after_mlp, 5, 7), "mlp"), kTolerance);
  }
}

// ---- Errors: clear InputErrors, never a torch c10::Error ----

template <typename F>
std::string ErrorOf(F&& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected an InputError, got: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected an InputError, nothing was thrown";
  return "";
}

TEST(ReferenceModelErrors, EmptyTokens) {
  ReferenceModel model(MakeWeights(TinyConfig(true), 1), Precision::kFloat32, kThreads);
  DynamicCache cache;
  EXPECT_THAT(ErrorOf([&] { model.ForwardFull({}); }), HasSubstr("tokens is empty"));
  EXPECT_THAT(ErrorOf([&] { model.Forward({}, cache); }), HasSubstr("tokens is empty"));
  EXPECT_EQ(cache.GetSeqLength(), 0);
}

TEST(ReferenceModelErrors, TokenOutOfRangeNamesIndexIdAndVocab) {
  ReferenceModel model(MakeWeights(TinyConfig(true), 1), Precision::kFloat64, kThreads);
  const int64_t vocab = model.config().vocab_size;
  EXPECT_THAT(ErrorOf([&] {
                model.ForwardFull({1, 2, static_cast<Token>(vocab)});
              }),
              AllOf(HasSubstr("token id " + std::to_string(vocab) + " at index 2"),
                    HasSubstr("vocab_size " + std::to_string(vocab))));
  DynamicCache cache;
  model.Forward({1, 2, 3}, cache);
  EXPECT_THAT(ErrorOf([&] { model.Forward({4, -1}, cache); }), HasSubstr("token id -1 at index 1"));
  EXPECT_EQ(cache.GetSeqLength(), 3) << "a refused call must leave the cache unchanged";
}

TEST(ReferenceModelErrors, CropPastLengthNamesBothNumbers) {
  ReferenceModel model(MakeWeights(TinyConfig(true), 1), Precision::kFloat32, kThreads);
  DynamicCache cache;
  model.Forward({1, 2, 3, 4}, cache);
  EXPECT_THAT(ErrorOf([&] { cache.Crop(5); }),
              AllOf(HasSubstr("length 5"), HasSubstr("cache length 4")));
  EXPECT_THAT(ErrorOf([&] { cache.Crop(-1); }), HasSubstr("length must be >= 0, got -1"));
  EXPECT_EQ(cache.GetSeqLength(), 4);
}

TEST(ReferenceModelErrors, SequenceBeyondMaxPositionEmbeddings) {
  format::LlamaConfig config = TinyConfig(true);
  config.max_position_embeddings = 16;
  ReferenceModel model(MakeWeights(config, 1), Precision::kFloat32, kThreads);
  EXPECT_THAT(ErrorOf([&] { model.ForwardFull(RandomTokens(17, config.vocab_size, 1)); }),
              AllOf(HasSubstr("sequence length 17"), HasSubstr("max_position_embeddings 16")));
  DynamicCache cache;
  model.Forward(RandomTokens(14, config.vocab_size, 1), cache);
  EXPECT_THAT(ErrorOf([&] {
                model.Forward({1, 2, 3}, cache);
              }),
              AllOf(HasSubstr("sequence length 17 (14 cached + 3 new)"),
                    HasSubstr("max_position_embeddings 16")));
  EXPECT_EQ(cache.GetSeqLength(), 14);
  model.Forward({1, 2}, cache);  // exactly at the limit is fine
  EXPECT_EQ(cache.GetSeqLength(), 16);
}

TEST(ReferenceModelErrors, CacheFromAnotherModelIsRefused) {
  auto weights = MakeWeights(TinyConfig(true), 1);
  ReferenceModel ref(weights, Precision::kFloat32, kThreads);
  ReferenceModel ref64(weights, Precision::kFloat64, kThreads);
  DynamicCache cache;
  ref.Forward({1, 2}, cache);
  EXPECT_THAT(ErrorOf([&] { ref64.Forward({3}, cache); }),
              AllOf(HasSubstr("DynamicCache"), HasSubstr("float64")));
  EXPECT_EQ(cache.GetSeqLength(), 2);
}

TEST(ReferenceModelErrors, BadWeightsAreRefusedAtConstruction) {
  format::ModelWeights broken = *MakeWeights(TinyConfig(false), 1);
  broken.tensors.erase("lm_head.weight");
  EXPECT_THAT(ErrorOf([&] {
                ReferenceModel(std::make_shared<const format::ModelWeights>(broken),
                               Precision::kFloat32);
              }),
              HasSubstr("lm_head.weight"));
  format::ModelWeights misshapen = *MakeWeights(TinyConfig(true), 1);
  misshapen.tensors["model.norm.weight"].shape = {3};
  EXPECT_THAT(ErrorOf([&] {
                ReferenceModel(std::make_shared<const format::ModelWeights>(misshapen),
                               Precision::kFloat32);
              }),
              AllOf(HasSubstr("model.norm.weight"), HasSubstr("[3]")));
  EXPECT_THAT(ErrorOf([&] { ReferenceModel(nullptr, Precision::kFloat32); }),
              HasSubstr("weights is null"));
}

}  // namespace
}  // namespace kvdiff::ref
