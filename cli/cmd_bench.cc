// `kvdiff bench`: the backends side by side on one model (throughput, latency, peak memory) against
// the machine's measured memory bandwidth; with --curve, the cost of a decode step against context
// length, cached vs uncached, as CSV and an SVG plot.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "format/error.h"
#include "harness/backend/backend.h"
#include "harness/backend/registry.h"
#include "harness/run/model_for.h"
#include "impl/kernel_path.h"

namespace kvdiff::cli {
namespace {

using nlohmann::json;

struct BenchArgs {
  ModelFlags model;  // --model, --preset, --seed
  int threads = 0;
  std::string backends;
  std::string json_path;
  int reps = 5;
  double max_seconds = 60;
  std::string curve_path;
  std::string plot_path;
  int64_t curve_max = 2048;
  bool replot = false;
  bool quick = false;
  bool figures_too = false;
};

// Any backend the registry can build: impl, impl?weights=f32, ref, llama.cpp?weights=bf16,
// plugin:PATH?key=value, ...
std::vector<std::string> ParseBackends(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string name;
  const harness::BackendRegistry& registry = harness::BackendRegistry::Global();
  while (std::getline(in, name, ',')) {
    if (name.empty()) continue;
    try {
      registry.Info(name);  // InputError naming what this build has when it cannot be built
    } catch (const InputError& e) {
      throw InputError(
          fmt::format("--backends: unknown or unavailable backend '{}': {}", name, e.what()));
    }
    KVDIFF_CHECK(std::find(out.begin(), out.end(), name) == out.end(),
                 "--backends: '{}' is listed twice", name);
    out.push_back(name);
  }
  KVDIFF_CHECK(!out.empty(),
               "--backends: expected a comma-separated list such as impl,ref, got '{}'", text);
  return out;
}

// The dtypes of a model directory's tensors ("BF16" -> count), read once; empty for a preset,
// whose random weights are float32 values.
std::map<std::string, int64_t> DiskDtypes(const harness::ModelSpec& source) {
  if (!source.path) return {};
  return format::InspectModel(*source.path).tensors_by_dtype;
}

// "BF16 on disk" for a model directory; "float32 weights" for a preset.
std::string OnDisk(const std::map<std::string, int64_t>& dtypes) {
  if (dtypes.empty()) return "float32 weights";
  std::vector<std::string> names;
  for (const auto& [dtype, count] : dtypes) names.push_back(dtype);
  return fmt::format("{} on disk", fmt::join(names, "+"));
}

// Bytes per weight value impl's default storage reads: 2 for a checkpoint stored entirely in bf16
// or f16 (impl keeps those matrices in 16 bits, see impl::WeightStorage), else 4.
int ImplBytesPerWeight(const std::map<std::string, int64_t>& dtypes) {
  const bool sixteen =
      !dtypes.empty() && std::all_of(dtypes.begin(), dtypes.end(), [](const auto& entry) {
        return entry.first == "BF16" || entry.first == "F16";
      });
  return sixteen ? 2 : 4;
}

std::string CpuName() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(colon + 2);
    }
  }
  return "unknown CPU";
}

std::string Cell(double v, const char* spec) {
  return std::isnan(v) ? std::string("-") : fmt::format(fmt::runtime(spec), v);
}

json Figures(const bench::BenchOptions& options, const harness::ModelSpec& source,
             const std::string& backend) {
  return bench::MeasureBackend(backend, source, options).ToJson();
}

double Bandwidth(int threads) {
  return bench::RunInChild([threads] { return json(bench::MeasureReadBandwidth(threads)); })
      .get<double>();
}

