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
#include "harness/run/model_for.h"
#include "impl/thread_pool.h"

namespace kvdiff::bench {
namespace {

using Clock = std::chrono::steady_clock;
using harness::Backend;
using harness::BackendSession;
using harness::BatchItem;
using harness::MakeBackend;
using harness::Number;
using harness::XmlEscape;
using nlohmann::json;

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
// One backend.

json BackendFigures::ToJson() const {
  return json{{"backend", backend},
              {"load_s", load_s},
              {"prefill_tok_s", Number(prefill_tok_s)},
              {"decode_tok_s_ctx64", Number(decode_tok_s_ctx64)},
              {"decode_tok_s_ctx512", Number(decode_tok_s_ctx512)},
              {"batch_decode_tok_s_1", Number(batch_decode_tok_s_1)},
              {"batch_decode_tok_s_4", Number(batch_decode_tok_s_4)},
              {"batch_decode_tok_s_16", Number(batch_decode_tok_s_16)},
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
  // Reports written before batched decode was measured have none.
  f.batch_decode_tok_s_1 =
      j.contains("batch_decode_tok_s_1") ? FromNumber(j.at("batch_decode_tok_s_1")) : 0;
  f.batch_decode_tok_s_4 =
      j.contains("batch_decode_tok_s_4") ? FromNumber(j.at("batch_decode_tok_s_4")) : 0;
  f.batch_decode_tok_s_16 =
      j.contains("batch_decode_tok_s_16") ? FromNumber(j.at("batch_decode_tok_s_16")) : 0;
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

BackendFigures MeasureBackend(const std::string& backend, const harness::ModelSpec& source,
                              const BenchOptions& options) {
  KVDIFF_CHECK(options.reps >= 1, "--reps: expected at least 1, got {}", options.reps);
  BackendFigures f;
  f.backend = backend;
  const std::string* label = options.progress ? &backend : nullptr;
  if (label) fmt::print(stderr, "bench: {}: loading the model\n", backend);
  f.peak_reset = ResetPeakMemory();
  f.baseline_rss_mb = ReadMemoryUsage().rss_mb;

  auto start = Clock::now();
  std::shared_ptr<const format::ModelWeights> weights = harness::LoadModelFor(source);
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

  // Batched decode: n conversations at context 64, one token each in ONE call, cropped back
  // between calls. The backend's own batched forward where it has one (impl, ABI-2 plugins,
  // llama.cpp), else the default's items one after another: the ratio to n = 1 shows which.
  auto batch_decode = [&](int64_t n) {
    std::vector<std::unique_ptr<BackendSession>> sessions;
    std::vector<BatchItem> items;
    for (int64_t i = 0; i < n; ++i) {
      sessions.push_back(model->NewSession());
      GrowTo(*sessions.back(), history, 64);
      items.push_back({sessions.back().get(), {history[64]}, {}});
    }
    return n / median(Repeat(
                   3 * options.reps, options.max_seconds, true,
                   [&] {
                     for (auto& s : sessions) s->Truncate(64);
                   },
                   [&] { model->AppendBatch(items); },
                   Progress(label, fmt::format("batched decode of {} conversations", n),
                            3 * options.reps)));
  };
  // An engine may hold fewer conversations at once (llama.cpp's sessions=N): its refusal is
  // that figure missing (NaN, printed "-"), said on stderr, not the end of the benchmark.
  auto batch_figure = [&](int64_t n) {
    try {
      return batch_decode(n);
    } catch (const InputError& e) {
      fmt::print(stderr, "bench: {}: batched decode of {} conversations refused: {}\n", backend, n,
                 e.what());
      return std::numeric_limits<double>::quiet_NaN();
    }
  };
  f.batch_decode_tok_s_1 = batch_figure(1);
  f.batch_decode_tok_s_4 = batch_figure(4);
  f.batch_decode_tok_s_16 = batch_figure(16);

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

CostSeries MeasureCostSeries(const std::string& backend, const harness::ModelSpec& source,
                             const BenchOptions& options, const std::vector<int64_t>& contexts) {
  KVDIFF_CHECK(std::is_sorted(contexts.begin(), contexts.end()) && !contexts.empty() &&
                   contexts.front() >= 0,
               "cost curve: contexts must be non-negative and ascending");
  const std::string* label = options.progress ? &backend : nullptr;
  if (label) fmt::print(stderr, "bench: {}: loading the model\n", backend);
  std::shared_ptr<const format::ModelWeights> weights = harness::LoadModelFor(source);
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
    series.cached_ms.push_back(
        1e3 *
        Median(Repeat(
            options.reps, options.max_seconds, first,
            [&] {
              session->Truncate(context);
              std::this_thread::sleep_for(std::chrono::milliseconds(2));
              reads.push_back(StreamingReadSeconds(read_pool, spans));
              std::this_thread::sleep_for(std::chrono::milliseconds(2));
            },
            [&] { session->Append(next); },
            Progress(label, fmt::format("cached step at context {}", context), options.reps))));
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
        Progress(label,
                 fmt::format("uncached step at context {} (ForwardFull {} tokens)", context,
                             context + 1),
                 options.reps));
    series.uncached_ms.push_back(1e3 * Median(seconds));
    too_slow = *std::min_element(seconds.begin(), seconds.end()) > options.max_seconds;
  }
  return series;
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
