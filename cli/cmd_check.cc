// kvdiff check: a seeded, shardable campaign of random scenarios on the checked API.
#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/engine_guard.h"
#include "format/error.h"
#include "harness/backend/backend.h"
#include "harness/backend/registry.h"
#include "harness/campaign/campaign.h"
#include "harness/campaign/demanding_part.h"
#include "harness/campaign/jobs.h"
#include "harness/campaign/shape_generator.h"
#include "harness/campaign/shards.h"
#include "harness/compare/gate.h"
#include "harness/report/html_check_report.h"
#include "harness/report/run_report.h"
#include "harness/run/differential_run.h"

namespace kvdiff::cli {
namespace {

// The long tier's generation (check --long), where its flags are not given: every case long,
// histories up to the whole context, no batch steps (a padded batch at these lengths is what the
// serving campaigns test, and it would hold [items, s, P+s] masks), and decode steps of at most
// kLongTierMaxDecode tokens (a long case reaches its target with a prompt, then decodes).
constexpr int64_t kLongTierMaxDecode = 64;
constexpr double kLongTierLongFraction = 1.0;
constexpr int64_t kLongTierMaxLength = 0;
constexpr int64_t kLongTierBatchPercent = 0;

struct CheckArgs {
  ModelFlags model;  // --model, --preset, --model-seed
  int64_t cases = 0;
  uint64_t seed = 0;
  std::optional<std::string> shard;
  std::optional<int64_t> shard_count;
  int jobs = 0;
  std::string backends;
  std::string json;
  std::string junit;
  std::string html;
  std::string out_dir = "kvdiff-failures";
  int64_t shrink = 3;          // --shrink: failing cases shrunk
  double shrink_seconds = 60;  // --shrink-seconds: each one's budget
  std::optional<double> tolerance;
  int64_t max_length = harness::kDefaultMaxLength;
  double long_fraction = harness::kDefaultLongFraction;
  double deep_fraction = harness::kDefaultDeepFraction;
  int64_t batch_percent = harness::kDefaultBatchPercent;
  int64_t shift_percent = harness::kDefaultShiftPercent;
  int threads = 1;
  harness::BackendOptions isolation;    // --isolate, --isolate-timeout
  std::string shapes = "fixed";         // --shapes: fixed (one model) or random (one per case)
  bool long_tier = false;               // --long: the long tier's shapes and generation
  harness::DemandingOptions demanding;  // --demanding-fraction, --demanding-rtol
};

// The progress line. On a terminal: one line redrawn, at most ten updates a second (a tiny case
// takes well under a millisecond). Elsewhere (a CI log, a redirected run): a line a minute, with
// the time spent and an estimate of what is left, so that an hours-long campaign shows it is alive.
std::function<void(int64_t, int64_t, int64_t)> ProgressLine() {
  using Clock = std::chrono::steady_clock;
  if (isatty(fileno(stderr)) == 0) {
    return [start = Clock::now(), last = Clock::now()](int64_t done, int64_t total,
                                                       int64_t failures) mutable {
      const auto now = Clock::now();
      if (done == total || now - last < std::chrono::minutes(1)) return;
      last = now;
      const double spent = std::chrono::duration<double>(now - start).count();
      const double left = done > 0 ? spent / static_cast<double>(done) * (total - done) : 0;
      fmt::print(
          stderr,
          "kvdiff check: {} of {} cases, {} failed; {:.0f} min spent, about {:.0f} min left\n",
          done, total, failures, spent / 60, left / 60);
      std::fflush(stderr);
    };
  }
  return [last = Clock::time_point{}](int64_t done, int64_t total, int64_t failures) mutable {
    const auto now = Clock::now();
    if (done < total && now - last < std::chrono::milliseconds(100)) return;
    last = now;
    fmt::print(stderr, "\r[{}/{}] {} failed", done, total, failures);
    if (done == total) fmt::print(stderr, "\r\033[K");
    std::fflush(stderr);
  };
}

// The campaign options every kind of check shares (all but the tolerance).
harness::CampaignOptions BaseOptions(const CheckArgs& args, harness::ShardSelection& shard) {
  harness::CampaignOptions options;
  options.seed = args.seed;
  options.cases = args.cases;
  shard = harness::SelectShard(args.shard, args.shard_count, harness::ProcessEnvironment());
  options.shard = shard.shard;
  if (!shard.status_file.empty()) harness::TouchShardStatusFile(shard.status_file);
  options.out_dir = args.out_dir;
  options.shrink_cases = args.shrink;
  options.shrink_budget.max_seconds = args.shrink_seconds;
  options.generation.max_length = args.max_length;
  options.generation.long_fraction = args.long_fraction;
  options.generation.batch_percent = args.batch_percent;
  options.generation.shift_percent = args.shift_percent;
  options.generation.deep_fraction = args.deep_fraction;
  options.progress = ProgressLine();
  return options;
}

// The campaign's gates, resolved once over one set of its backends: --tolerance, else the default
// raised to the loosest tolerance profile, and the rope-f32 allowance. Returns the profiles'
// notes, which the report prints.
std::vector<std::string> ResolveGates(const CheckArgs& args,
                                      const std::vector<const harness::Backend*>& backends,
                                      harness::CampaignOptions& options) {
  std::vector<std::string> notes;
  options.gate = harness::ResolveGate(args.tolerance, {}, backends, &notes);
  return notes;
}

void PrintGates(const std::vector<std::string>& notes) {
  for (const std::string& note : notes) fmt::print(Report(), "{}\n", note);
}

void PrintShardSource(const harness::ShardSelection& shard,
                      const harness::CampaignOptions& options) {
  if (!shard.source.empty() && shard.source != "--shard") {
    fmt::print(Report(), "shard {}/{} from {}\n", options.shard.index, options.shard.count,
               shard.source);
  }
}

void WriteReports(const CheckArgs& args, const harness::CampaignReport& report) {
  fmt::print(Report(), "{}", report.Summary());
  if (!args.json.empty()) harness::WriteTextFile(args.json, report.ToJson().dump(2) + "\n");
  if (!args.junit.empty()) harness::WriteTextFile(args.junit, report.ToJUnit());
  if (!args.html.empty()) harness::WriteTextFile(args.html, harness::CampaignReportToHtml(report));
}

// The tolerance profile follows what the backends attend in (BackendInfo::cache_dtype), which no
// shape changes; it is asked of one set of the backends built on the shape of the campaign's
// first case they all accept (an engine may refuse some shapes: those cases fail, saying so).
// When they refuse the first kProbeShapes, the last refusal is the error.
BackendSet ProbeBackends(const std::vector<std::string>& names,
                         const harness::BackendOptions& backend_options,
                         const harness::CampaignOptions& options) {
  constexpr size_t kProbeShapes = 20;
  const std::vector<int64_t> cases = harness::ShardCases(options.cases, options.shard);
  for (size_t i = 0;; ++i) {
    const int64_t k = i < cases.size() ? cases[i] : static_cast<int64_t>(i);
    try {
      return MakeBackends(
          names,
          harness::LoadModelFor(harness::ShapeModel(options.seed, k, options.shape_tier,
                                                    harness::CampaignWindows(names))),
          backend_options);
    } catch (const InputError&) {
      if (i + 1 >= kProbeShapes) throw;
    }
  }
}

// The long tier's backends when --backends is not given: impl against ref64, the arbiter whose
// RoPE angles do not drift with the position (ref's float32 angles are held to an allowance of
// 2e-6 per position, 0.07 at 32768: too loose to see a port's error there).
std::vector<std::string> LongTierBackends() {
  if (harness::BackendRegistry::Global().HasArbiter()) return {"impl", "ref64"};
  return {"impl"};
}

// --shapes random or --long: a model per case, drawn from (--seed, k); backends built per case.
int CheckRandomShapes(const CheckArgs& args) {
  const char* what = args.long_tier ? "--long" : "--shapes random";
  KVDIFF_CHECK(args.model.model.empty(),
               "{} cannot be combined with --model: each case draws its own model shape from "
               "(--seed, case), and a model directory has one fixed shape (use --shapes fixed, "
               "the default, with --max-length 0 --long-fraction 1 to run long cases on it)",
               what);
  KVDIFF_CHECK(args.model.preset.empty() && !args.model.SeedGiven(),
               "{} cannot be combined with --preset/--model-seed: each case draws its own shape "
               "and weight seed from (--seed, case)",
               what);
  KVDIFF_CHECK(!args.long_tier || args.shapes == "fixed",
               "--long cannot be combined with --shapes {}: the long tier draws shapes of its own",
               args.shapes);
  harness::ShardSelection shard;
  harness::CampaignOptions options = BaseOptions(args, shard);
  if (args.long_tier) {
    options.shape_tier = harness::ShapeTier::kLong;
    options.generation.max_decode = kLongTierMaxDecode;
    options.generation.min_long_target = harness::kLongTierMinContext / 2;
  }
  const std::vector<std::string> names = !args.backends.empty()
                                             ? harness::ParseBackendList(args.backends)
                                         : args.long_tier ? LongTierBackends()
                                                          : harness::DefaultBackends();
  const harness::BackendOptions backend_options = WithThreads(args.isolation, args.threads);
  const BackendSet probe = ProbeBackends(names, backend_options, options);
  const std::vector<std::string> gate_notes = ResolveGates(args, probe.all, options);
  const int jobs = harness::ResolveJobs(
      args.jobs, static_cast<int64_t>(harness::ShardCases(args.cases, options.shard).size()));
  if (args.long_tier) {
    fmt::print(Report(),
               "kvdiff check: long tier: random long-context shapes ({}-{} positions, a model per "
               "case, from --seed {}), backends {}\n",
               harness::kLongTierMinContext, harness::kLongTierMaxContext, args.seed,
               fmt::join(names, ","));
  } else {
    fmt::print(Report(),
               "kvdiff check: random shapes (a model per case, from --seed {}), backends {}\n",
               args.seed, fmt::join(names, ","));
  }
  PrintGates(gate_notes);
  PrintShardSource(shard, options);
  std::fflush(Report());
  const harness::CampaignReport report =
      harness::RunRandomShapeCampaign(names, backend_options, jobs, options);
  WriteReports(args, report);
  return report.ExitCode();
}

// One set of backends per job over `weights`: a backend instance is used by one thread only.
harness::PartBackends MakeJobBackends(const std::vector<std::string>& names,
                                      const std::shared_ptr<const format::ModelWeights>& weights,
                                      const harness::BackendOptions& options, int jobs) {
  harness::PartBackends part;
  for (int j = 0; j < jobs; ++j) {
    BackendSet set = MakeBackends(names, weights, options);
    part.jobs.push_back(set.all);
    for (auto& backend : set.owned) part.owned.push_back(std::move(backend));
  }
  return part;
}

// The demanding part of the campaign: its model and backends (built by the campaign once its
// ordinary cases are done and their backends freed), or why it is skipped.
harness::DemandingPart PlanDemandingPart(const CheckArgs& args, const harness::ModelSpec& model,
                                         const std::vector<const harness::Backend*>& backends,
                                         int jobs) {
  harness::DemandingPart part;
  part.options = args.demanding;
  harness::ValidateDemandingOptions(part.options);
  const std::optional<harness::ModelSpec> variant = harness::DemandingVariant(model);
  if (part.options.fraction == 0) {
    part.skipped = "--demanding-fraction 0";
  } else if (!variant) {
    part.skipped = model.preset ? "the campaign's model is already scaled (every case is as "
                                  "demanding as its scale)"
                                : "a model directory or checkpoint is taken as it is (kvdiff "
                                  "cannot rescale its weights; use a preset)";
  } else if (!harness::BackendRegistry::Global().HasArbiter()) {
    part.skipped = "this build has no float64 backend to compare with (ref64 needs LibTorch)";
  }
  if (!part.skipped.empty()) return part;
  part.model = *variant;
  part.backends = harness::DemandingBackends(backends, &part.notes);
  part.build = [model = part.model, names = part.backends,
                options = WithThreads(args.isolation, args.threads), jobs] {
    return MakeJobBackends(names, harness::LoadModelFor(model), options, jobs);
  };
  return part;
}

int Check(const CheckArgs& args) {
  SeparateReportFromEngines();  // what an engine prints is not the report
  if (args.shapes == "random" || args.long_tier) return CheckRandomShapes(args);
  const harness::ModelSpec model = args.model.Spec();
  harness::ShardSelection shard;
  harness::CampaignOptions options = BaseOptions(args, shard);
  const std::vector<std::string> names =
      args.backends.empty() ? harness::DefaultBackends() : harness::ParseBackendList(args.backends);
  const int jobs = harness::ResolveJobs(
      args.jobs, static_cast<int64_t>(harness::ShardCases(args.cases, options.shard).size()));
  // Only the backends hold the weights, so that the campaign frees them after the ordinary cases.
  harness::PartBackends ordinary = MakeJobBackends(names, harness::LoadModelFor(model),
                                                   WithThreads(args.isolation, args.threads), jobs);
  const std::vector<const harness::Backend*>& backends = ordinary.jobs[0];
  options.demanding = PlanDemandingPart(args, model, backends, jobs);
  const std::vector<std::string> gate_notes = ResolveGates(args, backends, options);
  fmt::print(Report(), "kvdiff check: model {} ({}), backends {}\n", model.Describe(),
             harness::DescribeModel(backends[0]->config()), fmt::join(names, ","));
  PrintGates(gate_notes);
  PrintShardSource(shard, options);
  std::fflush(Report());
  const harness::CampaignReport report =
      harness::RunCampaignOnJobs(model, std::move(ordinary), options);
  WriteReports(args, report);
  return report.ExitCode();
}

}  // namespace

void AddCheckCommand(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<CheckArgs>();
  CLI::App* cmd = app.add_subcommand(
      "check",
      "Run a seeded campaign of random scenarios (prompts, chunk splits, decodes, truncations, "
      "forks, resets) on the checked API; failing cases are written as scenario files");
  AddModelFlags(cmd, PresetUnlessModelSpelling(), args->model);
  // At least one (a campaign of none proves nothing), at most kMaxCases (docs/bad-input.md).
  cmd->add_option("--cases", args->cases,
                  fmt::format("Number of random scenarios (1 to {})", harness::kMaxCases))
      ->required()
      ->check(CLI::Range(int64_t{1}, harness::kMaxCases));
  cmd->add_option("--seed", args->seed, "Campaign seed: case k is generated from (seed, k)")
      ->default_val(0);
  cmd->add_option("--shard", args->shard,
                  "i/n: run only the cases k with k % n == i-1 (n machines together run all); "
                  "default: from TEST_SHARD_INDEX/TEST_TOTAL_SHARDS (Bazel), "
                  "GTEST_SHARD_INDEX/GTEST_TOTAL_SHARDS or JOB_COMPLETION_INDEX (Kubernetes), "
                  "else 1/1");
  cmd->add_option("--shard-count", args->shard_count,
                  "The number of shards when JOB_COMPLETION_INDEX selects one (else "
                  "KVDIFF_SHARD_COUNT)");
  cmd->add_option("--jobs", args->jobs,
                  "Cases run at once, each job on its own backends (0: every core; at most "
                  "256); the report is the same for any count")
      ->default_val(0)
      ->check(CLI::NonNegativeNumber);
  cmd->add_option(
      "--backends", args->backends,
      BackendsHelp("default: " + fmt::format("{}", fmt::join(harness::DefaultBackends(), ","))));
  CLI::Option* max_length =
      cmd->add_option("--max-length", args->max_length,
                      fmt::format("Longest history a long case may reach, capped by the model's "
                                  "context (0: the full context; default {})",
                                  harness::kDefaultMaxLength))
          ->check(CLI::NonNegativeNumber);
  CLI::Option* long_fraction =
      cmd->add_option("--long-fraction", args->long_fraction,
                      fmt::format("Share of cases that go long, around boundaries and up to "
                                  "--max-length (default {})",
                                  harness::kDefaultLongFraction))
          ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--deep-fraction", args->deep_fraction,
                  fmt::format("Share of the other cases that start with a prompt past position "
                              "{}, so that their forks, truncations and batches act on long "
                              "conversations (default {})",
                              harness::kDeepPosition, harness::kDefaultDeepFraction))
      ->check(CLI::Range(0.0, 1.0));
  CLI::Option* batch_percent =
      cmd->add_option(
             "--batch-percent", args->batch_percent,
             fmt::format("Chance, in percent, that a step is a batch: several conversations "
                         "in one engine call, as a serving engine runs them (0: none; "
                         "default {})",
                         harness::kDefaultBatchPercent))
          ->check(CLI::Range(0, 100));
  cmd->add_option("--shift-percent", args->shift_percent,
                  fmt::format("Chance, in percent, that a step is followed by a context shift "
                              "episode, when every backend shifts (0: none; default {})",
                              harness::kDefaultShiftPercent))
      ->check(CLI::Range(0, 100));
  cmd->add_option("--json", args->json, "Write the campaign report as JSON to this file");
  cmd->add_option("--junit", args->junit, "Write a JUnit XML report (one testcase per case)");
  cmd->add_option("--html", args->html,
                  "Write a self-contained HTML page (verdict, failing cases, worst difference, "
                  "coverage charts) to this file");
  cmd->add_option("--out-dir", args->out_dir, "Where failing cases are written")
      ->default_val("kvdiff-failures");
  cmd->add_option("--shrink", args->shrink,
                  "Failing cases to shrink, the first ones: steps, batch items and tokens are "
                  "removed while the case still fails the same way, and the smallest is written "
                  "beside the case as check-seedS-caseK-shrunk.json (0: none)")
      ->default_val(3)
      ->check(CLI::Range(int64_t{0}, int64_t{10000000}));
  cmd->add_option("--shrink-seconds", args->shrink_seconds,
                  "Wall-time budget of each shrink (it also stops after 400 replays)")
      ->default_val(60)
      ->check(CLI::Range(0.0, 86400.0));
  cmd->add_option(
      "--tolerance", args->tolerance,
      fmt::format("Gate on max |a-b| of logits (default {})", harness::kDefaultTolerance));
  // One thread by default: a case's tensors are tiny, and threads cost more than they give there
  // (spread a campaign over machines or processes with --shard instead).
  cmd->add_option("--threads", args->threads, "Threads per backend (0: every core)")
      ->default_val(1)
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--shapes", args->shapes,
                  "fixed: every case on the one model (--model, or --preset and --model-seed); "
                  "random: case k on a small random Llama shape of its own, drawn from (--seed, k) "
                  "(GQA ratios, head sizes, tied heads, rope scaling, contexts, vocabularies)")
      ->default_val("fixed")
      ->check(CLI::IsMember({"fixed", "random"}));
  cmd->add_option("--demanding-fraction", args->demanding.fraction,
                  fmt::format("Share of cases run on the demanding variant of the preset "
                              "(make-model --scale demanding) against ref64, with a gate relative "
                              "to the logits' scale (default {}; 0: none)",
                              harness::kDefaultDemandingFraction))
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--demanding-rtol", args->demanding.rtol,
                  fmt::format("The demanding cases' gate: max |a-b| <= RTOL x max |logit| of the "
                              "row (default {})",
                              harness::kDefaultDemandingRtol))
      ->check(CLI::Range(0.0, 0.999999));
  cmd->add_flag("--long", args->long_tier,
                fmt::format("The long tier: case k on a small random shape with a context of {} "
                            "to {} positions (llama3 rope scaling half the time), every case long "
                            "with a target of {} positions or more up to the whole context, "
                            "decodes of at most {} tokens, no batch steps; default backends "
                            "impl,ref64",
                            harness::kLongTierMinContext, harness::kLongTierMaxContext,
                            harness::kLongTierMinContext / 2, kLongTierMaxDecode));
  AddIsolateFlag(cmd, args->isolation);
  cmd->callback([args, &exit_code, max_length, long_fraction, batch_percent] {
    if (args->long_tier) {  // the tier's own defaults, where the flag is not given
      if (max_length->count() == 0) args->max_length = kLongTierMaxLength;
      if (long_fraction->count() == 0) args->long_fraction = kLongTierLongFraction;
      if (batch_percent->count() == 0) args->batch_percent = kLongTierBatchPercent;
    }
    exit_code = Check(*args);
  });
}

}  // namespace kvdiff::cli
