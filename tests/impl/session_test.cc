// The Session (checked API) against ForwardFull (the oracle) on the tiny preset: token by token,
// in chunks, after Reset, Truncate and Fork; every error message; thread-count independence; and
// KvCache::Shift's bookkeeping of the re-rotation it leaves pending.
#include "impl/session.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "format/error.h"
#include "format/model_files.h"
#include "impl/kv_cache.h"
#include "impl/model.h"
#include "tests/impl/impl_test_util.h"

namespace kvdiff::impl {
namespace {

using ::testing::HasSubstr;
using testing::kTolerance;
using testing::RandomTokens;
using testing::RowDiff;

class TinySessionTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { model_ = new Model(testing::PresetModel("tiny", 7), 2); }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }
  static Model* model_;
  int64_t vocab() const { return model_->config().vocab_size; }
};
Model* TinySessionTest::model_ = nullptr;

// Feeds `tokens` to a new session in chunks of the given sizes; returns all rows of logits.
RowMatrix FeedInChunks(const Model& model, const Tokens& tokens, const std::vector<int>& chunks) {
  Session session = model.NewSession();
  RowMatrix all(static_cast<int64_t>(tokens.size()), model.config().vocab_size);
  int64_t at = 0;
  for (int n : chunks) {
    Tokens chunk(tokens.begin() + at, tokens.begin() + at + n);
    all.middleRows(at, n) = session.Append(chunk);
    at += n;
    EXPECT_EQ(session.Length(), at);
  }
  return all;
}

TEST_F(TinySessionTest, CachedEqualsUncachedAtEveryPositionForManyChunkings) {
  const Tokens tokens = RandomTokens(48, vocab(), 1);
  const Logits full = model_->ForwardFull(tokens);
  const std::vector<std::vector<int>> chunkings = {
      std::vector<int>(48, 1),      {48},    {5, 7, 1, 20, 15},
      {1, 2, 3, 4, 5, 6, 7, 8, 12}, {47, 1}, {24, 24}};
  for (const auto& chunks : chunkings) {
    const RowMatrix cached = FeedInChunks(*model_, tokens, chunks);
    double worst = 0;
    for (int64_t i = 0; i < full.rows(); ++i) {
      const double diff = RowDiff(cached, i, full, i);
      worst = std::max(worst, diff);
      ASSERT_LE(diff, kTolerance) << "chunks=" << fmt::format("{}", fmt::join(chunks, "+"))
                                  << " position " << i;
    }
    RecordProperty("max_diff_" + fmt::format("{}", fmt::join(chunks, "+")).substr(0, 40),
                   fmt::format("{:.3g}", worst));
    std::printf("tiny chunks=%s: max |cached - uncached| over %ld positions = %.3g\n",
                fmt::format("{}", fmt::join(chunks, "+")).c_str(), static_cast<long>(full.rows()),
                worst);
  }
}

TEST_F(TinySessionTest, AfterResetASessionGivesExactlyWhatANewOneGives) {
  const Tokens first = RandomTokens(20, vocab(), 2), second = RandomTokens(9, vocab(), 3);
  Session used = model_->NewSession();
  used.Append(first);
  used.Append({5});
  used.Reset();
  EXPECT_EQ(used.Length(), 0);
  Session fresh = model_->NewSession();
  const Logits a = used.Append(second), b = fresh.Append(second);
  EXPECT_TRUE(a == b) << "max diff " << (a - b).cwiseAbs().maxCoeff();
  const Logits c = used.Append({17}), d = fresh.Append({17});
  EXPECT_TRUE(c == d);
}

TEST_F(TinySessionTest, TruncateThenAppendGivesWhatTheHistoryGivesFromScratch) {
  const Tokens history = RandomTokens(30, vocab(), 4), tail = RandomTokens(6, vocab(), 5);
  for (int64_t k : {0, 1, 12, 29, 30}) {
    Session session = model_->NewSession();
    session.Append(Tokens(history.begin(), history.begin() + 17));
    session.Append(Tokens(history.begin() + 17, history.end()));
    session.Truncate(k);
    EXPECT_EQ(session.Length(), k);
    const Logits got = session.Append(tail);
    Tokens expected_history(history.begin(), history.begin() + k);
    expected_history.insert(expected_history.end(), tail.begin(), tail.end());
    const Logits full = model_->ForwardFull(expected_history);
    for (int64_t i = 0; i < static_cast<int64_t>(tail.size()); ++i) {
      EXPECT_LE(RowDiff(got, i, full, k + i), kTolerance) << "truncate(" << k << ") row " << i;
    }
  }
}

