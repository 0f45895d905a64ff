// `kvdiff bench`'s view of the machine and the model's sizes: bytes a decode step reads, the memory
// bandwidth that bounds it, the load, this process's memory and which BLAS LibTorch loaded.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench.h"
#include "format/error.h"
#include "impl/thread_pool.h"

namespace kvdiff::bench {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

double ReadStatusKb(const std::string& key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key + ":", 0) == 0) {
      std::istringstream fields(line.substr(key.size() + 1));
      double kb = 0;
      fields >> kb;
      return kb;
    }
  }
  return kNaN;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// The model and its sizes.

harness::ModelSpec DefaultBenchModel() {
  harness::ModelSpec spec;
  spec.preset = "smollm2-135m";
  spec.seed = 1;
  return spec;
}

int64_t WeightBytes(const format::LlamaConfig& config) {
  int64_t floats = 0;
  for (const format::TensorSpec& spec : format::ExpectedTensors(config)) {
    int64_t n = 1;
    for (int64_t d : spec.shape) n *= d;
    floats += n;
  }
  return floats * static_cast<int64_t>(sizeof(float));
}

int64_t DecodeWeightBytes(const format::LlamaConfig& config) {
  const int64_t embedding = config.vocab_size * config.hidden_size * 4;
  return config.tie_word_embeddings ? WeightBytes(config) : WeightBytes(config) - embedding;
}

int64_t KvBytesPerPosition(const format::LlamaConfig& config) {
  return 2 * config.num_hidden_layers * config.KvDim() * static_cast<int64_t>(sizeof(float));
}

// ---------------------------------------------------------------------------------------------
// The machine.

// Seconds to read every float of `spans` once (a sum), each span split over the pool the way a
// matrix-vector product splits its rows. 32 independent partial sums (two AVX-512 registers) per
// thread: memory, not the adds, sets the pace (64 measured ~15% slower here: more register
// pressure, worse code).
double StreamingReadSeconds(impl::ThreadPool& pool, const std::vector<FloatSpan>& spans) {
  constexpr int kPad = 16;  // one cache line per thread's result: no false sharing
  std::vector<float> sums(static_cast<size_t>(pool.Size()) * kPad);
  constexpr int64_t kGrain = int64_t{1} << 13;  // 32 KiB per chunk boundary
  const auto start = std::chrono::steady_clock::now();
  for (const FloatSpan& span : spans) {
    pool.ParallelFor(span.size, kGrain, [&](int64_t begin, int64_t end, int thread) {
      constexpr int kLanes = 32;
      float acc[kLanes] = {};
      const float* x = span.data;
      int64_t i = begin;
      for (; i + kLanes <= end; i += kLanes) {
        for (int j = 0; j < kLanes; ++j) acc[j] += x[i + j];
      }
      for (; i < end; ++i) acc[0] += x[i];
      float s = 0;
      for (float a : acc) s += a;
      sums[static_cast<size_t>(thread) * kPad] += s;
    });
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  volatile float sink = 0;  // use the sums, so the reads cannot be optimized away
  for (float v : sums) sink = sink + v;
  return seconds;
}

int64_t SpanBytes(const std::vector<FloatSpan>& spans) {
  int64_t floats = 0;
  for (const FloatSpan& span : spans) floats += span.size;
  return floats * static_cast<int64_t>(sizeof(float));
}

std::vector<FloatSpan> DecodeWeightSpans(const format::ModelWeights& weights) {
  std::vector<FloatSpan> spans;
  for (const format::TensorSpec& spec : format::ExpectedTensors(weights.config)) {
    if (spec.name == "model.embed_tokens.weight" && !weights.config.tie_word_embeddings) continue;
    const format::Tensor& t = weights.Get(spec.name);
    spans.push_back({t.data.data(), static_cast<int64_t>(t.data.size())});
  }
  return spans;
}

double MeasureReadBandwidth(int threads, int64_t bytes, int reps) {
  KVDIFF_CHECK(bytes >= (int64_t{1} << 20),
               "bandwidth buffer: expected at least 1 MiB, got {} bytes", bytes);
  KVDIFF_CHECK(reps >= 1, "bandwidth reps: expected at least 1, got {}", reps);
  impl::ThreadPool pool(threads);
  std::vector<float> buffer(bytes / sizeof(float), 1.0f);  // written, so resident before timing
  const std::vector<FloatSpan> spans = {{buffer.data(), static_cast<int64_t>(buffer.size())}};
  double best = 0;
  for (int rep = 0; rep < reps; ++rep) {
    best = std::max(best, SpanBytes(spans) / StreamingReadSeconds(pool, spans) / 1e9);
  }
  return best;
}

double LoadAverage1() {
  std::ifstream in("/proc/loadavg");
  double load = -1;
  if (!(in >> load)) return -1;
  return load;
}

MemoryUsage ReadMemoryUsage() {
  return {ReadStatusKb("VmRSS") * 1024 / 1e6, ReadStatusKb("VmHWM") * 1024 / 1e6};
}

std::vector<std::string> LoadedBlasLibraries() {
  std::ifstream in("/proc/self/maps");
  std::vector<std::string> out;
  std::string line;
  while (std::getline(in, line)) {
    const size_t slash = line.find('/');
    if (slash == std::string::npos) continue;
    const std::string path = line.substr(slash);
    const std::string file = std::filesystem::path(path).filename().string();
    const bool blas =
        file.find("blas") != std::string::npos || file.find("mkl") != std::string::npos;
    if (blas && std::find(out.begin(), out.end(), path) == out.end()) out.push_back(path);
  }
  return out;
}

std::string BlasKind(const std::string& path) {
  if (path.find("openblas") != std::string::npos) return "OpenBLAS";
  if (path.find("mkl") != std::string::npos) return "MKL";
  if (path.find("blis") != std::string::npos) return "BLIS";
  if (path.find("atlas") != std::string::npos) return "ATLAS";
  if (path.find("/blas/libblas.so") != std::string::npos) {
    return "netlib reference BLAS (unoptimized, one thread)";
  }
  return "unknown";
}

bool ResetPeakMemory() {
  std::ofstream out("/proc/self/clear_refs");
  if (!out) return false;
  out << "5";
  out.flush();
  return static_cast<bool>(out);
}

}  // namespace kvdiff::bench
