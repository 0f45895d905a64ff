// Rough timing of the impl on a preset (not a test): decode tokens/s at two contexts, prefill
// tokens/s, and the machine's streaming read bandwidth with the same threads. For profiling work;
// `kvdiff bench` (issue 8) is the real benchmark.
//   impl_bench [preset=smollm2-135m] [threads=2]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "harness/format/model_files.h"
#include "impl/model.h"
#include "impl/session.h"
#include "impl/thread_pool.h"

namespace {

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

// GB/s of summing a 1 GiB buffer (far beyond the caches), split over the pool like a matvec.
double ReadBandwidth(kvdiff::impl::ThreadPool& pool) {
  const int64_t n = int64_t{1} << 28;
  std::vector<float> buffer(n, 1.0f);
  std::vector<double> sums(pool.Size());
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    auto start = std::chrono::steady_clock::now();
    pool.ParallelFor(n, 4096, [&](int64_t b, int64_t e, int t) {
      float acc[16] = {};
      for (int64_t i = b; i + 16 <= e; i += 16)
        for (int j = 0; j < 16; ++j) acc[j] += buffer[i + j];
      double s = 0;
      for (float a : acc) s += a;
      sums[t] = s;
    });
    best = std::max(best, n * 4.0 / Seconds(start) / 1e9);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace kvdiff;
  const std::string preset = argc > 1 ? argv[1] : "smollm2-135m";
  const int threads = argc > 2 ? std::atoi(argv[2]) : 2;
  auto weights = std::make_shared<const format::ModelWeights>(
      format::MakeRandomModel(format::PresetConfig(preset), 1));
  double bytes = 0;
  for (const auto& [name, t] : weights->tensors) bytes += 4.0 * t.data.size();
  impl::Model model(weights, threads);
  impl::ThreadPool pool(threads);
  const double bandwidth = ReadBandwidth(pool);
  std::printf("%s, %d threads: weights %.0f MB, read bandwidth %.1f GB/s -> limit %.1f tokens/s\n",
              preset.c_str(), model.Threads(), bytes / 1e6, bandwidth, bandwidth * 1e9 / bytes);

  Tokens prompt(128);
  for (int i = 0; i < 128; ++i) prompt[i] = (i * 7919 + 13) % model.config().vocab_size;
  {
    impl::Session warm = model.NewSession(1024);
    warm.Append(prompt);
    auto start = std::chrono::steady_clock::now();
    impl::Session session = model.NewSession(1024);
    session.Append(prompt);
    std::printf("prefill 128 tokens: %.1f tokens/s\n", 128 / Seconds(start));
  }
  for (int64_t context : {64, 512}) {
    impl::Session session = model.NewSession(1024);
    while (session.Length() < context) session.Append(Tokens(std::min<int64_t>(128, context - session.Length()), 5));
    const int steps = 32;
    auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < steps; ++i) session.Append({static_cast<Token>(i)});
    const double tps = steps / Seconds(start);
    std::printf("decode at context %ld: %.1f tokens/s (%.0f%% of the bandwidth limit)\n",
                static_cast<long>(context), tps, 100 * tps * bytes / (bandwidth * 1e9));
  }
  auto start = std::chrono::steady_clock::now();
  model.ForwardFull(prompt);
  std::printf("ForwardFull 128 tokens: %.3f s\n", Seconds(start));
}
