#include "bench/bench.h"

#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "format/error.h"
#include "harness/backend/backend.h"
#include "harness/backend/registry.h"
#include "harness/report/run_report.h"
#include "impl/thread_pool.h"

namespace kvdiff::bench {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;
using harness::Backend;
using harness::BackendSession;
using harness::MakeBackend;
using harness::Number;
using harness::XmlEscape;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
// Prompt lengths of the figures (the JSON keys name them, so they are fixed).
constexpr int64_t kPrefillTokens = 128;
constexpr int64_t kContextChunk = 128;  // contexts are built by Appends of this many tokens

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double Median(std::vector<double> v) {
  if (v.empty()) return kNaN;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

// Progress of one figure on stderr: what is measured, the reps done, the time spent. On a
// terminal one line is rewritten after every rep; otherwise (a log file) a line is written when
// the figure starts, at most one a second while it runs, and one when it is done.
class Progress {
 public:
  Progress(const std::string* label, std::string what, int reps)
      : label_(label), what_(std::move(what)), reps_(reps), tty_(isatty(STDERR_FILENO)) {
    if (!label_) return;
    if (!tty_) Print(0, false);
  }
  void Rep(int done) {
    if (!label_) return;
    if (done < reps_ && (tty_ || SecondsSince(last_) >= 1.0)) Print(done, false);
  }
  void Done(int done) {
    if (label_) Print(done, true);
  }

 private:
  void Print(int done, bool end) {
    const std::string text = fmt::format("bench: {}: {}: {}/{} reps, {:.1f} s", *label_, what_,
                                         done, reps_, SecondsSince(start_));
    if (tty_) {
      fmt::print(stderr, "\r\033[K{}{}", text, end ? "\n" : "");
    } else {
      fmt::print(stderr, "{}{}\n", text, end ? " (done)" : "");
    }
    std::fflush(stderr);
    last_ = Clock::now();
  }
  const std::string* label_;  // the backend; nullptr: silent
  std::string what_;
  int reps_;
  bool tty_;
  Clock::time_point start_ = Clock::now(), last_ = Clock::now();
};

// Times `call` up to `reps` times, each after an untimed `before`; stops early (after at least one
// timed call) once `max_seconds` of timed calls are spent. warmup: one untimed round first.
// `progress` reports each rep on stderr.
std::vector<double> Repeat(int reps, double max_seconds, bool warmup,
                           const std::function<void()>& before, const std::function<void()>& call,
                           Progress&& progress) {
  if (warmup) {
    before();
    call();
  }
  std::vector<double> seconds;
  double spent = 0;
  for (int i = 0; i < reps && (i == 0 || spent < max_seconds); ++i) {
    before();
    const auto start = Clock::now();
    call();
    seconds.push_back(SecondsSince(start));
    spent += seconds.back();
    progress.Rep(i + 1);
  }
  progress.Done(static_cast<int>(seconds.size()));
  return seconds;
}

// The same deterministic token sequence on every run and platform (xorshift64).
Tokens BenchTokens(int64_t n, int64_t vocab) {
  Tokens tokens(n);
  uint64_t x = 88172645463325252ull;
  for (Token& t : tokens) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    t = static_cast<Token>(x % static_cast<uint64_t>(vocab));
  }
  return tokens;
}

Tokens Slice(const Tokens& t, int64_t begin, int64_t end) {
  return Tokens(t.begin() + begin, t.begin() + end);
}

// Appends history[session.Length() .. length) in chunks of kContextChunk.
void GrowTo(BackendSession& session, const Tokens& history, int64_t length) {
  while (session.Length() < length) {
    const int64_t at = session.Length();
    session.Append(Slice(history, at, std::min(length, at + kContextChunk)));
  }
}

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

void WriteAll(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the parent went away: nothing left to tell
    done += static_cast<size_t>(n);
  }
}