TEST_F(TinySessionTest, ForkIsIndependentOfItsParent) {
  const Tokens prefix = RandomTokens(15, vocab(), 6);
  const Tokens a = RandomTokens(4, vocab(), 7), b = RandomTokens(5, vocab(), 8);
  Session parent = model_->NewSession();
  parent.Append(prefix);
  Session child = parent.Fork();
  EXPECT_EQ(child.Length(), 15);
  EXPECT_EQ(child.Capacity(), parent.Capacity());
  const Logits child_b = child.Append(b);  // the child moves first: the parent must not see it
  EXPECT_EQ(parent.Length(), 15);
  const Logits parent_a = parent.Append(a);
  child.Truncate(3);  // and shrinking the child must not shrink the parent
  EXPECT_EQ(parent.Length(), 19);

  auto with = [&](const Tokens& tail) {
    Tokens t = prefix;
    t.insert(t.end(), tail.begin(), tail.end());
    return model_->ForwardFull(t);
  };
  const Logits full_a = with(a), full_b = with(b);
  for (int64_t i = 0; i < 4; ++i) EXPECT_LE(RowDiff(parent_a, i, full_a, 15 + i), kTolerance);
  for (int64_t i = 0; i < 5; ++i) EXPECT_LE(RowDiff(child_b, i, full_b, 15 + i), kTolerance);
}

TEST_F(TinySessionTest, ErrorsNameBothNumbersAndLeaveTheSessionUnchanged) {
  Session session = model_->NewSession(/*capacity=*/8);
  EXPECT_EQ(session.Capacity(), 8);
  const Logits first = session.Append({1, 2, 3, 4, 5});
  auto expect_error = [&](auto call, const std::string& text) {
    try {
      call();
      ADD_FAILURE() << "expected InputError containing: " << text;
    } catch (const InputError& e) {
      EXPECT_THAT(e.what(), HasSubstr(text));
    }
    EXPECT_EQ(session.Length(), 5) << "a failed call changed the session (" << text << ")";
  };
  expect_error([&] { session.Append({}); }, "tokens is empty");
  expect_error(
      [&] {
        session.Append({1, 2, 300});
      },
      "token id 300 at index 2 is out of range for vocab_size 256");
  expect_error([&] { session.Append({-1}); },
               "token id -1 at index 0 is out of range for vocab_size 256");
  expect_error(
      [&] {
        session.Append({1, 2, 3, 4});
      },
      "Append: 4 tokens at length 5 need 9 positions, beyond the session capacity 8");
  expect_error([&] { session.Truncate(6); }, "Truncate: length 6 is outside 0..5");
  expect_error([&] { session.Truncate(-1); }, "Truncate: length -1 is outside 0..5");
  // Unchanged means unchanged: the next token gives what it gives without the failed calls.
  Session clean = model_->NewSession(8);
  clean.Append({1, 2, 3, 4, 5});
  EXPECT_TRUE(session.Append({9, 10, 11}) == clean.Append({9, 10, 11}));
  EXPECT_EQ(session.Length(), 8);
}

TEST_F(TinySessionTest, BadCapacityAndOversizedFullForwardAreRejected) {
  EXPECT_THROW(model_->NewSession(-3), InputError);
  try {
    model_->ForwardFull(Tokens(513, 1));
    ADD_FAILURE();
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(), HasSubstr("513 tokens is more than max_position_embeddings 512"));
  }
}

TEST_F(TinySessionTest, TraceRowsOfASessionMatchTheFullForwardTrace) {
  const Tokens tokens = RandomTokens(12, vocab(), 9);
  ForwardTrace full_trace, tail_trace;
  model_->ForwardFull(tokens, &full_trace);
  Session session = model_->NewSession();
  session.Append(Tokens(tokens.begin(), tokens.begin() + 8));
  session.Append(Tokens(tokens.begin() + 8, tokens.end()), &tail_trace);
  ASSERT_EQ(full_trace.layers.size(), 2u);
  ASSERT_EQ(tail_trace.layers.size(), 2u);
  for (size_t l = 0; l < 2; ++l) {
    ASSERT_EQ(full_trace.layers[l].after_attention.rows(), 12);
    ASSERT_EQ(tail_trace.layers[l].after_mlp.rows(), 4);
    ASSERT_EQ(tail_trace.layers[l].after_mlp.cols(), 64);
    for (int64_t i = 0; i < 4; ++i) {
      EXPECT_LE(RowDiff(tail_trace.layers[l].after_attention, i,
                        full_trace.layers[l].after_attention, 8 + i),
                kTolerance);
      EXPECT_LE(RowDiff(tail_trace.layers[l].after_mlp, i, full_trace.layers[l].after_mlp, 8 + i),
                kTolerance);
    }
  }
  // The layers really differ (the trace is not one buffer copied twice).
  EXPECT_GT(RowDiff(full_trace.layers[0].after_mlp, 11, full_trace.layers[1].after_mlp, 11), 1e-3);
}

