// A seeded random walk over a plugin's sessions (append, truncate, fork, reset, free), every
// Append compared with impl's uncached ForwardFull of that session's history; and a batched call
// (ABI 2's append_batch) held to the same items appended alone and to impl. Shared by the engine
// tests; a failure names the seed and the step so `--gtest_filter` reruns it.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "impl/model.h"
#include "plugin_host/plugin_loader.h"
#include "tests/test_support.h"

namespace kvdiff::engines::conformance {

struct Conversation {
  Session session;
  Tokens history;  // what the session holds: the oracle's input
};

// Max |engine - impl| over `steps` random operations with at most 4 sessions alive and every
// history at most `max_length` long. Records a gtest failure (with the step) for a shape
// mismatch, a NaN/inf, or a length that disagrees with the history.
inline float RandomWalkMaxDiff(const Engine& engine, const impl::Model& model, uint64_t seed,
                               int steps, int64_t max_length) {
  uint64_t state = seed * 0xD1B54A32D192ED03ull;  // seeds must not be steps of one walk
  auto next = [&](uint64_t n) {                   // splitmix64: the same walk on every platform
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (z ^ (z >> 31)) % n;
  };
  const int64_t vocab = engine.Info().vocab_size;
  std::vector<Conversation> live;
  live.push_back({engine.NewSession(), {}});
  float worst = 0;
  for (int step = 0; step < steps; ++step) {
    Conversation& c = live[next(live.size())];
    const uint64_t op = next(10);
    const std::string where = "seed " + std::to_string(seed) + " step " + std::to_string(step);
    if (op < 6) {  // append 1..12 tokens (decode steps are the common case)
      const int64_t room = max_length - static_cast<int64_t>(c.history.size());
      if (room <= 0) continue;
      const int64_t n = std::min<int64_t>(room, op < 3 ? 1 : 1 + next(12));
      Tokens chunk;
      for (int64_t i = 0; i < n; ++i) chunk.push_back(static_cast<Token>(next(vocab)));
      c.history.insert(c.history.end(), chunk.begin(), chunk.end());
      const Logits got = c.session.Append(chunk);
      const Logits want = model.ForwardFull(c.history).bottomRows(n);
      EXPECT_TRUE(got.allFinite()) << where << ": NaN or inf";
      if (got.rows() != want.rows() || got.cols() != want.cols()) {
        ADD_FAILURE() << where << ": logits shape " << got.rows() << "x" << got.cols();
        return INFINITY;
      }
      const float diff = (got - want).cwiseAbs().maxCoeff();
      EXPECT_LE(diff, 1e-4f) << where << ": append of " << n << " at position "
                             << c.history.size() - n;
      worst = std::max(worst, diff);
    } else if (op == 6) {
      const int64_t to = static_cast<int64_t>(next(c.history.size() + 1));
      c.session.Truncate(to);
      c.history.resize(to);
    } else if (op == 7 && live.size() < 4) {
      live.push_back({c.session.Fork(), c.history});  // may reallocate: c is not used after
    } else if (op == 8) {
      c.session.Reset();
      c.history.clear();
    } else if (op == 9 && live.size() > 1) {
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(next(live.size())));
    }
    for (const Conversation& l : live) {
      EXPECT_EQ(l.session.Length(), static_cast<int64_t>(l.history.size())) << where;
    }
  }
  return worst;
}

// One conversation's part of a batch under test; `output` empty: every row.
struct BatchTestItem {
  Conversation* conv;
  Tokens tokens;
  std::vector<bool> output;
};

struct BatchRun {
  std::vector<Logits> rows;  // the batch's flagged rows, per item
  float vs_alone = 0;        // max |batch - the same item appended alone|
  float vs_impl = 0;         // max |batch - impl's uncached forward|
};

// The rows of `all` that `output` flags (all of them when it is empty), in order.
inline Logits FlaggedRows(const Logits& all, const std::vector<bool>& output) {
  if (output.empty()) return all;
  Logits kept(std::count(output.begin(), output.end(), true), all.cols());
  for (int64_t r = 0, k = 0; r < all.rows(); ++r)
    if (output[r]) kept.row(k++) = all.row(r);
  return kept;
}

// MaxAbsDiff of a batch's rows, which also takes two empty matrices (an item with no row flagged).
inline float RowsDiff(const Logits& batch, const Logits& other, const char* other_name) {
  if (batch.rows() == 0 && other.rows() == 0) return 0;
  return testing::MaxAbsDiff(batch, other, "the batch's", other_name);
}

// Runs every item alone (Append, then Truncate back: the same engine and sessions), then all in
// ONE Engine::AppendBatch, and measures the batch's rows against both the rows alone and impl's
// uncached ForwardFull; the histories advance. Throws what AppendBatch throws.
inline BatchRun BatchVsAlone(const Engine& engine, const impl::Model& model,
                             std::vector<BatchTestItem> items) {
  std::vector<Logits> alone;
  std::vector<BatchItem> batch;
  for (BatchTestItem& it : items) {
    const int64_t before = it.conv->session.Length();
    alone.push_back(FlaggedRows(it.conv->session.Append(it.tokens), it.output));
    it.conv->session.Truncate(before);
    batch.push_back({&it.conv->session, it.tokens, it.output});
  }
  BatchRun run;
  run.rows = engine.AppendBatch(batch);
  EXPECT_EQ(run.rows.size(), items.size());
  for (size_t i = 0; i < items.size() && i < run.rows.size(); ++i) {
    const int64_t n = static_cast<int64_t>(items[i].tokens.size());
    Tokens& h = items[i].conv->history;
    h.insert(h.end(), items[i].tokens.begin(), items[i].tokens.end());
    EXPECT_EQ(items[i].conv->session.Length(), static_cast<int64_t>(h.size())) << "item " << i;
    const Logits oracle = FlaggedRows(model.ForwardFull(h).bottomRows(n), items[i].output);
    run.vs_alone = std::max(run.vs_alone, RowsDiff(run.rows[i], alone[i], "alone"));
    run.vs_impl = std::max(run.vs_impl, RowsDiff(run.rows[i], oracle, "impl's"));
  }
  return run;
}

}  // namespace kvdiff::engines::conformance