void RunFigures(const BenchArgs& args, const harness::ModelSpec& source,
                const std::vector<std::string>& backends, int threads) {
  const format::LlamaConfig config = harness::ConfigFor(source);
  const double weight_mb = bench::WeightBytes(config) / 1e6;
  const double decode_mb = bench::DecodeWeightBytes(config) / 1e6;
  const double load_before = bench::LoadAverage1();
  const std::map<std::string, int64_t> dtypes = DiskDtypes(source);
  fmt::print("kvdiff bench: {}, {}, {} threads, {} ({} cores), impl kernels {}\n",
             source.Describe(), OnDisk(dtypes), threads, CpuName(),
             std::thread::hardware_concurrency(), impl::KernelPath());
  fmt::print("weights {:.1f} MB in memory; a decode step reads {:.1f} MB of them\n", weight_mb,
             decode_mb);
  fmt::print("1-minute load average before: {:.2f}\n", load_before);
  std::fflush(stdout);

  bench::BenchOptions options;
  options.threads = threads;
  options.reps = args.reps;
  options.max_seconds = args.max_seconds;
  options.progress = true;

  // The machine's bandwidth, from a separate 1 GiB buffer; the limit the impl is held to is the
  // bandwidth measured inside its own run, interleaved with its decode steps (see BackendFigures).
  fmt::print(stderr, "bench: measuring the memory read bandwidth (1 GiB, best of 5)\n");
  const double bandwidth_1gib = Bandwidth(threads);
  std::map<std::string, bench::BackendFigures> figures;
  for (const std::string& backend : backends) {
    fmt::print("measuring {} ...\n", backend);
    std::fflush(stdout);
    figures[backend] = bench::BackendFigures::FromJson(
        bench::RunInChild([&] { return Figures(options, source, backend); }));
  }
  const bool impl_ran = figures.count("impl") > 0;
  const double bandwidth = impl_ran ? figures["impl"].bandwidth_gb_s : bandwidth_1gib;
  const double limit_tok_s = bandwidth * 1e3 / decode_mb;
  const double load_after = bench::LoadAverage1();

  fmt::print(
      "\nmemory read bandwidth: {:.1f} GB/s -> decode limit {:.1f} tok/s ({:.1f} MB of weights "
      "per token)\n",
      bandwidth, limit_tok_s, decode_mb);
  fmt::print("  {}; a separate streaming read of 1 GiB gave {:.1f} GB/s (best of 5)\n",
             impl_ran
                 ? fmt::format("median of {} streaming reads of those weights with {} threads, "
                               "each just before a timed impl decode step",
                               3 * args.reps, threads)
                 : std::string("no impl run"),
             bandwidth_1gib);
  fmt::print("medians of {} timed runs (decode: {} steps) after a warm-up\n\n", args.reps,
             3 * args.reps);
  const bool has_impl = figures.count("impl"), has_ref = figures.count("ref");
  std::vector<std::string> columns = backends;
  // The first backend against each of the others: first/other, > 1 where the first is faster
  // (throughput) or where it is slower or larger (times, memory: read the words).
  const std::string& first = backends.front();
  const std::vector<std::string> others(backends.begin() + 1, backends.end());
  size_t width = 12;
  for (const auto& b : columns) width = std::max(width, b.size() + 2);
  fmt::print("{:<26}", "");
  for (const auto& b : columns) fmt::print("{:>{}}", b, width);
  for (const auto& b : others) fmt::print("{:>{}}", first + "/" + b, first.size() + b.size() + 4);
  fmt::print("\n");
  struct Row {
    const char* label;
    double bench::BackendFigures::*field;
    const char* spec;
    bool higher_is_better;
  };
  const Row rows[] = {
      {"prefill 128 (tok/s)", &bench::BackendFigures::prefill_tok_s, "{:.1f}", true},
      {"decode @ ctx 64 (tok/s)", &bench::BackendFigures::decode_tok_s_ctx64, "{:.1f}", true},
      {"decode @ ctx 512 (tok/s)", &bench::BackendFigures::decode_tok_s_ctx512, "{:.1f}", true},
      {"batch decode x1 (tok/s)", &bench::BackendFigures::batch_decode_tok_s_1, "{:.1f}", true},
      {"batch decode x4 (tok/s)", &bench::BackendFigures::batch_decode_tok_s_4, "{:.1f}", true},
      {"batch decode x16 (tok/s)", &bench::BackendFigures::batch_decode_tok_s_16, "{:.1f}", true},
      {"ForwardFull 128 (s)", &bench::BackendFigures::full_forward_s_128, "{:.3f}", false},
      {"ForwardFull 512 (s)", &bench::BackendFigures::full_forward_s_512, "{:.3f}", false},
      {"peak RSS (MB)", &bench::BackendFigures::peak_rss_mb, "{:.0f}", false},
      {"  with ForwardFull (MB)", &bench::BackendFigures::peak_rss_with_full_forward_mb, "{:.0f}",
       false},
      {"  process before load (MB)", &bench::BackendFigures::baseline_rss_mb, "{:.0f}", false},
      {"  after load (MB)", &bench::BackendFigures::loaded_rss_mb, "{:.0f}", false},
      {"  peak while loading (MB)", &bench::BackendFigures::load_peak_rss_mb, "{:.0f}", false},
      {"load (s)", &bench::BackendFigures::load_s, "{:.2f}", false},
  };
  for (const Row& row : rows) {
    fmt::print("{:<26}", row.label);
    for (const auto& b : columns)
      fmt::print("{:>{}}", Cell(figures[b].*row.field, row.spec), width);
    for (const auto& b : others) {
      const double a = figures[first].*row.field, o = figures[b].*row.field;
      fmt::print("{:>{}}", Cell(o != 0 ? a / o : NAN, "{:.2f}"), first.size() + b.size() + 4);
    }
    fmt::print("\n");
  }

  json out = {{"bandwidth_gb_s", bandwidth},
              {"bandwidth_1gib_gb_s", bandwidth_1gib},
              {"bandwidth_source", impl_ran ? "weights read before each impl decode step (median)"
                                            : "1 GiB buffer (best of 5)"},
              {"threads", threads},
              {"model", source.Describe()},
              {"statistic", "median"},
              {"reps", args.reps},
              {"weights_mb", weight_mb},
              {"decode_bytes_per_token_mb", decode_mb},
              {"decode_limit_tok_s", limit_tok_s},
              {"kv_cache_mb_per_position", bench::KvBytesPerPosition(config) / 1e6},
              {"load_1min_before", load_before},
              {"load_1min_after", load_after},
              {"cpu", CpuName()},
              {"kernel_path", impl::KernelPath()},
              {"impl", nullptr},
              {"ref", nullptr}};
  for (const auto& [name, f] : figures) out[name] = f.ToJson();

  fmt::print("\n");
  if (has_impl) {
    const bench::BackendFigures& f = figures["impl"];
    // The fractions were measured against a read of the float32 weights; a 16-bit impl reads
    // half those bytes a step, so its own limit is twice as fast (read time scales with bytes).
    const double own = ImplBytesPerWeight(dtypes) / 4.0;
    const double fraction = f.decode_fraction_ctx64 * own;
    out["impl_decode_fraction_of_limit"] = fraction;
    const double fraction_512 = f.decode_fraction_ctx512 * own;
    out["impl_decode_fraction_of_limit_ctx512"] = fraction_512;
    out["impl_decode_bytes_per_token_mb"] = decode_mb * own;
    // At 512 a step also reads its 512 cached positions: with those bytes in the limit (read at
    // the same rate), the share is of everything the step must read, not of the weights alone.
    const double cache_mb_512 = 512 * bench::KvBytesPerPosition(config) / 1e6;
    const double with_cache = fraction_512 * (1 + cache_mb_512 / (decode_mb * own));
    out["impl_decode_fraction_of_limit_ctx512_with_cache"] = with_cache;
    fmt::print(
        "impl decode @ ctx 64: {:.1f} tok/s = {:.0f}% of its bandwidth limit ({:.1f} tok/s: "
        "{:.1f} MB of {} weights a step) (median over steps of read time / step time); "
        "@ ctx 512: {:.0f}% ({:.0f}% counting the {:.1f} MB of KV cache the step reads too)\n",
        f.decode_tok_s_ctx64, 100 * fraction, limit_tok_s / own, decode_mb * own,
        own < 1 ? "16-bit" : "float32", 100 * fraction_512, 100 * with_cache, cache_mb_512);
    // Serving memory: the weights, the cache of the 513 positions decoded at, and the rest.
    const double kv_mb = 513 * bench::KvBytesPerPosition(config) / 1e6;
    const double budget = (weight_mb + kv_mb) * 1.10;
    const double used = f.peak_rss_mb - f.baseline_rss_mb;
    out["impl_memory_budget_mb"] = budget;
    fmt::print(
        "impl peak RSS {:.0f} MB - {:.0f} MB process before load = {:.0f} MB; weights {:.0f} "
        "+ KV cache at 513 positions {:.1f} = {:.0f} MB (+10%: {:.0f} MB)\n",
        f.peak_rss_mb, f.baseline_rss_mb, used, weight_mb, kv_mb, weight_mb + kv_mb, budget);
  } else {
    out["impl_decode_fraction_of_limit"] = nullptr;
  }
  for (const auto& [name, f] : figures) {
    if (!harness::BackendRegistry::Global().Info(name).gemms_in_blas) continue;
    for (const std::string& path : f.blas_libraries) {
      if (path.find("libblas.so") == std::string::npos && path.find("mkl") == std::string::npos) {
        continue;  // libopenblas.so.0 behind libblas.so.3, or liblapack: the BLAS is named below
      }
      fmt::print("{}'s BLAS (LibTorch's GEMMs): {}: {}\n", name, path, bench::BlasKind(path));
      if (bench::BlasKind(path).rfind("netlib", 0) == 0) {
        fmt::print(stderr,
                   "warning: {}'s GEMMs run on netlib's unoptimised reference BLAS; install "
                   "libopenblas0-pthread (ci/install-deps does) for an optimised libblas.so.3\n",
                   name);
      }
    }
  }
  for (const auto& b : others) {
    json ratios;
    for (const char* key : {"prefill_tok_s", "decode_tok_s_ctx64", "decode_tok_s_ctx512",
                            "batch_decode_tok_s_1", "batch_decode_tok_s_4", "batch_decode_tok_s_16",
                            "full_forward_s_128", "full_forward_s_512", "peak_rss_mb"}) {
      const json& a = out[first][key];
      const json& o = out[b][key];
      ratios[key] = (a.is_number() && o.is_number() && o.get<double>() != 0)
                        ? json(a.get<double>() / o.get<double>())
                        : json(nullptr);
    }
    out["ratios_over"][b] = ratios;
  }
  if (!others.empty()) out["ratios_of"] = first;
  if (has_impl && has_ref) {
    json ratios;
    for (const char* key : {"prefill_tok_s", "decode_tok_s_ctx64", "decode_tok_s_ctx512",
                            "batch_decode_tok_s_1", "batch_decode_tok_s_4", "batch_decode_tok_s_16",
                            "full_forward_s_128", "full_forward_s_512", "peak_rss_mb"}) {
      const json& a = out["impl"][key];
      const json& b = out["ref"][key];
      ratios[key] = (a.is_number() && b.is_number() && b.get<double>() != 0)
                        ? json(a.get<double>() / b.get<double>())
                        : json(nullptr);
    }
    out["ratios_impl_over_ref"] = ratios;
  }
  fmt::print("1-minute load average after: {:.2f}\n", load_after);
  if (!args.json_path.empty()) {
    std::ofstream file(args.json_path);
    KVDIFF_CHECK(file.good(), "--json: cannot write {}", args.json_path);
    file << out.dump(2) << '\n';
    KVDIFF_CHECK(file.good(), "--json: writing {} failed", args.json_path);
  }
}

