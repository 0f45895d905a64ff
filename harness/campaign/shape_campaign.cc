// `kvdiff check --shapes random`: every case on a model of its own
// (harness/campaign/shape_generator.h), with backends built for it. What it shares with the fixed
// campaign (one case run, the report) is harness/campaign/campaign_detail.h; what differs is here:
// the per-case model and backends, and a coverage whose contexts and boundaries are per case.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>

#include "format/error.h"
#include "harness/backend/registry.h"
#include "harness/campaign/campaign.h"
#include "harness/campaign/campaign_detail.h"
#include "harness/campaign/jobs.h"
#include "harness/campaign/shape_generator.h"

namespace kvdiff::harness {
namespace {

// A case and what the coverage needs to fold it: its scenario, shape, context and boundaries.
struct ShapeCase {
  CaseResult result;
  bool ran = false;  // false: a backend could not be built, nothing was run
  Scenario scenario;
  std::string shape;  // DescribeModel, the coverage's key
  int64_t context = 0;
  bool long_case = false;
  int64_t window = 0;  // the shape's sliding window (0: none)
  std::vector<Boundary> boundaries;
  std::string shift_limit;  // CampaignShiftLimit of this case's backends
};

}  // namespace

bool CampaignWindows(const std::vector<std::string>& backend_names) {
  return std::all_of(backend_names.begin(), backend_names.end(), [](const std::string& name) {
    return BackendRegistry::Global().Info(name).sliding_windows;
  });
}

namespace {

// Case k: its model, its backends (each of `names`, built by the registry), then the case as the
// fixed campaign runs one.
ShapeCase RunShapeCase(const std::vector<std::string>& names, const BackendOptions& backend_options,
                       const CampaignOptions& options, int64_t k,
                       campaign_detail::HungBackends& hung) {
  const ModelSpec model = ShapeModel(options.seed, k, options.shape_tier, CampaignWindows(names));
  const format::LlamaConfig& config = *model.config;
  ShapeCase out;
  out.shape = DescribeModel(config);
  out.window = config.sliding_window;
  out.context = CampaignMaxLength(config, options.generation.max_length);
  out.long_case = IsLongCase(options.seed, k, options.generation.long_fraction, out.context);
  out.result.index = k;
  out.result.shape = ShapeParams(config);
  const auto weights = LoadModelFor(model);
  std::vector<std::unique_ptr<Backend>> owned;
  std::vector<const Backend*> backends;
  GenerationOptions generation = options.generation;
  // The case as its file says how to get it again.
  auto new_case = [&] {
    Scenario sc = campaign_detail::NewCase(config, model, names, options, generation, k);
    sc.description =
        fmt::format("kvdiff check {} --seed {}: case {}{}",
                    options.shape_tier == ShapeTier::kLong ? "--long" : "--shapes random",
                    options.seed, k, out.long_case ? " (long)" : "");
    return sc;
  };
  for (const std::string& name : names) {
    std::string refused;
    if (const auto hang = hung.FirstOf({name})) {
      refused = hang->Refusal();
    } else {
      try {
        owned.push_back(BackendRegistry::Global().Make(name, weights, backend_options));
        backends.push_back(owned.back().get());
      } catch (const std::exception& e) {
        refused = fmt::format("backend {} could not be built for this shape: {}", name, e.what());
        if (dynamic_cast<const EngineHungError*>(&e) != nullptr) hung.Add(name, k);
      }
    }
    if (!refused.empty()) {
      // An engine that refuses this shape (or hung): the case fails saying so, and its file (the
      // steps it would have run) reproduces the refusal with `kvdiff run`.
      generation.boundaries = CampaignBoundaries({}, out.context);
      out.scenario = new_case();
      out.result.passed = false;
      out.result.steps = static_cast<int64_t>(out.scenario.steps.size());
      out.result.failure = refused;
      out.result.scenario_file = campaign_detail::WriteFailingCase(options, k, out.scenario);
      return out;
    }
  }
  generation.max_length = out.context =
      CampaignMaxLength(config, options.generation.max_length, backends);
  out.long_case = IsLongCase(options.seed, k, options.generation.long_fraction, out.context);
  generation.boundaries = out.boundaries = CampaignBoundaries(backends, out.context);
  generation.max_sessions = CampaignMaxSessions(backends);
  generation.max_call_tokens = CampaignMaxCallTokens(backends);
  generation.shifts = CampaignShifts(backends);
  out.shift_limit = CampaignShiftLimit(backends, generation.shift_percent);
  out.scenario = new_case();
  const std::string shape = std::move(out.result.shape);
  out.result = campaign_detail::RunCase(out.scenario, backends, options, k, false, {}, &hung);
  out.result.shape = shape;
  out.ran = true;
  return out;
}

// The coverage of cases with contexts of their own: the boundaries of every case (a size is one
// boundary, declared by whoever declared it in any case) and the largest context.
Coverage FoldCoverage(const std::vector<ShapeCase>& cases) {
  std::map<int64_t, std::string> by_size;
  int64_t context = 0;
  for (const ShapeCase& c : cases) {
    if (!c.ran) continue;
    context = std::max(context, c.context);
    for (const Boundary& b : c.boundaries) {
      std::string& who = by_size[b.size];
      if (who.empty()) who = b.declared_by;
    }
  }
  std::vector<Boundary> boundaries;
  for (const auto& [size, who] : by_size) boundaries.push_back({size, who});
  Coverage coverage = NewCoverage(boundaries, context);
  for (const ShapeCase& c : cases) {
    if (c.ran) coverage.Add(c.scenario, c.shape, c.long_case, c.context, c.window);
    if (c.ran && coverage.shift_limit.empty()) coverage.shift_limit = c.shift_limit;
  }
  return coverage;
}

}  // namespace

CampaignReport RunRandomShapeCampaign(const std::vector<std::string>& backend_names,
                                      const BackendOptions& backend_options, int jobs,
                                      const CampaignOptions& options) {
  KVDIFF_CHECK(!backend_names.empty(), "check: no backend to run");
  KVDIFF_CHECK(jobs >= 1, "check: expected at least one job, got {}", jobs);
  campaign_detail::CheckOptions(options);
  // Resolved here, once: a plugin family resolves a name on first use, not from several threads.
  for (const std::string& name : backend_names) (void)BackendRegistry::Global().Info(name);
  const auto start = std::chrono::steady_clock::now();
  CampaignReport report = campaign_detail::NewReport(backend_names, options);
  // The demanding part scales a preset's weights; here every case draws a model of its own.
  report.demanding.skipped = fmt::format(
      "{} (the demanding part runs on a preset's demanding variant: use --shapes fixed)",
      options.shape_tier == ShapeTier::kLong ? "--long" : "--shapes random");
  report.random_shapes = true;
  report.long_shapes = options.shape_tier == ShapeTier::kLong;
  report.model_description = report.long_shapes ? fmt::format(
                                                      "a random long-context shape per case ({}-{} "
                                                      "positions; see coverage)",
                                                      kLongTierMinContext, kLongTierMaxContext)
                                                : "a random shape per case (see coverage)";
  const std::vector<int64_t> indices = ShardCases(options.cases, options.shard);
  // As in the fixed campaign: results land in case order, the report is folded from them after.
  std::vector<ShapeCase> cases(indices.size());
  campaign_detail::HungBackends hung;
  int64_t done = 0, failures = 0;
  RunJobs(
      static_cast<int64_t>(indices.size()), jobs,
      [&](int /*job*/, int64_t i) {
        cases[i] = RunShapeCase(backend_names, backend_options, options, indices[i], hung);
      },
      [&](int64_t i) {
        ++done;
        failures += cases[i].result.passed ? 0 : 1;
        if (options.progress) {
          options.progress(done, static_cast<int64_t>(indices.size()), failures);
        }
      });
  report.coverage = FoldCoverage(cases);
  for (ShapeCase& c : cases) campaign_detail::AddResult(report, std::move(c.result));
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

}  // namespace kvdiff::harness
