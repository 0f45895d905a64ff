// impl (Eigen) against ref (LibTorch, transformers semantics) at every position, uncached and
// cached, on the tiny preset: several seeds, tied and untied heads, llama3 RoPE scaling.
#include <gtest/gtest.h>

#include <iostream>
#include <ostream>
#include <string>
#include <vector>

#include "impl/model.h"
#include "impl/session.h"
#include "reference/reference_model.h"
#include "tests/reference/reference_test_util.h"

namespace kvdiff {
namespace {

using ::kvdiff::testing::ChunksString;
using ::kvdiff::testing::MakeWeights;
using ::kvdiff::testing::MaxAbsDiff;
using ::kvdiff::testing::RandomChunks;
using ::kvdiff::testing::RandomTokens;
using ::kvdiff::testing::Rows;
using ::kvdiff::testing::Slice;
using ::kvdiff::testing::TinyConfig;

// The project's agreement gate; two float32 implementations differ by summation order only.
constexpr double kTolerance = 1e-4;
constexpr int kThreads = 2;

struct Variant {
  uint64_t seed;
  bool tied;
  bool llama3;
  std::string Label() const {
    return "seed=" + std::to_string(seed) + (tied ? ",tied" : ",untied") +
           (llama3 ? ",llama3" : "");
  }
};

// ctest shows this instead of the parameter's bytes.
void PrintTo(const Variant& v, std::ostream* os) { *os << v.Label(); }

class ImplVsRef : public ::testing::TestWithParam<Variant> {};

TEST_P(ImplVsRef, EveryPositionUncachedAndCached) {
  const Variant v = GetParam();
  auto weights = MakeWeights(TinyConfig(v.tied, v.llama3), v.seed);
  const int64_t n = 48;
  const Tokens tokens = RandomTokens(n, weights->config.vocab_size, v.seed * 31 + 1);
  impl::Model impl_model(weights, kThreads);
  ref::ReferenceModel ref_model(weights, ref::Precision::kFloat32, kThreads);

  const Logits ref_full = ref_model.ForwardFull(tokens);
  const Logits impl_full = impl_model.ForwardFull(tokens);
  double largest = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = MaxAbsDiff(Rows(impl_full, i, 1), Rows(ref_full, i, 1), "uncached");
    EXPECT_LE(d, kTolerance) << "uncached, position " << i;
    largest = std::max(largest, d);
  }

  // Token by token, then random chunkings; each cached row against ref's cached row of the same
  // chunking and against ref's uncached row.
  std::vector<std::vector<int64_t>> chunkings = {std::vector<int64_t>(n, 1)};
  for (uint64_t c = 0; c < 3; ++c) chunkings.push_back(RandomChunks(n, 10, v.seed * 100 + c));
  for (const auto& chunks : chunkings) {
    SCOPED_TRACE("prefill(n=" + std::to_string(n) + ",chunks=" + ChunksString(chunks) + "," +
                 v.Label() + ")");
    impl::Session session = impl_model.NewSession();
    ref::DynamicCache cache;
    int64_t done = 0;
    for (int64_t c : chunks) {
      const Tokens chunk = Slice(tokens, done, c);
      const Logits a = session.Append(chunk);
      const Logits b = ref_model.Forward(chunk, cache);
      for (int64_t r = 0; r < c; ++r) {
        const double d = MaxAbsDiff(Rows(a, r, 1), Rows(b, r, 1), "cached");
        EXPECT_LE(d, kTolerance) << "cached, position " << done + r;
        EXPECT_LE(MaxAbsDiff(Rows(a, r, 1), Rows(ref_full, done + r, 1), "impl cached vs ref"),
                  kTolerance)
            << "impl cached vs ref uncached, position " << done + r;
        largest = std::max(largest, d);
      }
      done += c;
    }
  }
  std::cout << "impl vs ref " << v.Label() << ": max |diff| " << largest << "\n";
  RecordProperty("max_abs_diff_impl_vs_ref", std::to_string(largest));
}

INSTANTIATE_TEST_SUITE_P(Tiny, ImplVsRef,
                         ::testing::Values(Variant{1, true, false}, Variant{2, false, false},
                                           Variant{3, true, false}, Variant{4, false, false},
                                           Variant{5, true, true}, Variant{6, false, true}),
                         [](const ::testing::TestParamInfo<Variant>& info) {
                           return "seed" + std::to_string(info.param.seed) +
                                  (info.param.tied ? "_tied" : "_untied") +
                                  (info.param.llama3 ? "_llama3" : "");
                         });

// A reused session is where impl and ref part ways on purpose: impl's Session has Reset(), but
// transformers' DynamicCache continues. Both must agree on what "continue" means.
TEST(ImplVsRefSemantics, ReusedCacheContinuesInBoth) {
  auto weights = MakeWeights(TinyConfig(true), 11);
  impl::Model impl_model(weights, kThreads);
  ref::ReferenceModel ref_model(weights, ref::Precision::kFloat32, kThreads);
  const Tokens first = RandomTokens(10, weights->config.vocab_size, 12);
  impl::Session session = impl_model.NewSession();
  ref::DynamicCache cache;
  session.Append(first);
  ref_model.Forward(first, cache);
  EXPECT_LE(MaxAbsDiff(session.Append({42}), ref_model.Forward({42}, cache), "continue"),
            kTolerance);
}

}  // namespace
}  // namespace kvdiff