void RunCurve(const BenchArgs& args, const harness::ModelSpec& source,
              const std::vector<std::string>& backends, int threads) {
  const format::LlamaConfig config = harness::ConfigFor(source);
  bench::CostCurve curve;
  double bandwidth = 0;
  double load = bench::LoadAverage1();
  if (args.replot) {
    curve = bench::ReadCostCsv(args.curve_path);
  } else {
    curve.contexts = bench::PowersOfTwo(args.curve_max);
    bench::BenchOptions options;
    options.threads = threads;
    options.reps = args.reps;
    options.max_seconds = args.max_seconds;
    options.progress = true;
    fmt::print("kvdiff bench --curve: {}, {} threads, contexts 1..{}, load {:.2f}\n",
               source.Describe(), threads, args.curve_max, load);
    for (const std::string& backend : backends) {
      fmt::print("measuring {} ...\n", backend);
      std::fflush(stdout);
      const json j = bench::RunInChild([&] {
        const bench::CostSeries s =
            bench::MeasureCostSeries(backend, source, options, curve.contexts);
        auto nums = [](const std::vector<double>& v) {
          json a = json::array();
          for (double x : v) a.push_back(std::isnan(x) ? json(nullptr) : json(x));
          return a;
        };
        return json{{"cached_ms", nums(s.cached_ms)},
                    {"uncached_ms", nums(s.uncached_ms)},
                    {"weights_read_ms", s.weights_read_ms}};
      });
      bench::CostSeries s;
      s.backend = backend;
      s.weights_read_ms = j.at("weights_read_ms").get<double>();
      for (const auto& v : j.at("cached_ms"))
        s.cached_ms.push_back(v.is_null() ? NAN : v.get<double>());
      for (const auto& v : j.at("uncached_ms"))
        s.uncached_ms.push_back(v.is_null() ? NAN : v.get<double>());
      curve.series.push_back(std::move(s));
    }
    load = std::max(load, bench::LoadAverage1());
    bench::WriteCostCsv(args.curve_path, curve);
    fmt::print("{:>8}", "context");
    for (const auto& s : curve.series) {
      fmt::print("{:>18}{:>18}", s.backend + " cached ms", s.backend + " uncached ms");
    }
    fmt::print("\n");
    for (size_t i = 0; i < curve.contexts.size(); ++i) {
      fmt::print("{:>8}", curve.contexts[i]);
      for (const auto& s : curve.series) {
        fmt::print("{:>18}{:>18}", Cell(s.cached_ms[i], "{:.2f}"),
                   Cell(s.uncached_ms[i], "{:.2f}"));
      }
      fmt::print("\n");
    }
    fmt::print("wrote {}\n", args.curve_path);
  }
  if (args.plot_path.empty()) return;
  bench::PlotNotes notes;
  notes.title = "One decode step: with a KV cache (cached) vs recomputing the history (uncached)";
  notes.lines.push_back(fmt::format(
      "{}: {} layers, hidden {}, {:.0f} MB float32 weights; {} threads on {} ({} cores)",
      source.Describe(), config.num_hidden_layers, config.hidden_size,
      bench::WeightBytes(config) / 1e6, threads, CpuName(), std::thread::hardware_concurrency()));
  if (!args.replot) {
    // The floor: the first series' own weight reads (the impl's when it ran), at its threads.
    notes.bandwidth_floor_ms = curve.series.front().weights_read_ms;
    bandwidth = bench::DecodeWeightBytes(config) / (notes.bandwidth_floor_ms * 1e-3) / 1e9;
    notes.lines.push_back(fmt::format(
        "each point: the median of {} runs; 1-minute load average up to {:.2f}; the green line: a "
        "plain streaming read ({:.1f} GB/s)",
        args.reps, load, bandwidth));
    for (const bench::CostSeries& s : curve.series) {
      for (size_t i = 0; i < curve.contexts.size(); ++i) {
        if (!std::isnan(s.uncached_ms[i])) continue;
        notes.lines.push_back(fmt::format(
            "{} uncached stops at context {}: one run took longer than --max-seconds {:g}",
            s.backend, curve.contexts[i - 1], args.max_seconds));
        break;
      }
    }
    std::string command = "regenerate: kvdiff bench";
    if (source.path) command += " --model " + source.path->string();
    if (!source.path) command += " --preset " + source.preset.value_or("");
    if (!source.path && source.seed != 1) command += fmt::format(" --seed {}", source.seed);
    command +=
        fmt::format(" --curve {} --plot {} --threads {}", args.curve_path, args.plot_path, threads);
    if (args.reps != 5) command += fmt::format(" --reps {}", args.reps);
    if (args.curve_max != 2048) command += fmt::format(" --curve-max {}", args.curve_max);
    if (args.max_seconds != 60) command += fmt::format(" --max-seconds {:g}", args.max_seconds);
    command += " --backends " + fmt::format("{}", fmt::join(backends, ","));
    notes.lines.push_back(command);
  } else {
    notes.lines.push_back(
        fmt::format("each point: a median of repeated runs, from {}", args.curve_path));
  }
  std::ofstream file(args.plot_path);
  KVDIFF_CHECK(file.good(), "--plot: cannot write {}", args.plot_path);
  file << bench::CostCurveSvg(curve, notes);
  KVDIFF_CHECK(file.good(), "--plot: writing {} failed", args.plot_path);
  fmt::print("wrote {}\n", args.plot_path);
}

}  // namespace

