// The main job's speed, for docs/performance.md's figures (it asserts nothing):
//   CheckCampaign/jobs:N    `kvdiff check`'s campaign on the tiny preset with the default backends
//                           (impl, ref), one thread per backend, N jobs; counter cases_per_s
//   RefForwardFull/tokens:512/threads:T   the reference's uncached forward on smollm2-135m, with
//                           the BLAS that libblas.so.3 resolved to in the label
//   check_bench [--benchmark_filter=CheckCampaign]
// Run it once per BLAS (LD_LIBRARY_PATH=<netlib's folder> for netlib): the BLAS is the process's.
#include <benchmark/benchmark.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench.h"
#include "harness/backend/registry.h"
#include "harness/campaign/campaign.h"
#include "harness/run/differential_run.h"

namespace kvdiff::harness {
namespace {

std::string BlasLabel() {
  for (const std::string& path : bench::LoadedBlasLibraries()) {
    if (path.find("libblas.so") != std::string::npos) return bench::BlasKind(path) + " " + path;
  }
  return "no libblas.so.3 loaded";
}

std::shared_ptr<const format::ModelWeights> Weights(const std::string& preset) {
  static std::map<std::string, std::shared_ptr<const format::ModelWeights>> cache;
  auto& w = cache[preset];
  if (!w) {
    ModelSpec spec;
    spec.preset = preset;
    spec.seed = 7;
    w = LoadModelFor(spec);
  }
  return w;
}

void CheckCampaign(benchmark::State& state) {
  const int jobs = static_cast<int>(state.range(0));
  constexpr int64_t kCases = 60;
  ModelSpec model;
  model.preset = "tiny";
  model.seed = 7;
  std::vector<std::unique_ptr<Backend>> owned;
  std::vector<std::vector<const Backend*>> job_lists(jobs);
  for (auto& list : job_lists) {
    for (const std::string& name : DefaultBackends()) {
      owned.push_back(MakeBackend(name, Weights("tiny"), 1));
      list.push_back(owned.back().get());
    }
  }
  CampaignOptions options;
  options.cases = kCases;
  options.out_dir = std::filesystem::temp_directory_path() / "kvdiff-check-bench";
  for (auto _ : state) {
    const CampaignReport report = RunCampaignOnJobs(model, job_lists, options);
    benchmark::DoNotOptimize(report.rows_compared);
    options.seed++;  // new cases each time, the same for every job count
  }
  state.counters["cases_per_s"] = benchmark::Counter(
      static_cast<double>(kCases * state.iterations()), benchmark::Counter::kIsRate);
}
BENCHMARK(CheckCampaign)->ArgName("jobs")->Arg(1)->Arg(2)->UseRealTime()->Unit(benchmark::kSecond);

void RefForwardFull(benchmark::State& state) {
  const auto ref = MakeBackend("ref", Weights("smollm2-135m"), static_cast<int>(state.range(1)));
  Tokens tokens(state.range(0));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<Token>((i * 7919) % 49152);
  for (auto _ : state) benchmark::DoNotOptimize(ref->ForwardFull(tokens));
  state.SetLabel(BlasLabel());
}
BENCHMARK(RefForwardFull)
    ->ArgNames({"tokens", "threads"})
    ->Args({512, 1})
    ->Args({512, 2})
    ->UseRealTime()
    ->Unit(benchmark::kSecond);

}  // namespace
}  // namespace kvdiff::harness

BENCHMARK_MAIN();
