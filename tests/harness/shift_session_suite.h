// BackendSession::Shift held to the algebra of a context shift, for any backend that shifts
// (a suite instantiated with backend names: impl, ref, ref64 in shift_step_test.cc; the engine
// plugins, an engine program and llama.cpp in tests/engines/shift_engines_test.cc): shift(k, 0)
// is nothing, two shifts are one of their sum, a fork's shift spares its parent, shifting
// everything away is an empty cache, keep + discard = length is a truncate, a move matters, and
// bad arguments are refused and change nothing. Also the random shift scenarios both files run
// against ref64. A name "in-process:NAME" makes NAME with BackendOptions::isolate off.
#pragma once

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "format/error.h"
#include "harness/backend/backend.h"
#include "harness/backend/registry.h"
#include "harness/run/model_for.h"
#include "harness/scenario/scenario.h"
#include "tests/harness/harness_test_util.h"

namespace kvdiff::harness {

// The backend a suite parameter names: "in-process:NAME" is NAME run in this process.
inline std::unique_ptr<Backend> MakeShiftTestBackend(
    const std::string& param, std::shared_ptr<const format::ModelWeights> weights) {
  BackendOptions options;
  options.threads = 1;
  std::string name = param;
  if (name.rfind("in-process:", 0) == 0) {
    name = name.substr(11);
    options.isolate = false;
  }
  return BackendRegistry::Global().Make(name, std::move(weights), options);
}

// A backend of the suite, and how far apart two of its sessions fed the same history may be: 0,
// bit-identical, for backends whose sessions own their caches; an engine whose sessions share one
// pool of cells (llama.cpp's unified KV memory) attends over a session's keys in cell order, so
// twins in other cells sum in another order.
struct ShiftSuiteBackend {
  const char* name;
  double twins = 0;
};
inline void PrintTo(const ShiftSuiteBackend& b, std::ostream* os) { *os << b.name; }

class ShiftSessionTest : public ::testing::TestWithParam<ShiftSuiteBackend> {
 protected:
  void SetUp() override {
    const std::string name = GetParam().name;
    if (!BackendRegistry::Global().Has(name.substr(name.rfind("in-process:", 0) == 0 ? 11 : 0)))
      GTEST_SKIP() << name << " not built";
    weights_ = LoadModelFor(testing::TinyModel(3));
    backend_ = MakeShiftTestBackend(name, weights_);
    ASSERT_TRUE(backend_->Info().shifts) << name << " says it does not shift";
  }
  // A session fed `n` tokens of a fixed prompt.
  std::unique_ptr<BackendSession> Fed(int64_t n) const {
    auto s = backend_->NewSession();
    Tokens prompt(n);
    for (int64_t i = 0; i < n; ++i) prompt[i] = static_cast<Token>((i * 37 + 11) % 256);
    s->Append(prompt);
    return s;
  }
  static double MaxDiff(const Logits& a, const Logits& b) {
    double m = 0;
    for (int64_t r = 0; r < a.rows(); ++r)
      for (int64_t c = 0; c < a.cols(); ++c)
        m = std::max(m, std::abs(static_cast<double>(a(r, c)) - b(r, c)));
    return m;
  }

  double Twins() const { return GetParam().twins; }

