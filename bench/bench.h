// `kvdiff bench`: throughput, latency and memory of the backends on one model, side by side, and
// the cost of a decode step against context length (cached vs uncached). Measured and printed,
// never asserted: time depends on the machine and its load.
//
// Every backend is measured in a forked child process that loads the model itself, so each one's
// peak resident memory is its own, and LibTorch's OpenMP threads never meet the impl's pool. The
// parent starts no threads of its own (forking a multi-threaded process is unsafe).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "format/config.h"
#include "format/model_files.h"
#include "harness/scenario/scenario.h"

namespace kvdiff::impl {
class ThreadPool;
}  // namespace kvdiff::impl

namespace kvdiff::bench {

// Where a benchmark gets its weights: a scenario's model spec (a model directory, or a preset with
// random weights; harness/run/model_for.h loads it), by default the real model's shape.
harness::ModelSpec DefaultBenchModel();  // preset smollm2-135m, seed 1

// Float32 bytes a decode step must read from memory: every weight matrix once (the head is the
// embedding matrix when tied; an untied embedding is only looked up, one row, so it is left out).
int64_t DecodeWeightBytes(const format::LlamaConfig& config);
// Float32 bytes every model parameter takes in memory (tied embeddings counted once).
int64_t WeightBytes(const format::LlamaConfig& config);
// Bytes of K and V one position adds to a float32 cache (all layers).
int64_t KvBytesPerPosition(const format::LlamaConfig& config);

// A run of floats in memory.
struct FloatSpan {
  const float* data;
  int64_t size;
};
// The weights a decode step reads (DecodeWeightBytes): every tensor but an untied embedding.
std::vector<FloatSpan> DecodeWeightSpans(const format::ModelWeights& weights);
// Bytes of the floats of `spans`.
int64_t SpanBytes(const std::vector<FloatSpan>& spans);
// Seconds to read every float of `spans` once (a sum), each span split over the pool the way a
// matrix-vector product splits its rows: the floor under a decode step.
double StreamingReadSeconds(impl::ThreadPool& pool, const std::vector<FloatSpan>& spans);

// GB/s (1e9 bytes/s) of a streaming read (a sum) over a buffer of `bytes`, far larger than the
// caches, split over `threads` threads by the impl's thread pool the way a matrix-vector product
// is. The best of `reps` passes: the figure is a ceiling for decode.
double MeasureReadBandwidth(int threads, int64_t bytes = int64_t{1} << 30, int reps = 5);

// The 1-minute load average (/proc/loadavg), or -1 where it cannot be read.
double LoadAverage1();

// Resident memory of this process from /proc/self/status, in MB (1e6 bytes).
struct MemoryUsage {
  double rss_mb = 0;   // VmRSS: now
  double peak_mb = 0;  // VmHWM: the high-water mark
};
MemoryUsage ReadMemoryUsage();
// Paths of the BLAS/LAPACK/MKL libraries mapped into this process (/proc/self/maps), deduplicated.
std::vector<std::string> LoadedBlasLibraries();
// "netlib reference BLAS (unoptimized)", "OpenBLAS", "MKL" or "unknown", from a library path.
std::string BlasKind(const std::string& path);

// Resets VmHWM to the current RSS (writes 5 to /proc/self/clear_refs); false where unsupported.
bool ResetPeakMemory();

struct BenchOptions {
  int threads = 0;          // 0: every core
  int reps = 5;             // timed repetitions per figure; the figure is their median
  double max_seconds = 60;  // per figure: stop repeating (after one rep) once this is spent
  bool progress = false;    // report every figure on stderr: what, reps done, seconds spent
};

// The figures of one backend. Throughputs and times are medians of the timed repetitions.
struct BackendFigures {
  std::string backend;
  double load_s = 0;               // building the model from the weights (and the weights)
  double prefill_tok_s = 0;        // one Append of a 128-token prompt to an empty session
  double decode_tok_s_ctx64 = 0;   // one Append of 1 token to a session holding 64 positions
  double decode_tok_s_ctx512 = 0;  // ... holding 512 positions
  // Batched decode (a serving engine's step): ONE AppendBatch of one token for each of 1, 4 and
  // 16 conversations holding 64 positions each; tokens/s = conversations / the call's time.
  double batch_decode_tok_s_1 = 0, batch_decode_tok_s_4 = 0, batch_decode_tok_s_16 = 0;
  double full_forward_s_128 = 0;  // ForwardFull of 128 tokens (no cache)
  double full_forward_s_512 = 0;  // ForwardFull of 512 tokens
  // Peak RSS while loading, prefilling 128 tokens and decoding at contexts 64 and 512 (the
  // 512-position context built in chunks of 128): what serving costs.
  double peak_rss_mb = 0;
  double peak_rss_with_full_forward_mb = 0;  // the same, after the ForwardFull runs too
  double baseline_rss_mb = 0;                // the process before the model was loaded
  double loaded_rss_mb = 0;                  // right after loading (weights + backend)
  double load_peak_rss_mb = 0;               // the peak while loading (the loader's transients)
  bool peak_reset = false;                   // whether the peak could be reset at the start
  int reps_done_min = 0;  // fewest repetitions any figure got (max_seconds can cut them short)
  // Memory bandwidth measured in the same process, interleaved with the decode steps at context
  // 64: before each step, a streaming read of the weights the step reads (median GB/s).
  double bandwidth_gb_s = 0;
  // Median over the steps of (the read's time / the step's time): the step's speed as a fraction
  // of reading its weights once at the bandwidth of that moment.
  double decode_fraction_ctx64 = 0;
  double decode_fraction_ctx512 = 0;
  // The BLAS libraries mapped into the process (LibTorch's GEMMs run there; "ref" is only as fast
  // as the BLAS that libblas.so.3 resolves to: Debian's default is the unoptimized netlib one).
  std::vector<std::string> blas_libraries;