// Doubles print as JSON null when NaN (a skipped point).
double FromNumber(const json& j) { return j.is_null() ? kNaN : j.get<double>(); }

}  // namespace

// ---------------------------------------------------------------------------------------------
// The model and its sizes.

std::string ModelSource::Describe() const {
  if (dir) return fmt::format("model {}", dir->string());
  return fmt::format("preset {} (random weights, seed {})", preset, seed);
}

format::LlamaConfig ModelSource::Config() const {
  if (dir) return format::InspectModel(*dir).config;  // headers only: validates, loads nothing
  return format::PresetConfig(preset);
}

std::shared_ptr<const format::ModelWeights> ModelSource::Load() const {
  if (dir) return std::make_shared<const format::ModelWeights>(format::LoadModel(*dir));
  return std::make_shared<const format::ModelWeights>(
      format::MakeRandomModel(format::PresetConfig(preset), seed));
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

namespace {

// Seconds to read every float of `spans` once (a sum), each span split over the pool the way a
// matrix-vector product splits its rows. 32 independent partial sums (two AVX-512 registers) per
// thread: memory, not the adds, sets the pace (64 measured ~15% slower here: more register
// pressure, worse code).
double StreamingReadSeconds(impl::ThreadPool& pool, const std::vector<FloatSpan>& spans) {
  constexpr int kPad = 16;  // one cache line per thread's result: no false sharing
  std::vector<float> sums(static_cast<size_t>(pool.Size()) * kPad);
  constexpr int64_t kGrain = int64_t{1} << 13;  // 32 KiB per chunk boundary
  const auto start = Clock::now();
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
  const double seconds = SecondsSince(start);
  volatile float sink = 0;  // use the sums, so the reads cannot be optimized away
  for (float v : sums) sink = sink + v;
  return seconds;
}

int64_t SpanBytes(const std::vector<FloatSpan>& spans) {
  int64_t floats = 0;
  for (const FloatSpan& span : spans) floats += span.size;
  return floats * static_cast<int64_t>(sizeof(float));
}

}  // namespace

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

// ---------------------------------------------------------------------------------------------
// One backend.

json BackendFigures::ToJson() const {
  return json{{"backend", backend},
              {"load_s", load_s},
              {"prefill_tok_s", Number(prefill_tok_s)},
              {"decode_tok_s_ctx64", Number(decode_tok_s_ctx64)},
              {"decode_tok_s_ctx512", Number(decode_tok_s_ctx512)},
              {"full_forward_s_128", Number(full_forward_s_128)},
              {"full_forward_s_512", Number(full_forward_s_512)},
              {"peak_rss_mb", Number(peak_rss_mb)},
              {"peak_rss_with_full_forward_mb", Number(peak_rss_with_full_forward_mb)},
              {"baseline_rss_mb", Number(baseline_rss_mb)},
              {"loaded_rss_mb", Number(loaded_rss_mb)},
              {"load_peak_rss_mb", Number(load_peak_rss_mb)},
              {"peak_reset", peak_reset},
              {"reps_done_min", reps_done_min},
              {"bandwidth_gb_s", Number(bandwidth_gb_s)},
              {"decode_fraction_of_limit_ctx64", Number(decode_fraction_ctx64)},
              {"decode_fraction_of_limit_ctx512", Number(decode_fraction_ctx512)},
              {"blas_libraries", blas_libraries}};
}

BackendFigures BackendFigures::FromJson(const json& j) {
  BackendFigures f;
  f.backend = j.at("backend").get<std::string>();
  f.load_s = j.at("load_s").get<double>();
  f.prefill_tok_s = FromNumber(j.at("prefill_tok_s"));
  f.decode_tok_s_ctx64 = FromNumber(j.at("decode_tok_s_ctx64"));
  f.decode_tok_s_ctx512 = FromNumber(j.at("decode_tok_s_ctx512"));
  f.full_forward_s_128 = FromNumber(j.at("full_forward_s_128"));
  f.full_forward_s_512 = FromNumber(j.at("full_forward_s_512"));
  f.peak_rss_mb = FromNumber(j.at("peak_rss_mb"));
  f.peak_rss_with_full_forward_mb = FromNumber(j.at("peak_rss_with_full_forward_mb"));
  f.baseline_rss_mb = FromNumber(j.at("baseline_rss_mb"));
  f.loaded_rss_mb = FromNumber(j.at("loaded_rss_mb"));
  f.load_peak_rss_mb = FromNumber(j.at("load_peak_rss_mb"));
  f.peak_reset = j.at("peak_reset").get<bool>();
  f.reps_done_min = j.at("reps_done_min").get<int>();
  f.bandwidth_gb_s = FromNumber(j.at("bandwidth_gb_s"));
  f.decode_fraction_ctx64 = FromNumber(j.at("decode_fraction_of_limit_ctx64"));
  f.decode_fraction_ctx512 = FromNumber(j.at("decode_fraction_of_limit_ctx512"));
  f.blas_libraries = j.at("blas_libraries").get<std::vector<std::string>>();
  return f;
}

BackendFigures MeasureBackend(const std::string& backend, const ModelSource& source,
                              const BenchOptions& options) {
  KVDIFF_CHECK(options.reps >= 1, "--reps: expected at least 1, got {}", options.reps);
  BackendFigures f;
  f.backend = backend;
  const std::string* label = options.progress ? &backend : nullptr;
  if (label) fmt::print(stderr, "bench: {}: loading the model\n", backend);
  f.peak_reset = ResetPeakMemory();
  f.baseline_rss_mb = ReadMemoryUsage().rss_mb;

  auto start = Clock::now();
  std::shared_ptr<const format::ModelWeights> weights = source.Load();
  std::unique_ptr<Backend> model = MakeBackend(backend, weights, options.threads);
  f.load_s = SecondsSince(start);
  const MemoryUsage loaded = ReadMemoryUsage();
  f.loaded_rss_mb = loaded.rss_mb;
  f.load_peak_rss_mb = loaded.peak_mb;
  const format::LlamaConfig& c = model->config();
  KVDIFF_CHECK(c.max_position_embeddings > 512,
               "bench: the model holds {} positions; the figures need 513 (decode at context 512)",
               c.max_position_embeddings);
  const Tokens history = BenchTokens(513, c.vocab_size);
  f.reps_done_min = options.reps;
  auto median = [&](const std::vector<double>& seconds) {
    f.reps_done_min = std::min(f.reps_done_min, static_cast<int>(seconds.size()));
    return Median(seconds);
  };

  // Prefill: a fresh session each time (made untimed). The warm-up pays first-touch costs.
  const Tokens prompt = Slice(history, 0, kPrefillTokens);
  std::unique_ptr<BackendSession> session;
  f.prefill_tok_s = kPrefillTokens / median(Repeat(
                                         options.reps, options.max_seconds, true,
                                         [&] {
                                           session.reset();  // one session alive at a time
                                           session = model->NewSession();
                                         },
                                         [&] { session->Append(prompt); },
                                         Progress(label, "prefill 128 tokens", options.reps)));
  session.reset();

  // Decode: every timed step appends position `context` to the same cache, cropped back between
  // steps, so each one sees exactly `context` cached positions. Steps are cheap: 3x the reps.
  // Just before each step (untimed) the weights a step reads are read once more by a plain
  // streaming sum with as many threads: the memory bandwidth of that very moment, so that a
  // neighbour's load on a shared machine moves both figures of a pair alike.
  const std::vector<FloatSpan> spans = DecodeWeightSpans(*weights);
  impl::ThreadPool read_pool(options.threads);
  auto decode = [&](int64_t context, double& bandwidth, double& fraction) {
    std::unique_ptr<BackendSession> s = model->NewSession();
    GrowTo(*s, history, context);
    const Tokens next = {history[context]};
    std::vector<double> reads;
    const std::vector<double> steps = Repeat(
        3 * options.reps, options.max_seconds, true,
        [&] {
          s->Truncate(context);
          // The pools' idle workers spin for 200 us before they sleep: pause so that neither
          // measurement shares the two cores with the other's spinning threads.
          std::this_thread::sleep_for(std::chrono::milliseconds(2));
          reads.push_back(StreamingReadSeconds(read_pool, spans));
          std::this_thread::sleep_for(std::chrono::milliseconds(2));
        },
        [&] { s->Append(next); },
        Progress(label, fmt::format("decode at context {}", context), 3 * options.reps));
    reads.erase(reads.begin());  // the warm-up's
    std::vector<double> bandwidths, fractions;
    for (size_t i = 0; i < steps.size(); ++i) {
      bandwidths.push_back(SpanBytes(spans) / reads[i] / 1e9);
      fractions.push_back(reads[i] / steps[i]);  // (bytes / step) / (bytes / read)
    }
    bandwidth = Median(bandwidths);
    fraction = Median(fractions);
    return 1.0 / median(steps);
  };
  f.decode_tok_s_ctx64 = decode(64, f.bandwidth_gb_s, f.decode_fraction_ctx64);
  double bandwidth_512 = 0;
  f.decode_tok_s_ctx512 = decode(512, bandwidth_512, f.decode_fraction_ctx512);
  f.peak_rss_mb = ReadMemoryUsage().peak_mb;

  auto full = [&](int64_t n) {
    const Tokens tokens = Slice(history, 0, n);
    return median(Repeat(
        options.reps, options.max_seconds, false, [] {}, [&] { model->ForwardFull(tokens); },
        Progress(label, fmt::format("ForwardFull {} tokens", n), options.reps)));
  };
  f.full_forward_s_128 = full(128);
  f.full_forward_s_512 = full(512);
  f.peak_rss_with_full_forward_mb = ReadMemoryUsage().peak_mb;
  f.blas_libraries = LoadedBlasLibraries();
  return f;
}

// ---------------------------------------------------------------------------------------------
// The cost curve.

std::vector<int64_t> PowersOfTwo(int64_t max) {
  KVDIFF_CHECK(max >= 1, "--curve-max: expected at least 1, got {}", max);
  std::vector<int64_t> out;
  for (int64_t c = 1; c <= max; c *= 2) out.push_back(c);
  return out;
}

CostSeries MeasureCostSeries(const std::string& backend, const ModelSource& source,
                             const BenchOptions& options, const std::vector<int64_t>& contexts) {
  KVDIFF_CHECK(std::is_sorted(contexts.begin(), contexts.end()) && !contexts.empty() &&
                   contexts.front() >= 0,
               "cost curve: contexts must be non-negative and ascending");
  const std::string* label = options.progress ? &backend : nullptr;
  if (label) fmt::print(stderr, "bench: {}: loading the model\n", backend);
  std::shared_ptr<const format::ModelWeights> weights = source.Load();
  std::unique_ptr<Backend> model = MakeBackend(backend, weights, options.threads);
  const format::LlamaConfig& c = model->config();
  KVDIFF_CHECK(contexts.back() + 1 <= c.max_position_embeddings,
               "--curve-max: context {} needs {} positions, the model holds {}", contexts.back(),
               contexts.back() + 1, c.max_position_embeddings);
  const Tokens history = BenchTokens(contexts.back() + 1, c.vocab_size);
  CostSeries series;
  series.backend = backend;

  // Before each cached step (untimed), a streaming read of the weights it reads, as in
  // MeasureBackend: the floor the plot draws.
  const std::vector<FloatSpan> spans = DecodeWeightSpans(*weights);
  impl::ThreadPool read_pool(options.threads);
  std::vector<double> reads;
  std::unique_ptr<BackendSession> session = model->NewSession();
  bool first = true;
  for (int64_t context : contexts) {
    GrowTo(*session, history, context);
    const Tokens next = {history[context]};
    series.cached_ms.push_back(1e3 *
                               Median(Repeat(
                                   options.reps, options.max_seconds, first,
                                   [&] {
                                     session->Truncate(context);
                                     std::this_thread::sleep_for(std::chrono::milliseconds(2));
                                     reads.push_back(StreamingReadSeconds(read_pool, spans));
                                     std::this_thread::sleep_for(std::chrono::milliseconds(2));
                                   },
                                   [&] { session->Append(next); },
                                   Progress(label, fmt::format("cached step at context {}", context),
                                            options.reps))));
    first = false;
  }
  series.weights_read_ms = 1e3 * Median(reads);
  session.reset();

  bool too_slow = false;
  for (int64_t context : contexts) {
    if (too_slow) {
      series.uncached_ms.push_back(kNaN);
      continue;
    }
    const Tokens tokens = Slice(history, 0, context + 1);
    const std::vector<double> seconds = Repeat(
        options.reps, options.max_seconds, false, [] {}, [&] { model->ForwardFull(tokens); },
        Progress(label, fmt::format("uncached step at context {} (ForwardFull {} tokens)", context,
                                    context + 1),
                 options.reps));
    series.uncached_ms.push_back(1e3 * Median(seconds));
    too_slow = *std::min_element(seconds.begin(), seconds.end()) > options.max_seconds;
  }
  return series;
}

void WriteCostCsv(const std::filesystem::path& path, const CostCurve& curve) {
  std::ofstream out(path);
  KVDIFF_CHECK(out.good(), "--curve: cannot write {}", path.string());
  out << "context";
  for (const CostSeries& s : curve.series) {
    out << ',' << s.backend << "_cached_ms," << s.backend << "_uncached_ms";
  }
  out << '\n';
  auto cell = [](double v) { return std::isnan(v) ? std::string() : fmt::format("{:.4f}", v); };
  for (size_t i = 0; i < curve.contexts.size(); ++i) {
    out << curve.contexts[i];
    for (const CostSeries& s : curve.series) {
      out << ',' << cell(s.cached_ms.at(i)) << ',' << cell(s.uncached_ms.at(i));
    }
    out << '\n';
  }
  out.flush();
  KVDIFF_CHECK(out.good(), "--curve: writing {} failed", path.string());
}

CostCurve ReadCostCsv(const std::filesystem::path& path) {
  std::ifstream in(path);
  KVDIFF_CHECK(in.good(), "--curve: cannot read {}", path.string());
  auto split = [](const std::string& line) {
    std::vector<std::string> cells;
    std::string cell;
    std::istringstream s(line);
    while (std::getline(s, cell, ',')) cells.push_back(cell);
    if (!line.empty() && line.back() == ',') cells.emplace_back();
    return cells;
  };
  std::string line;
  KVDIFF_CHECK(static_cast<bool>(std::getline(in, line)), "{}: the file is empty", path.string());
  const std::vector<std::string> header = split(line);
  KVDIFF_CHECK(header.size() >= 3 && header.size() % 2 == 1 && header[0] == "context",
               "{}: expected a header \"context,<backend>_cached_ms,<backend>_uncached_ms,...\", "
               "got \"{}\"",
               path.string(), line);
  CostCurve curve;
  const std::string kCached = "_cached_ms", kUncached = "_uncached_ms";
  for (size_t k = 1; k < header.size(); k += 2) {
    const std::string& a = header[k];
    const bool ok = a.size() > kCached.size() &&
                    a.compare(a.size() - kCached.size(), kCached.size(), kCached) == 0 &&
                    header[k + 1] == a.substr(0, a.size() - kCached.size()) + kUncached;
    KVDIFF_CHECK(ok,
                 "{}: columns {} and {} should be <backend>_cached_ms,<backend>_uncached_ms, "
                 "got \"{}\",\"{}\"",
                 path.string(), k + 1, k + 2, a, header[k + 1]);
    curve.series.push_back({a.substr(0, a.size() - kCached.size()), {}, {}});
  }
  int line_number = 1;
  auto number = [&](const std::string& cell) {
    if (cell.empty()) return kNaN;
    size_t used = 0;
    double v = kNaN;
    try {
      v = std::stod(cell, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    KVDIFF_CHECK(used == cell.size() && std::isfinite(v),
                 "{}: line {}: expected a number, got \"{}\"", path.string(), line_number, cell);
    return v;
  };
  while (std::getline(in, line)) {
    ++line_number;
    if (line.empty()) continue;
    const std::vector<std::string> cells = split(line);
    KVDIFF_CHECK(cells.size() == header.size(), "{}: line {} has {} cells, the header has {}",
                 path.string(), line_number, cells.size(), header.size());
    const double context = number(cells[0]);
    KVDIFF_CHECK(!std::isnan(context) && context >= 1,
                 "{}: line {}: context must be >= 1, got \"{}\"", path.string(), line_number,
                 cells[0]);
    curve.contexts.push_back(static_cast<int64_t>(context));
    for (size_t k = 0; k < curve.series.size(); ++k) {
      curve.series[k].cached_ms.push_back(number(cells[1 + 2 * k]));
      curve.series[k].uncached_ms.push_back(number(cells[2 + 2 * k]));
    }
  }
  KVDIFF_CHECK(!curve.contexts.empty(), "{}: no data rows", path.string());
  return curve;
}

// ---------------------------------------------------------------------------------------------
// The plot.

namespace {


std::string MsLabel(double ms) {
  if (ms >= 1000) return fmt::format("{:.3g} s", ms / 1000);
  if (ms >= 1) return fmt::format("{:.3g} ms", ms);
  return fmt::format("{:.3g} µs", ms * 1000);
}

}  // namespace

std::string CostCurveSvg(const CostCurve& curve, const PlotNotes& notes) {
  KVDIFF_CHECK(!curve.contexts.empty() && !curve.series.empty(), "plot: the curve has no data");
  // Notes wrap at spaces to fit the canvas (13 px text: ~125 characters per line).
  std::vector<std::string> lines;
  for (const std::string& line : notes.lines) {
    std::string rest = line;
    while (rest.size() > 125) {
      size_t cut = rest.rfind(' ', 125);
      if (cut == std::string::npos || cut == 0) cut = 125;
      lines.push_back(rest.substr(0, cut));
      rest = "    " + rest.substr(cut + (rest[cut] == ' ' ? 1 : 0));
    }
    lines.push_back(rest);
  }
  // Canvas and plot area (pixels).
  const double width = 960, height = 640;
  const double left = 90, right = 30;
  const double top = 70 + 18.0 * static_cast<double>(lines.size()), bottom = 70;
  const double pw = width - left - right, ph = height - top - bottom;

  // x: log2 of the context; y: log10 of milliseconds, whole decades.
  const double x_lo = std::log2(static_cast<double>(std::max<int64_t>(1, curve.contexts.front())));
  const double x_hi = std::max(x_lo + 1, std::log2(static_cast<double>(curve.contexts.back())));
  double lo = std::numeric_limits<double>::infinity(), hi = 0;
  for (const CostSeries& s : curve.series) {
    for (const auto* v : {&s.cached_ms, &s.uncached_ms}) {
      for (double ms : *v) {
        if (std::isnan(ms) || ms <= 0) continue;
        lo = std::min(lo, ms);
        hi = std::max(hi, ms);
      }
    }
  }
  if (notes.bandwidth_floor_ms > 0) {
    lo = std::min(lo, notes.bandwidth_floor_ms);
    hi = std::max(hi, notes.bandwidth_floor_ms);
  }
  KVDIFF_CHECK(hi > 0, "plot: the curve has no positive times");
  // A third of a decade below the lowest point (room for the floor's label), a little above the
  // top.
  const double y_lo = std::log10(lo) - 0.3, y_hi = std::max(y_lo + 1, std::log10(hi) + 0.08);
  auto X = [&](double context) { return left + pw * (std::log2(context) - x_lo) / (x_hi - x_lo); };
  auto Y = [&](double ms) { return top + ph * (1 - (std::log10(ms) - y_lo) / (y_hi - y_lo)); };

  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" "
      "viewBox=\"0 0 {0} {1}\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n"
      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      width, height);
  svg += fmt::format("<text x=\"{}\" y=\"30\" font-size=\"19\" font-weight=\"bold\">{}</text>\n",
                     left - 60, XmlEscape(notes.title));
  for (size_t i = 0; i < lines.size(); ++i) {
    svg += fmt::format(
        "<text x=\"{}\" y=\"{}\" font-size=\"13\" fill=\"#444\" xml:space=\"preserve\">{}</text>\n",
        left - 60, 54 + 18 * i, XmlEscape(lines[i]));
  }

  // Grid and ticks. y: labelled lines at 1, 2 and 5 x each decade, light lines at the others.
  svg += "<g stroke-width=\"1\">\n";
  for (int e = static_cast<int>(std::floor(y_lo)); e <= static_cast<int>(std::ceil(y_hi)); ++e) {
    for (int m = 1; m <= 9; ++m) {
      const double ms = m * std::pow(10.0, e);
      if (std::log10(ms) < y_lo || std::log10(ms) > y_hi) continue;
      const bool major = m == 1 || m == 2 || m == 5;
      svg += fmt::format(
          "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"{}\"/>\n", left,
          Y(ms), left + pw, Y(ms),
          m == 1  ? "#bbb"
          : major ? "#ddd"
                  : "#f0f0f0");
      if (major) {
        svg += fmt::format(
            "<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"13\" text-anchor=\"end\">{}</text>\n",
            left - 8, Y(ms) + 4, MsLabel(ms));
      }
    }
  }
  for (int64_t context : curve.contexts) {
    const double x = X(static_cast<double>(context));
    svg += fmt::format(
        "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#ddd\"/>\n", x, top,
        x, top + ph);
    svg += fmt::format(
        "<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"13\" text-anchor=\"middle\">{}</text>\n", x,
        top + ph + 20, context);
  }
  svg += fmt::format(
      "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#333\"/>\n", left,
      top, pw, ph);
  svg += "</g>\n";
  svg += fmt::format(
      "<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"14\" text-anchor=\"middle\">context length: "
      "positions already in the cache before the step (log scale)</text>\n",
      left + pw / 2, height - 22);
  svg += fmt::format(
      "<text transform=\"translate(24,{:.1f}) rotate(-90)\" font-size=\"14\" "
      "text-anchor=\"middle\">time to produce the next token's logits (log scale)</text>\n",
      top + ph / 2);

  // The memory-bandwidth line: a cached step cannot be much faster than reading its weights once.
  if (notes.bandwidth_floor_ms > 0) {
    const double y = Y(notes.bandwidth_floor_ms);
    svg += fmt::format(
        "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#2ca02c\" "
        "stroke-width=\"1.5\" stroke-dasharray=\"2,4\"/>\n",
        left, y, left + pw, y);
    svg += fmt::format(
        "<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"12\" fill=\"#2ca02c\" text-anchor=\"end\">"
        "memory-bandwidth limit: one streaming read of the weights a step reads = {}</text>\n",
        left + pw - 6, y + 16, MsLabel(notes.bandwidth_floor_ms));
  }

  // The series: one colour per backend; solid circles cached, dashed squares uncached.
  const char* kColours[] = {"#1f63b4", "#d9480f", "#7b2cbf", "#555555", "#c2255c", "#0b7285"};
  struct Legend {
    std::string colour, text;
    bool dashed;
  };
  std::vector<Legend> legend;
  for (size_t k = 0; k < curve.series.size(); ++k) {
    const CostSeries& s = curve.series[k];
    const std::string colour = kColours[k % 6];
    for (int uncached = 0; uncached < 2; ++uncached) {
      const std::vector<double>& ms = uncached ? s.uncached_ms : s.cached_ms;
      std::string points;
      std::string markers;
      for (size_t i = 0; i < curve.contexts.size() && i < ms.size(); ++i) {
        if (std::isnan(ms[i]) || ms[i] <= 0) continue;
        const double x = X(static_cast<double>(curve.contexts[i])), y = Y(ms[i]);
        points += fmt::format("{:.1f},{:.1f} ", x, y);
        markers += uncached
                       ? fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"7\" height=\"7\"/>",
                                     x - 3.5, y - 3.5)
                       : fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3.5\"/>", x, y);
      }
      if (points.empty()) continue;
      svg += fmt::format(
          "<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2.2\"{}/>\n", points,
          colour, uncached ? " stroke-dasharray=\"8,5\"" : "");
      svg += fmt::format("<g fill=\"{}\">{}</g>\n", colour, markers);
      legend.push_back({colour,
                        uncached ? s.backend + ", uncached: ForwardFull of the whole history"
                                 : s.backend + ", cached: Session Append of 1 token",
                        uncached == 1});
    }
  }
  const double lx = left + 16, ly = top + 14;
  svg += fmt::format(
      "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"400\" height=\"{:.1f}\" fill=\"white\" "
      "fill-opacity=\"0.9\" stroke=\"#999\"/>\n",
      lx - 8, ly - 6, 22.0 * legend.size() + 8);
  for (size_t i = 0; i < legend.size(); ++i) {
    const double y = ly + 22.0 * i + 8;
    svg += fmt::format(
        "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"{}\" "
        "stroke-width=\"2.2\"{}/>\n",
        lx, y, lx + 34, y, legend[i].colour, legend[i].dashed ? " stroke-dasharray=\"8,5\"" : "");
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"13\">{}</text>\n", lx + 44,
                       y + 4.5, XmlEscape(legend[i].text));
  }
  svg += "</svg>\n";
  return svg;
}

