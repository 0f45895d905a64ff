// Times impl, ref and ref64 on the smollm2-135m shape with random weights (seed 1):
//   full:   ForwardFull of a 128-token prompt (no cache)
//   decode: one Append of 1 token on a cache already holding 64 positions
// Each figure is the median (and min) of --reps timed calls after one untimed warm-up; the cache
// is cropped back to 64 between decode calls (not timed). Measured and printed, never asserted.
//
//   kvdiff_reference_bench [--reps 5] [--threads 2] [--preset smollm2-135m]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "format/model_files.h"
#include "impl/model.h"
#include "impl/session.h"
#include "reference/reference_model.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Stats {
  double median_ms, min_ms;
};

Stats Time(int reps, const std::function<void()>& before, const std::function<void()>& call) {
  before();
  call();  // warm-up: first-touch of weights, allocator, thread pool
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    before();
    const auto start = Clock::now();
    call();
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  }
  std::sort(ms.begin(), ms.end());
  return {ms[ms.size() / 2], ms.front()};
}

kvdiff::Tokens Prompt(int64_t n, int64_t vocab) {
  kvdiff::Tokens t(n);
  uint64_t x = 88172645463325252ull;  // xorshift64: the same prompt everywhere
  for (auto& token : t) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    token = static_cast<kvdiff::Token>(x % static_cast<uint64_t>(vocab));
  }
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 5, threads = 2;
  std::string preset = "smollm2-135m";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--reps"))
      reps = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--threads"))
      threads = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--preset"))
      preset = argv[i + 1];
    else {
      std::fprintf(stderr, "usage: %s [--reps N] [--threads N] [--preset NAME]\n", argv[0]);
      return 2;
    }
  }
  if (reps < 1 || threads < 1) {
    std::fprintf(stderr, "--reps and --threads must be >= 1\n");
    return 2;
  }
  try {
    auto weights = std::make_shared<const kvdiff::format::ModelWeights>(
        kvdiff::format::MakeRandomModel(kvdiff::format::PresetConfig(preset), 1));
    const int64_t vocab = weights->config.vocab_size;
    const kvdiff::Tokens prompt = Prompt(128, vocab);
    const kvdiff::Tokens context = Prompt(64, vocab);
    const kvdiff::Tokens next = {context.back()};
    std::printf("preset %s (seed 1), %d threads, %d reps; median (min) in ms\n", preset.c_str(),
                threads, reps);
    std::printf("%-6s %22s %26s\n", "backend", "ForwardFull(128)", "decode 1 token @ ctx 64");

    {
      kvdiff::impl::Model model(weights, threads);
      const Stats full = Time(
          reps, [] {}, [&] { model.ForwardFull(prompt); });
      kvdiff::impl::Session session = model.NewSession();
      session.Append(context);
      const Stats step = Time(
          reps, [&] { session.Truncate(64); }, [&] { session.Append(next); });
      std::printf("%-7s %12.1f (%7.1f) %16.2f (%7.2f)\n", "impl", full.median_ms, full.min_ms,
                  step.median_ms, step.min_ms);
    }
    for (auto precision : {kvdiff::ref::Precision::kFloat32, kvdiff::ref::Precision::kFloat64}) {
      kvdiff::ref::ReferenceModel model(weights, precision, threads);
      const Stats full = Time(
          reps, [] {}, [&] { model.ForwardFull(prompt); });
      kvdiff::ref::DynamicCache cache;
      model.Forward(context, cache);
      const Stats step = Time(
          reps, [&] { cache.Crop(64); }, [&] { model.Forward(next, cache); });
      std::printf("%-7s %12.1f (%7.1f) %16.2f (%7.2f)\n",
                  precision == kvdiff::ref::Precision::kFloat64 ? "ref64" : "ref", full.median_ms,
                  full.min_ms, step.median_ms, step.min_ms);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvdiff_reference_bench: error: %s\n", e.what());
    return 2;
  }
  return 0;
}
