// The impl's hot kernels on the smollm2-135m shapes (hidden 576, intermediate 1536, vocab 49152,
// 9 query heads and 3 KV heads of 64), for profiling: matrix-vector products (decode), the GEMM of
// a 128-token prefill, attention of one query over the cache, RMSNorm and RoPE. Thread counts are
// the last argument where the kernel takes a pool. Bytes/s counters show how close the
// memory-bound kernels run to the machine's bandwidth (`kvdiff bench` measures it).
//   kernels_bench [--benchmark_filter=MatVec] [--benchmark_min_time=0.5]
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "impl/kernels.h"
#include "impl/thread_pool.h"

namespace kvdiff::impl {
namespace {

constexpr int64_t kHidden = 576, kHeads = 9, kKvHeads = 3, kHeadDim = 64;

ThreadPool& Pool(int threads) {
  static std::map<int, std::unique_ptr<ThreadPool>> pools;
  auto& pool = pools[threads];
  if (!pool) pool = std::make_unique<ThreadPool>(threads);
  return *pool;
}

// Deterministic values in [-1, 1): the kernels' speed does not depend on them.
std::vector<float> Values(int64_t n, uint32_t seed) {
  std::vector<float> v(n);
  for (auto& x : v) {
    seed = seed * 1664525u + 1013904223u;
    x = static_cast<float>(seed >> 8) / 8388608.0f - 1.0f;
  }
  return v;
}

// y (rows) = W (rows, 576) · x: args {rows, threads}. Reads the whole matrix once per call. The
// small matrices stay in L2/L3 between iterations here, which decode never enjoys: see MatVecCold.
void BM_MatVec(benchmark::State& state) {
  const int64_t rows = state.range(0);
  ThreadPool& pool = Pool(static_cast<int>(state.range(1)));
  const std::vector<float> w = Values(rows * kHidden, 1), x = Values(kHidden, 2);
  std::vector<float> y(rows);
  const WeightView view{w.data(), rows, kHidden};
  for (auto _ : state) {
    Linear(pool, x.data(), 1, view, y.data());
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(state.iterations() * rows * kHidden * 4);
  state.SetLabel(std::to_string(rows) + "x576");
}
BENCHMARK(BM_MatVec)
    ->ArgNames({"rows", "threads"})
    ->ArgsProduct({{576, 1536, 49152}, {1, 2}})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// As MatVec, but each call reads the next of enough copies of W to fill 256 MB, far beyond the
// caches: the weights come from DRAM, as in a decode step (which reads each weight once). Args
// {rows, threads, bf16}: bf16 1 stores W as bf16 (half the bytes; Bytes/s counts those read).
void BM_MatVecCold(benchmark::State& state) {
  const int64_t rows = state.range(0);
  ThreadPool& pool = Pool(static_cast<int>(state.range(1)));
  const bool bf16 = state.range(2) != 0;
  const int64_t values = rows * kHidden;
  const int64_t bytes = values * (bf16 ? 2 : 4);
  const int64_t copies = std::max<int64_t>(1, (int64_t{256} << 20) / bytes);
  const std::vector<float> w = Values(bf16 ? values : copies * values, 1), x = Values(kHidden, 2);
  std::vector<uint16_t> half;
  if (bf16) {  // the top halves of copies of w (the kernel widens them; their values don't matter)
    half.resize(copies * values);
    for (int64_t i = 0; i < copies * values; ++i) {
      uint32_t bits;
      std::memcpy(&bits, &w[i % values], sizeof(bits));
      half[i] = static_cast<uint16_t>(bits >> 16);
    }
  }
  std::vector<float> y(rows);
  int64_t next = 0;
  for (auto _ : state) {
    WeightView view{w.data() + (bf16 ? 0 : next * values), rows, kHidden};
    if (bf16) {
      view.half = half.data() + next * values;
      view.dtype = WeightDtype::kBF16;
    }
    Linear(pool, x.data(), 1, view, y.data());
    benchmark::DoNotOptimize(y.data());
    next = (next + 1) % copies;
  }
  state.SetBytesProcessed(state.iterations() * bytes);
}
BENCHMARK(BM_MatVecCold)
    ->ArgNames({"rows", "threads", "bf16"})
    ->ArgsProduct({{576, 1536, 49152}, {1, 2}, {0, 1}})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// Y (s, 1536) = X (s, 576) · Wᵀ with W cold (from DRAM), for the few-row calls of a short uncached
// forward or a small prefill chunk, by each path of Linear: args {s, gemm (0: LinearRows, 1:
// LinearGemm), threads}. Bytes/s counts the weights read once. Sets kLinearRowsMax.
void BM_LinearFewRows(benchmark::State& state) {
  const int64_t s = state.range(0), rows = 1536;
  const bool gemm = state.range(1) != 0;
  ThreadPool& pool = Pool(static_cast<int>(state.range(2)));
  const int64_t floats = rows * kHidden;
  const int64_t copies = std::max<int64_t>(1, (int64_t{256} << 20) / (floats * 4));
  const std::vector<float> w = Values(copies * floats, 1), x = Values(s * kHidden, 2);
  std::vector<float> y(s * rows);
  int64_t next = 0;
  for (auto _ : state) {
    const WeightView view{w.data() + next * floats, rows, kHidden};
    if (gemm) {
      LinearGemm(pool, x.data(), s, view, y.data());
    } else {
      LinearRows(pool, x.data(), s, view, y.data());
    }
    benchmark::DoNotOptimize(y.data());
    next = (next + 1) % copies;
  }
  state.SetBytesProcessed(state.iterations() * floats * 4);
}
BENCHMARK(BM_LinearFewRows)
    ->ArgNames({"s", "gemm", "threads"})
    ->ArgsProduct({{1, 2, 4, 8, 12, 16, 24, 32, 64}, {0, 1}, {2}})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// Y (128, rows) = X (128, in) · Wᵀ: the prefill GEMM; args {rows, in, threads}.
void BM_PrefillGemm(benchmark::State& state) {
  const int64_t rows = state.range(0), in = state.range(1), s = 128;
  ThreadPool& pool = Pool(static_cast<int>(state.range(2)));
  const std::vector<float> w = Values(rows * in, 3), x = Values(s * in, 4);
  std::vector<float> y(s * rows);
  const WeightView view{w.data(), rows, in};
  for (auto _ : state) {
    Linear(pool, x.data(), s, view, y.data());
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["GFLOPS"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * 2 * s * rows * in,
                         benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}
BENCHMARK(BM_PrefillGemm)
    ->ArgNames({"rows", "in", "threads"})
    ->ArgsProduct({{576}, {576}, {1, 2}})
    ->Args({1536, 576, 2})
    ->Args({576, 1536, 2})
    ->Args({192, 576, 2})
    ->Args({49152, 576, 2})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// One query row (9 heads) over a cache of `keys` positions (decode attention); args {keys,
// threads}.
void BM_AttentionDecode(benchmark::State& state) {
  const int64_t keys = state.range(0);
  ThreadPool& pool = Pool(static_cast<int>(state.range(1)));
  const int64_t kv_dim = kKvHeads * kHeadDim, q_dim = kHeads * kHeadDim;
  const std::vector<float> q = Values(q_dim, 5), k = Values(keys * kv_dim, 6),
                           v = Values(keys * kv_dim, 7);
  std::vector<float> out(q_dim);
  AttentionScratch scratch;
  scratch.Reserve(pool.Size(), 1, keys, kHeads, kHeadDim);
  for (auto _ : state) {
    Attention(pool, q.data(), 1, keys - 1, k.data(), v.data(), kHeads, kKvHeads, kHeadDim,
              out.data(), scratch);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(state.iterations() * 2 * keys * kv_dim * 4);
}
BENCHMARK(BM_AttentionDecode)
    ->ArgNames({"keys", "threads"})
    ->ArgsProduct({{64, 512, 2048}, {1, 2}})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// As AttentionDecode, but each call reads the next of enough caches to fill 128 MB, far beyond the
// caches: the keys and values come from DRAM, as in a decode step (where a layer's cache is read
// once per step, 30 layers and 269 MB of weights apart). Args {keys, threads}.
void BM_AttentionDecodeCold(benchmark::State& state) {
  const int64_t keys = state.range(0);
  ThreadPool& pool = Pool(static_cast<int>(state.range(1)));
  const int64_t kv_dim = kKvHeads * kHeadDim, q_dim = kHeads * kHeadDim;
  const int64_t floats = keys * kv_dim;
  const int64_t copies = std::max<int64_t>(1, (int64_t{128} << 20) / (2 * floats * 4));
  const std::vector<float> q = Values(q_dim, 5), k = Values(copies * floats, 6),
                           v = Values(copies * floats, 7);
  std::vector<float> out(q_dim);
  AttentionScratch scratch;
  scratch.Reserve(pool.Size(), 1, keys, kHeads, kHeadDim);
  int64_t next = 0;
  for (auto _ : state) {
    Attention(pool, q.data(), 1, keys - 1, k.data() + next * floats, v.data() + next * floats,
              kHeads, kKvHeads, kHeadDim, out.data(), scratch);
    benchmark::DoNotOptimize(out.data());
    next = (next + 1) % copies;
  }
  state.SetBytesProcessed(state.iterations() * 2 * floats * 4);
}
BENCHMARK(BM_AttentionDecodeCold)
    ->ArgNames({"keys", "threads"})
    ->ArgsProduct({{512, 2048}, {1, 2}})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// 128 query rows attending causally over themselves (prefill attention); args {threads}.
void BM_AttentionPrefill(benchmark::State& state) {
  const int64_t s = 128;
  ThreadPool& pool = Pool(static_cast<int>(state.range(0)));
  const int64_t kv_dim = kKvHeads * kHeadDim, q_dim = kHeads * kHeadDim;
  const std::vector<float> q = Values(s * q_dim, 8), k = Values(s * kv_dim, 9),
                           v = Values(s * kv_dim, 10);
  std::vector<float> out(s * q_dim);
  AttentionScratch scratch;
  scratch.Reserve(pool.Size(), s, s, kHeads, kHeadDim);
  for (auto _ : state) {
    Attention(pool, q.data(), s, 0, k.data(), v.data(), kHeads, kKvHeads, kHeadDim, out.data(),
              scratch);
    benchmark::DoNotOptimize(out.data());
  }
}
BENCHMARK(BM_AttentionPrefill)
    ->ArgNames({"threads"})
    ->Arg(1)
    ->Arg(2)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// RMSNorm of one or 128 rows of 576.
void BM_RmsNorm(benchmark::State& state) {
  const int64_t s = state.range(0);
  const std::vector<float> x = Values(s * kHidden, 11), w = Values(kHidden, 12);
  std::vector<float> out(s * kHidden);
  for (auto _ : state) {
    RmsNorm(x.data(), w.data(), s, kHidden, 1e-5f, out.data());
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations() * s);
}
BENCHMARK(BM_RmsNorm)->ArgNames({"rows"})->Arg(1)->Arg(128)->Unit(benchmark::kNanosecond);

// RoPE of one position's queries (9 heads) and keys (3 heads), head_dim 64.
void BM_Rope(benchmark::State& state) {
  std::vector<float> q = Values(kHeads * kHeadDim, 13), k = Values(kKvHeads * kHeadDim, 14);
  const std::vector<float> cos = Values(kHeadDim / 2, 15), sin = Values(kHeadDim / 2, 16);
  for (auto _ : state) {
    ApplyRope(q.data(), kHeads, kHeadDim / 2, cos.data(), sin.data());
    ApplyRope(k.data(), kKvHeads, kHeadDim / 2, cos.data(), sin.data());
    benchmark::DoNotOptimize(q.data());
    benchmark::DoNotOptimize(k.data());
  }
}
BENCHMARK(BM_Rope)->Unit(benchmark::kNanosecond);

}  // namespace
}  // namespace kvdiff::impl

BENCHMARK_MAIN();