// Any thread count gives the same bits: every output element has one owner and a fixed order.
// KvCache::Shift's bookkeeping, as llama.cpp's cache keeps it: the rows move at once, each moved
// key's re-rotation waits (its delta added to what waits already) for the next append; and the
// two TEST-ONLY ways of getting that wrong (impl/batch_fault.h).
TEST(KvCacheShift, MovesRowsNowAndLeavesEachMovedKeysDeltaPending) {
  const format::LlamaConfig config = format::PresetConfig("tiny");
  auto filled = [&](int64_t length) {
    KvCache cache(config, 32);
    cache.SetLength(length);
    for (int64_t p = 0; p < length; ++p)
      for (int64_t l = 0; l < cache.NumLayers(); ++l)
        std::fill(cache.KeyRow(l, p), cache.KeyRow(l, p) + cache.KvDim(), static_cast<float>(p));
    return cache;
  };
  auto deltas = [](const KvCache& c) {
    std::vector<int64_t> out;
    for (int64_t p = 0; p < c.Length(); ++p) out.push_back(c.PendingDelta(p));
    return out;
  };
  using Bookkeeping = KvCache::ShiftBookkeeping;
  KvCache right = filled(10);
  right.Shift(2, 3);  // keeps 0 1, moves 5..9 to 2..6
  EXPECT_EQ(right.KeyRow(0, 2)[0], 5.0f);
  EXPECT_TRUE(right.ShiftPending());
  EXPECT_EQ(deltas(right), (std::vector<int64_t>{0, 0, -3, -3, -3, -3, -3}));
  right.Shift(1, 2);  // moves 3..6 to 1..4: the delta of a key moved twice is the sum
  EXPECT_EQ(deltas(right), (std::vector<int64_t>{0, -5, -5, -5, -5}));
  right.SetLength(3);  // a truncated position's delta goes with it
  right.SetLength(5);
  EXPECT_EQ(deltas(right), (std::vector<int64_t>{0, -5, -5, 0, 0}));
  KvCache twin = right.Fork();
  EXPECT_EQ(deltas(twin), deltas(right));
  right.SpendPendingShift();
  EXPECT_FALSE(right.ShiftPending());
  EXPECT_EQ(deltas(right), (std::vector<int64_t>(5, 0)));

  KvCache overwritten = filled(10);
  overwritten.Shift(2, 3);
  overwritten.Shift(1, 2, Bookkeeping::kOverwriteDelta);  // llama.cpp#3825
  EXPECT_EQ(deltas(overwritten), (std::vector<int64_t>{0, -2, -2, -2, -2}));

  KvCache flagged = filled(10);
  flagged.Shift(2, 3, Bookkeeping::kFlagFromThisShift);
  EXPECT_TRUE(flagged.ShiftPending());
  flagged.Shift(4, 3, Bookkeeping::kFlagFromThisShift);  // nothing after keep: nothing moves
  EXPECT_EQ(flagged.Length(), 4);
  EXPECT_FALSE(flagged.ShiftPending());  // the first shift's re-rotation is lost
  KvCache kept = filled(10);
  kept.Shift(2, 3);
  kept.Shift(4, 3);
  EXPECT_TRUE(kept.ShiftPending());
}

TEST(ImplThreadsTest, OneTwoAndThreeThreadsGiveBitIdenticalLogits) {
  auto weights = testing::PresetModel("tiny", 11);
  const Tokens tokens = RandomTokens(70, 256, 12);
  std::vector<Logits> full, decoded;
  for (int threads : {1, 2, 3}) {
    Model model(weights, threads);
    EXPECT_EQ(model.Threads(), threads);
    full.push_back(model.ForwardFull(tokens));
    Session session = model.NewSession();
    session.Append(Tokens(tokens.begin(), tokens.begin() + 33));
    Logits rows(37, 256);
    for (int i = 33; i < 70; ++i) rows.row(i - 33) = session.Append({tokens[i]});
    decoded.push_back(rows);
  }
  for (size_t t = 1; t < full.size(); ++t) {
    EXPECT_TRUE(full[t] == full[0]) << t + 1 << " threads: ForwardFull differs from 1 thread";
    EXPECT_TRUE(decoded[t] == decoded[0]) << t + 1 << " threads: decode differs from 1 thread";
  }
}

TEST(ImplModelTest, WeightsNotMatchingTheConfigAreRejectedNamingTheTensor) {
  auto weights = format::MakeRandomModel(format::PresetConfig("tiny"), 1);
  auto broken = weights;
  broken.tensors.erase("model.layers.1.mlp.up_proj.weight");
  try {
    Model model(std::make_shared<const format::ModelWeights>(broken));
    ADD_FAILURE();
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(), HasSubstr("model.layers.1.mlp.up_proj.weight"));
  }
  broken = weights;
  broken.tensors["model.norm.weight"].shape = {63};
  broken.tensors["model.norm.weight"].data.resize(63);
  try {
    Model model(std::make_shared<const format::ModelWeights>(broken));
    ADD_FAILURE();
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(), HasSubstr("'model.norm.weight' has shape [63], expected [64]"));
  }
  EXPECT_THROW(Model(nullptr), InputError);
}

}  // namespace
}  // namespace kvdiff::impl
