// A seeded random walk over a plugin's sessions (append, truncate, fork, reset, free), every
// Append compared with impl's uncached ForwardFull of that session's history. Shared by the
// engine tests; a failure names the seed and the step so `--gtest_filter` reruns it.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "impl/model.h"
#include "plugin_host/plugin_loader.h"

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

}  // namespace kvdiff::engines::conformance