  nlohmann::json ToJson() const;
  static BackendFigures FromJson(const nlohmann::json& j);
};

// Loads the model and measures one backend ("impl", "ref", "ref64") in this process, in the order
// prefill, decode@64, decode@512, [peak RSS], ForwardFull 128, ForwardFull 512.
BackendFigures MeasureBackend(const std::string& backend, const harness::ModelSpec& source,
                              const BenchOptions& options);

// Cost of one decode step at each context c: "cached" is one Session Append of 1 token to a
// session holding c positions; "uncached" is ForwardFull of the c + 1 tokens of the same history
// (what producing that step's logits costs without a cache). Milliseconds, median of the reps;
// NaN where skipped (a backend stops its uncached series once one point takes more than
// options.max_seconds, and the bigger contexts would only take longer).
struct CostSeries {
  std::string backend;
  std::vector<double> cached_ms;    // one per context
  std::vector<double> uncached_ms;  // one per context
  double weights_read_ms = 0;       // median streaming read of the weights a step reads
};
struct CostCurve {
  std::vector<int64_t> contexts;
  std::vector<CostSeries> series;
};
std::vector<int64_t> PowersOfTwo(int64_t max);  // 1, 2, 4, ..., max
CostSeries MeasureCostSeries(const std::string& backend, const harness::ModelSpec& source,
                             const BenchOptions& options, const std::vector<int64_t>& contexts);

// CSV: context,<backend>_cached_ms,<backend>_uncached_ms,... (empty cell where skipped).
void WriteCostCsv(const std::filesystem::path& path, const CostCurve& curve);
CostCurve ReadCostCsv(const std::filesystem::path& path);  // throws InputError on a bad file

// What the plot says about its run (title and notes under it).
struct PlotNotes {
  std::string title;
  std::vector<std::string> lines;  // setup: model, threads, machine, load
  double bandwidth_floor_ms = 0;   // weights ÷ bandwidth: a horizontal line, 0 for none
};
// A self-contained SVG: log-log axes (context 1..max, ms), grid, labels, legend.
std::string CostCurveSvg(const CostCurve& curve, const PlotNotes& notes);

// Runs fn in a forked child and returns the JSON it produced. The child's exceptions come back as
// std::runtime_error with their message; a child killed by a signal is reported with the signal.
nlohmann::json RunInChild(const std::function<nlohmann::json()>& fn);

}  // namespace kvdiff::bench