  std::shared_ptr<const format::ModelWeights> weights_;
  std::unique_ptr<Backend> backend_;
};

inline const Tokens kNext = {7, 200, 31};

TEST_P(ShiftSessionTest, DiscardZeroChangesNothing) {
  for (int64_t keep : {0, 1, 6, 12}) {
    auto shifted = Fed(12);
    auto twin = Fed(12);
    shifted->Shift(keep, 0);
    EXPECT_EQ(shifted->Length(), 12);
    EXPECT_LE(MaxDiff(shifted->Append(kNext), twin->Append(kNext)), Twins()) << "keep " << keep;
  }
}

TEST_P(ShiftSessionTest, TwoShiftsAreOneShiftOfTheirSum) {
  double worst = 0;
  for (int64_t keep : {0, 1, 4}) {
    auto twice = Fed(20);
    auto once = Fed(20);
    twice->Shift(keep, 3);
    twice->Shift(keep, 5);
    once->Shift(keep, 8);
    ASSERT_EQ(twice->Length(), 12);
    ASSERT_EQ(once->Length(), 12);
    worst = std::max(worst, MaxDiff(twice->Append(kNext), once->Append(kNext)));
  }
  // Measured: impl 1.9e-06, ref64 2.2e-15 (float32 rounds each re-rotation once; R(-3)·R(-5)
  // and R(-8) differ by the rounding of their cos/sin, not by a position).
  EXPECT_LE(worst, std::string(GetParam().name) == "ref64" ? 1e-12 : 2e-5) << "worst " << worst;
  std::printf("%s: two shifts against one of their sum, worst %.2e\n", GetParam().name, worst);
}

TEST_P(ShiftSessionTest, AShiftedForkLeavesItsParentAlone) {
  auto parent = Fed(10);
  auto twin = Fed(10);
  auto fork = parent->Fork();
  fork->Shift(1, 4);
  EXPECT_EQ(fork->Length(), 6);
  EXPECT_EQ(parent->Length(), 10);
  EXPECT_LE(MaxDiff(parent->Append(kNext), twin->Append(kNext)), Twins());
}

TEST_P(ShiftSessionTest, ShiftingEverythingAwayIsAnEmptyCache) {
  auto shifted = Fed(9);
  shifted->Shift(0, 9);
  EXPECT_EQ(shifted->Length(), 0);
  auto fresh = backend_->NewSession();
  EXPECT_LE(MaxDiff(shifted->Append(kNext), fresh->Append(kNext)), Twins());
}

TEST_P(ShiftSessionTest, KeepingEverythingButTheTailIsATruncate) {
  // keep + discard = length: nothing moves, the tail is forgotten, as truncate(keep) does.
  for (int64_t keep : {0, 1, 5}) {
    auto shifted = Fed(9);
    auto truncated = Fed(9);
    shifted->Shift(keep, 9 - keep);
    truncated->Truncate(keep);
    EXPECT_LE(MaxDiff(shifted->Append(kNext), truncated->Append(kNext)), Twins())
        << "keep " << keep;
  }
}

TEST_P(ShiftSessionTest, AMoveMatters) {
  // A shift that moves rows changes what comes next (else the tests above prove little).
  auto shifted = Fed(12);
  auto twin = Fed(12);
  shifted->Shift(2, 3);
  EXPECT_GT(MaxDiff(shifted->Append(kNext).bottomRows(1), twin->Append(kNext).bottomRows(1)), 1e-2);
}

TEST_P(ShiftSessionTest, BadArgumentsAreRefusedAndChangeNothing) {
  auto s = Fed(6);
  auto twin = Fed(6);
  EXPECT_THROW(s->Shift(4, 3), InputError);
  EXPECT_THROW(s->Shift(-1, 1), InputError);
  EXPECT_THROW(s->Shift(1, -1), InputError);
  EXPECT_THROW(s->Shift(7, 0), InputError);
  // keep + discard overflows int64: compared without adding.
  EXPECT_THROW(s->Shift(1, std::numeric_limits<int64_t>::max()), InputError);
  EXPECT_THROW(s->Shift(std::numeric_limits<int64_t>::max(), 1), InputError);
  EXPECT_EQ(s->Length(), 6);
  EXPECT_LE(MaxDiff(s->Append(kNext), twin->Append(kNext)), Twins());
}

// A random scenario of prefills, decodes, forks and shifts on the tiny model.
inline Scenario RandomShiftScenario(uint32_t seed) {
  std::mt19937 rng(seed);
  auto uniform = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  Scenario sc;
  sc.name = fmt::format("shift-{}", seed);
  sc.model = testing::TinyModel(3);
  std::vector<std::pair<std::string, int64_t>> convs = {{"main", 0}};  // name, length
  auto prompt = [&](int64_t n) {
    Tokens t(n);
    for (Token& x : t) x = static_cast<Token>(uniform(0, 255));
    return t;
  };
  const int64_t first = uniform(4, 60);
  sc.steps.push_back(Step::Prefill("main", prompt(first)));
  convs[0].second = first;
  const int64_t steps = uniform(3, 8);
  for (int64_t k = 0; k < steps; ++k) {
    auto& [name, length] = convs[uniform(0, static_cast<int64_t>(convs.size()) - 1)];
    const int64_t choice = uniform(0, 9);
    if (choice < 4 && length > 0) {
      const int64_t keep = uniform(0, std::min<int64_t>(length, 4));
      const int64_t discard = uniform(0, length - keep);
      if (keep + discard == length) continue;  // keep a last row to decode from
      sc.steps.push_back(Step::Shift(name, keep, discard));
      length -= discard;
    } else if (choice < 7) {
      const int64_t n = uniform(1, 12);
      sc.steps.push_back(Step::Decode(name, n));
      length += n;
    } else if (choice < 8 && convs.size() < 3) {
      const std::string to = fmt::format("f{}", k);
      sc.steps.push_back(Step::Fork(name, to));
      const int64_t forked_length = length;  // emplace_back may move the element `length` names
      convs.emplace_back(to, forked_length);
    } else {
      const int64_t n = uniform(1, 9);
      sc.steps.push_back(Step::Prefill(
          name, prompt(n), n > 2 ? std::vector<int64_t>{2, n - 2} : std::vector<int64_t>{}));
      length += n;
    }
  }
  // Two shifts, then a decode: the case llama.cpp#3825 got wrong.
  auto& [name, length] = convs[0];
  if (length >= 6) {
    sc.steps.push_back(Step::Shift(name, 1, 2));
    sc.steps.push_back(Step::Shift(name, 1, 2));
    sc.steps.push_back(Step::Decode(name, 3));
  }
  return sc;
}

}  // namespace kvdiff::harness
