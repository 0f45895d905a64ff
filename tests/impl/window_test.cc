// Sliding-window attention in impl (issue 34): the uncached forward's window mask against an
// oracle that has no window at all, and the rotating cache (KvCache's ring of W rows) against the
// uncached forward, across the chunk sizes where rings go wrong (W-1, W, W+1, chunks longer than
// W, appends after the ring wrapped), with forks, batches and the truncate rule. Each test-only
// window fault (impl/batch_fault.h) must make the cached rows disagree: the power of the checks.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

#include "format/error.h"
#include "impl/model.h"
#include "impl/session.h"
#include "tests/impl/impl_test_util.h"

namespace kvdiff::impl::testing {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kWindow = 8;
// The project's gate: cached and uncached float32 forwards differ by summation order only.
constexpr double kGate = 1e-4;

format::LlamaConfig Windowed(int64_t window, int64_t layers = 2) {
  format::LlamaConfig c = format::PresetConfig("tiny");
  c.num_hidden_layers = layers;
  c.sliding_window = window;
  c.Validate();
  return c;
}

// The largest difference between the rows a session returned, appended chunk by chunk, and the
// uncached forward's rows of the same positions.
double CachedVsUncached(const Model& model, const Tokens& tokens,
                        const std::vector<int64_t>& chunks) {
  const Logits full = model.ForwardFull(tokens);
  Session s = model.NewSession();
  double worst = 0;
  int64_t at = 0;
  for (int64_t c : chunks) {
    const Tokens part(tokens.begin() + at, tokens.begin() + at + c);
    const Logits rows = s.Append(part);
    for (int64_t r = 0; r < c; ++r) worst = std::max(worst, RowDiff(rows, r, full, at + r));
    at += c;
  }
  EXPECT_EQ(at, static_cast<int64_t>(tokens.size()));
  return worst;
}

// The chunkings where a ring of W goes wrong: filling to W-1, W, W+1; a chunk longer than the
// window from empty and after a wrap; decodes across 2W and 3W.
std::vector<std::vector<int64_t>> RingChunkings() {
  const int64_t w = kWindow;
  return {
      {w - 1, 1, 1, 1},                    // to W-1, W, W+1
      {w, 1, w},                           // full, then wraps by one, then a whole window
      {w + 1, 2 * w + 3, 1},               // chunks longer than the ring, from empty and wrapped
      {3, 5, 7, 11, 2},                    // arbitrary cuts across 2W and 3W
      std::vector<int64_t>(3 * w + 2, 1),  // decode only, across 3W
      {5 * w},                             // one call of five windows
  };
}

int64_t Sum(const std::vector<int64_t>& v) {
  int64_t s = 0;
  for (int64_t x : v) s += x;
  return s;
}

// With one layer, a query's receptive field is its window only, and scores depend on relative
// positions only (RoPE): row p of the windowed model is the last row of the model WITHOUT a window
// run on tokens p-W+1..p alone. An oracle that has no window anywhere.
TEST(WindowMask, OneLayerRowIsTheUnwindowedForwardOfItsWindowAlone) {
  const auto weights = RandomModel(Windowed(kWindow, 1), 3);
  const Model windowed(weights, 1);
  auto unwindowed_weights = std::make_shared<format::ModelWeights>(*weights);
  unwindowed_weights->config.sliding_window = 0;
  const Model plain(unwindowed_weights, 1);
  const Tokens tokens = RandomTokens(3 * kWindow, 256, 5);
  const Logits rows = windowed.ForwardFull(tokens);
  for (int64_t p = 0; p < static_cast<int64_t>(tokens.size()); ++p) {
    const int64_t first = std::max<int64_t>(0, p - kWindow + 1);
    const Tokens window(tokens.begin() + first, tokens.begin() + p + 1);
    const Logits alone = plain.ForwardFull(window);
    EXPECT_LT(RowDiff(rows, p, alone, alone.rows() - 1), 2e-5) << "position " << p;
  }
}

// Power of the test above: a window one larger or smaller changes rows past the window.
TEST(WindowMask, AWindowOfOneMoreOrLessChangesTheRowsPastIt) {
  const Tokens tokens = RandomTokens(3 * kWindow, 256, 5);
  const Logits rows = Model(RandomModel(Windowed(kWindow, 1), 3), 1).ForwardFull(tokens);
  for (int64_t other : {kWindow - 1, kWindow + 1}) {
    const Logits off = Model(RandomModel(Windowed(other, 1), 3), 1).ForwardFull(tokens);
    const int64_t first_past = std::min(kWindow, other);  // first row whose window differs
    for (int64_t p = 0; p < first_past; ++p) EXPECT_EQ(RowDiff(rows, p, off, p), 0) << p;
    EXPECT_GT(RowDiff(rows, first_past, off, first_past), 1e-3) << "window " << other;
  }
}

// A window as long as the context changes nothing: every key is in view.
TEST(WindowMask, AWindowAsLongAsTheCallIsFullAttention) {
  const auto weights = RandomModel(Windowed(40), 4);
  auto plain_weights = std::make_shared<format::ModelWeights>(*weights);
  plain_weights->config.sliding_window = 0;
  const Tokens tokens = RandomTokens(40, 256, 6);
  const Logits a = Model(weights, 1).ForwardFull(tokens);
  const Logits b = Model(plain_weights, 1).ForwardFull(tokens);
  EXPECT_EQ((a - b).cwiseAbs().maxCoeff(), 0.0f);
}

TEST(WindowRing, HoldsWRowsAndItsRowsAgreeWithTheUncachedForward) {
  const Model model(RandomModel(Windowed(kWindow), 7), 1);
  EXPECT_EQ(model.NewCache().Rows(), kWindow);
  EXPECT_EQ(model.NewCache().Capacity(), 512);
  for (const auto& chunks : RingChunkings()) {
    const Tokens tokens = RandomTokens(Sum(chunks), 256, static_cast<uint32_t>(Sum(chunks)));
    EXPECT_LT(CachedVsUncached(model, tokens, chunks), kGate) << ::testing::PrintToString(chunks);
  }
}

// Power: each test-only window fault breaks some chunking of the same suite.
TEST(WindowRing, EachWindowFaultMakesTheCachedRowsDisagree) {
  for (BatchFault fault : {BatchFault::kWindowPlusOne, BatchFault::kWindowMinusOne,
                           BatchFault::kRingSlicedByLogicalLength}) {
    Model model(RandomModel(Windowed(kWindow), 7), 1);
    model.InjectBatchFault(fault);
    double worst = 0;
    for (const auto& chunks : RingChunkings()) {
      const Tokens tokens = RandomTokens(Sum(chunks), 256, static_cast<uint32_t>(Sum(chunks)));
      worst = std::max(worst, CachedVsUncached(model, tokens, chunks));
    }
    EXPECT_GT(worst, 1e-2) << BatchFaultName(fault);
  }
}

// The slicing fault is invisible until the window drops a position: it is a wrapped ring's bug.
TEST(WindowRing, TheSlicingFaultIsRightUntilTheWindowDropsAPosition) {
  Model model(RandomModel(Windowed(kWindow), 7), 1);
  model.InjectBatchFault(BatchFault::kRingSlicedByLogicalLength);
  const Tokens tokens = RandomTokens(kWindow, 256, 8);
  EXPECT_LT(CachedVsUncached(model, tokens, {3, 2, 1, 1, 1}), kGate);
}

TEST(WindowRing, AForkAfterTheRingWrappedGoesOnAsItsSourceWould) {
  const Model model(RandomModel(Windowed(kWindow), 9), 1);
  const Tokens tokens = RandomTokens(3 * kWindow + 5, 256, 10);
  const Logits full = model.ForwardFull(tokens);
  Session source = model.NewSession();
  source.Append(Tokens(tokens.begin(), tokens.begin() + 2 * kWindow + 3));
  Session fork = source.Fork();
  source.Append({7, 7, 7});  // the source moves on: the fork must not see it
  const Logits rows = fork.Append(Tokens(tokens.begin() + 2 * kWindow + 3, tokens.end()));
  for (int64_t r = 0; r < rows.rows(); ++r)
    EXPECT_LT(RowDiff(rows, r, full, 2 * kWindow + 3 + r), kGate) << r;
}

TEST(WindowRing, ABatchOfRingsGivesEachItsOwnRows) {
  const Model model(RandomModel(Windowed(kWindow), 11), 1);
  const Tokens a = RandomTokens(2 * kWindow + 1, 256, 12), b = RandomTokens(kWindow + 4, 256, 13);
  const Logits full_a = model.ForwardFull(a), full_b = model.ForwardFull(b);
  Session sa = model.NewSession(), sb = model.NewSession();
  sa.Append(Tokens(a.begin(), a.begin() + kWindow + 2));
  sb.Append(Tokens(b.begin(), b.begin() + 3));
  const Tokens rest_a(a.begin() + kWindow + 2, a.end()), rest_b(b.begin() + 3, b.end());
  const Logits rows = Session::AppendBatch({{&sa, &rest_a}, {&sb, &rest_b}}, {});
  for (int64_t r = 0; r < static_cast<int64_t>(rest_a.size()); ++r)
    EXPECT_LT(RowDiff(rows, r, full_a, kWindow + 2 + r), kGate) << r;
  for (int64_t r = 0; r < static_cast<int64_t>(rest_b.size()); ++r)
    EXPECT_LT(RowDiff(rows, static_cast<int64_t>(rest_a.size()) + r, full_b, 3 + r), kGate) << r;
}

TEST(WindowTruncate, AnywhereBeforeTheWindowDropsAPositionAndBackOneAfter) {
  const Model model(RandomModel(Windowed(kWindow), 14), 1);
  const Tokens tokens = RandomTokens(3 * kWindow, 256, 15);
  const Logits full = model.ForwardFull(tokens);
  Session s = model.NewSession();
  s.Append(Tokens(tokens.begin(), tokens.begin() + kWindow));  // full, nothing dropped yet
  s.Truncate(2);
  s.Append(Tokens(tokens.begin() + 2, tokens.begin() + 2 * kWindow + 1));  // wraps
  s.Truncate(2 * kWindow);  // back one: positions W+1.. are all still held
  const Logits rows = s.Append(Tokens(tokens.begin() + 2 * kWindow, tokens.end()));
  for (int64_t r = 0; r < rows.rows(); ++r)
    EXPECT_LT(RowDiff(rows, r, full, 2 * kWindow + r), kGate) << r;
}

TEST(WindowTruncate, FurtherBackAfterADropIsRefusedNamingThePositionsAndChangesNothing) {
  const Model model(RandomModel(Windowed(kWindow), 14), 1);
  const Tokens tokens = RandomTokens(2 * kWindow + 2, 256, 15);
  Session s = model.NewSession();
  s.Append(Tokens(tokens.begin(), tokens.begin() + 2 * kWindow));
  try {
    s.Truncate(2 * kWindow - 2);
    FAIL() << "a truncate past what the window holds was accepted";
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(), HasSubstr("length 14 is not possible"));
    EXPECT_THAT(e.what(), HasSubstr("sees positions 7..14"));
    EXPECT_THAT(e.what(), HasSubstr("positions 0..7 have left the window"));
    EXPECT_THAT(e.what(), HasSubstr("goes back at most to 15"));
  }
  EXPECT_EQ(s.Length(), 2 * kWindow);
  const Logits rows = s.Append(Tokens(tokens.begin() + 2 * kWindow, tokens.end()));
  const Logits full = model.ForwardFull(tokens);
  for (int64_t r = 0; r < rows.rows(); ++r)
    EXPECT_LT(RowDiff(rows, r, full, 2 * kWindow + r), kGate) << r;
}

TEST(WindowShift, IsRefusedOnAWindowedModel) {
  const Model model(RandomModel(Windowed(kWindow), 16), 1);
  Session s = model.NewSession();
  s.Append(RandomTokens(5, 256, 17));
  try {
    s.Shift(1, 2);
    FAIL() << "a shift of a sliding-window session was accepted";
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(), HasSubstr("cannot shift"));
  }
  EXPECT_EQ(s.Length(), 5);
}

}  // namespace
}  // namespace kvdiff::impl::testing