void AddBenchCommand(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<BenchArgs>();
  CLI::App* cmd = app.add_subcommand(
      "bench",
      "Measure the backends side by side on one model: prefill and decode throughput, batched "
      "decode of 1, 4 and 16 conversations in one call, uncached "
      "ForwardFull time, peak memory (each backend in its own child process), and the machine's "
      "memory read bandwidth. With --curve: the cost of one decode step against context length, "
      "cached vs uncached (CSV, and an SVG with --plot). Times are medians; nothing is asserted.");
  AddModelFlags(cmd,
                {ModelFlagRules::kModelOrPreset, "Model directory (config.json + safetensors)",
                 "A preset with random weights (default smollm2-135m)", "--seed", 1},
                args->model);
  cmd->add_option("--threads", args->threads, "Threads for every backend (default: every core)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option(
      "--backends", args->backends,
      "Comma-separated backends to measure (default: impl,ref when built with LibTorch)");
  cmd->add_option("--json", args->json_path, "Write the figures as JSON to this file");
  cmd->add_option("--reps", args->reps, "Timed repetitions per figure (the median is reported)")
      ->default_val(5)
      ->check(CLI::Range(1, 1000));
  cmd->add_option("--max-seconds", args->max_seconds,
                  "Stop repeating a figure once its runs have taken this long (after one run)")
      ->default_val(60)
      ->check(CLI::PositiveNumber);
  cmd->add_option("--curve", args->curve_path,
                  "Measure the decode cost curve (contexts 1, 2, 4, ... --curve-max) into this CSV "
                  "instead of the figures");
  cmd->add_option("--plot", args->plot_path,
                  "Draw the cost curve as SVG into this file (with --curve)");
  cmd->add_option("--curve-max", args->curve_max, "Largest context of the cost curve")
      ->default_val(2048)
      ->check(CLI::PositiveNumber);
  cmd->add_flag("--replot", args->replot,
                "Draw --plot from the existing --curve CSV without measuring anything");
  cmd->add_flag("--quick", args->quick,
                "One rep per figure, at most 5 s each, cost curve to context 256: a look in about "
                "a minute (medians of one run are noisy: not figures of record)");
  cmd->add_flag("--figures", args->figures_too,
                "With --curve: measure the figures first, then the curve, in one run");
  cmd->callback([args, &exit_code] {
    KVDIFF_CHECK(args->curve_path.empty() ? args->plot_path.empty() && !args->replot : true,
                 "--plot and --replot need --curve (the CSV to write or read)");
    harness::ModelSpec source = args->model.Spec();
    if (!source.path && !source.preset) {  // neither flag: the bench's default preset
      source.preset = bench::DefaultBenchModel().preset;
      source.seed = args->model.seed;
    }
    const int threads = args->threads > 0
                            ? args->threads
                            : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    std::string backends_text = args->backends;
    if (backends_text.empty()) {
      const auto available = harness::AvailableBackends();
      const bool has_ref = std::find(available.begin(), available.end(), "ref") != available.end();
      backends_text = has_ref ? "impl,ref" : "impl";
    }
    const std::vector<std::string> backends = ParseBackends(backends_text);
    (void)harness::ConfigFor(source);  // a bad --model or --preset fails here, before any child
    if (args->quick) {
      args->reps = 1;
      args->max_seconds = std::min(args->max_seconds, 5.0);
      args->curve_max = std::min<int64_t>(args->curve_max, 256);
    }
    KVDIFF_CHECK(!args->figures_too || !args->curve_path.empty(),
                 "--figures goes with --curve (figures alone are the default)");
    if (args->curve_path.empty() || args->figures_too) {
      RunFigures(*args, source, backends, threads);
    }
    if (!args->curve_path.empty()) {
      if (args->figures_too) fmt::print("\n");
      RunCurve(*args, source, backends, threads);
    }
    exit_code = 0;
  });
}

}  // namespace kvdiff::cli
