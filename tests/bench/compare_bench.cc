// CompareRows (fused) beside the straightforward version it replaced (compare_reference.h), on a
// cached row against its oracle at the vocabularies kvdiff runs: tiny's 256, smollm2-135m's 49152.
// Run both in one process and read the ratio; the absolute times move with the machine's load.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "harness/compare/compare.h"
#include "tests/harness/compare_reference.h"

namespace {

using kvdiff::harness::RowComparison;
using kvdiff::harness::Tolerance;

struct Rows {
  std::vector<float> a, b;
  explicit Rows(int64_t n) : a(n), b(n) {
    std::mt19937 rng(36);
    std::normal_distribution<float> logit(0.0f, 4.0f), error(0.0f, 1e-5f);
    for (int64_t i = 0; i < n; ++i) {
      b[i] = logit(rng);
      a[i] = b[i] + error(rng);
    }
  }
};

void BM_CompareRows(benchmark::State& state) {
  const Rows rows(state.range(0));
  for (auto _ : state) {
    RowComparison c =
        kvdiff::harness::CompareRows(rows.a.data(), rows.b.data(), state.range(0), Tolerance());
    benchmark::DoNotOptimize(c);
  }
}

void BM_CompareRowsReference(benchmark::State& state) {
  const Rows rows(state.range(0));
  for (auto _ : state) {
    RowComparison c = kvdiff::harness::reference::CompareRows(rows.a.data(), rows.b.data(),
                                                              state.range(0), Tolerance());
    benchmark::DoNotOptimize(c);
  }
}

BENCHMARK(BM_CompareRowsReference)->ArgName("vocab")->Arg(256)->Arg(49152);
BENCHMARK(BM_CompareRows)->ArgName("vocab")->Arg(256)->Arg(49152);

}  // namespace

BENCHMARK_MAIN();