// ---------------------------------------------------------------------------------------------
// Child processes.

json RunInChild(const std::function<json()>& fn) {
  int fds[2];
  if (pipe(fds) != 0) throw std::runtime_error(fmt::format("pipe: {}", std::strerror(errno)));
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    throw std::runtime_error(fmt::format("fork: {}", std::strerror(errno)));
  }
  if (pid == 0) {
    close(fds[0]);
    json result;
    int code = 0;
    try {
      result = {{"ok", fn()}};
    } catch (const InputError& e) {
      result = {{"input_error", e.what()}};
      code = 1;
    } catch (const std::exception& e) {
      result = {{"error", e.what()}};
      code = 1;
    } catch (...) {
      result = {{"error", "unknown exception"}};
      code = 1;
    }
    WriteAll(fds[1], result.dump());
    close(fds[1]);
    _exit(code);  // no atexit handlers or static destructors: they belong to the parent
  }
  close(fds[1]);
  std::string text;
  char buffer[4096];
  while (true) {
    const ssize_t n = read(fds[0], buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buffer, static_cast<size_t>(n));
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFSIGNALED(status)) {
    throw std::runtime_error(fmt::format("the benchmark's child process died of signal {} ({})",
                                         WTERMSIG(status), strsignal(WTERMSIG(status))));
  }
  const json result = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (result.is_object() && result.contains("ok")) return result.at("ok");
  if (result.is_object() && result.contains("input_error")) {
    throw InputError(result.at("input_error").get<std::string>());
  }
  if (result.is_object() && result.contains("error")) {
    throw std::runtime_error(result.at("error").get<std::string>());
  }
  throw std::runtime_error(fmt::format(
      "the benchmark's child process exited with status {} and no result", WEXITSTATUS(status)));
}

}  // namespace kvdiff::bench
