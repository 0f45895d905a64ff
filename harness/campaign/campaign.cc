#include "harness/campaign/campaign.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <mutex>

#include "format/error.h"
#include "harness/campaign/campaign_detail.h"
#include "harness/campaign/case_order.h"
#include "harness/campaign/jobs.h"
#include "harness/report/junit.h"
#include "harness/report/run_report.h"

namespace kvdiff::harness {

Shard ParseShard(const std::string& text) {
  const auto slash = text.find('/');
  Shard s;
  try {
    KVDIFF_CHECK(slash != std::string::npos, "");
    size_t used = 0;
    s.index = std::stoll(text.substr(0, slash), &used);
    KVDIFF_CHECK(used == slash, "");
    s.count = std::stoll(text.substr(slash + 1), &used);
    KVDIFF_CHECK(used == text.size() - slash - 1, "");
  } catch (const std::exception&) {
    throw InputError(fmt::format("--shard: expected i/n like 1/4, got \"{}\"", text));
  }
  KVDIFF_CHECK(s.count >= 1 && s.index >= 1 && s.index <= s.count,
               "--shard: expected 1 <= i <= n in i/n, got {}/{}", s.index, s.count);
  return s;
}

std::vector<int64_t> ShardCases(int64_t cases, const Shard& shard) {
  std::vector<int64_t> out;
  for (int64_t k = shard.index - 1; k < cases; k += shard.count) out.push_back(k);
  return out;
}

int64_t ShardCaseCount(int64_t cases, const Shard& shard) {
  const int64_t first = shard.index - 1;
  return first < cases ? (cases - 1 - first) / shard.count + 1 : 0;
}

int64_t CampaignReport::Failures() const {
  int64_t n = 0;
  for (const auto& r : results) n += r.passed ? 0 : 1;
  return n;
}

std::string CampaignReport::Summary() const {
  std::string out;
  // The first few failures in full; all of them are in --json and in the out-dir.
  constexpr int64_t kListed = 10;
  int64_t listed = 0;
  for (const auto& r : results) {
    if (r.passed || listed++ >= kListed) continue;
    out += fmt::format("FAIL case {}{}: {}\n", r.index, r.shape.empty() ? "" : " (" + r.shape + ")",
                       r.failure);
    if (r.shrunk) {
      out += fmt::format("  shrunk to {} of {} steps ({} replays{}): {}\n", r.shrunk->steps,
                         r.steps, r.shrunk->runs,
                         r.shrunk->exhausted ? ", budget spent: maybe not the smallest" : "",
                         r.shrunk->failure);
      out += fmt::format("  replay: kvdiff run {}\n  the whole case: {}\n", r.shrunk->file,
                         r.scenario_file);
    } else {
      if (!r.not_shrunk.empty()) out += "  " + r.not_shrunk + "\n";
      out += fmt::format("  replay: kvdiff run {}\n", r.scenario_file);
    }
  }
  if (listed > kListed) {
    out += fmt::format("... and {} more failing cases (all listed in --json)\n", listed - kListed);
  }
  out += coverage.Text();
  out += DistributionLines(distributions);
  out += demanding.Text();
  out += WorstLine();
  int64_t not_run = 0;
  for (const auto& r : results) not_run += r.not_run ? 1 : 0;
  out += fmt::format(
      "{}: {} of {} cases run (shard {}/{}, seed {}), {} failed{}; {} rows compared; "
      "{:.2f} s\n",
      Passed() ? "PASS" : "FAIL", results.size(), cases, shard.index, shard.count, seed, Failures(),
      not_run == 0 ? "" : fmt::format(" ({} not run: a backend hung before them)", not_run),
      rows_compared, seconds);
  return out;
}

std::string CampaignReport::WorstLine() const {
  if (worst_case < 0) return "";
  return fmt::format("worst difference: {} in case {}\n", WorstRowText(worst), worst_case);
}

nlohmann::json CampaignReport::ToJson() const {
  nlohmann::json cases_json = nlohmann::json::array();
  std::vector<int64_t> indices;
  for (const auto& r : results) {
    indices.push_back(r.index);
    nlohmann::json j = {{"case", r.index},
                        {"passed", r.passed},
                        {"steps", r.steps},
                        {"rows_compared", r.rows_compared},
                        {"worst_diff", Number(r.worst_diff)},
                        {"worst", WorstRowToJson(r.worst)}};
    if (!r.shape.empty()) j["shape"] = r.shape;
    if (r.demanding) {
      j["demanding"] = true;
      j["worst_relative_diff"] = Number(r.worst_relative_diff);
    }
    if (!r.passed) {
      j["failure"] = r.failure;
      j["scenario_file"] = r.scenario_file;
      if (r.shrunk) {
        j["shrunk"] = {{"scenario_file", r.shrunk->file},
                       {"failure", r.shrunk->failure},
                       {"steps", r.shrunk->steps},
                       {"replays", r.shrunk->runs},
                       {"budget_spent", r.shrunk->exhausted}};
      }
      if (!r.not_shrunk.empty()) j["not_shrunk"] = r.not_shrunk;
      if (r.not_run) j["not_run"] = true;
    }
    cases_json.push_back(j);
  }
  nlohmann::json distributions_json = nlohmann::json::object();
  for (const auto& [path, stats] : distributions) {
    distributions_json[path] = DistributionToJson(stats);
  }
  nlohmann::json out = {{"kvdiff_version", KVDIFF_VERSION},
                        {"command", "check"},
                        {"model",
                         {{"source", long_shapes     ? std::string("long-context random shapes")
                                     : random_shapes ? std::string("random shapes")
                                                     : model.Describe()},
                          {"description", model_description}}},
                        {"backends", backends},
                        {"tolerance", {{"abs", tolerance}}},
                        {"seed", seed},
                        {"cases", cases},
                        {"shard", {{"index", shard.index}, {"count", shard.count}}},
                        {"case_indices", indices},
                        {"passed", Passed()},
                        {"failures", Failures()},
                        {"rows_compared", rows_compared},
                        {"worst_diff", Number(worst_diff)},
                        {"worst", WorstRowToJson(worst)},
                        {"worst_case", worst_case},
                        {"seconds", seconds},
                        {"coverage", coverage.ToJson()},
                        {"distributions", distributions_json},
                        {"demanding", demanding.ToJson()},
                        {"results", cases_json}};
  // Absent: fixed (reports of before --shapes).
  if (random_shapes) out["shapes"] = long_shapes ? "long" : "random";
  // What the cases were drawn with: shards drawn otherwise are another campaign (merge refuses).
  out["generation"] = {
      {"max_length", generation.max_length},       {"long_fraction", generation.long_fraction},
      {"deep_fraction", generation.deep_fraction}, {"batch_percent", generation.batch_percent},
      {"shift_percent", generation.shift_percent}, {"follow_ups", generation.follow_ups}};
  return out;
}

std::string CampaignReport::Demanding::Text() const {
  std::string out;
  for (const std::string& note : notes) out += note + "\n";
  if (!skipped.empty()) return out + "demanding part skipped: " + skipped + "\n";
  return out + fmt::format(
                   "demanding part: {} cases on {} ({}), gate max |a-b| <= {} x max |logit| of "
                   "the row; {} failed, worst {} of max |logit|\n",
                   cases, model, fmt::join(backends, ","), FormatDiff(rtol), failures,
                   FormatDiff(worst_relative_diff));
}

nlohmann::json CampaignReport::Demanding::ToJson() const {
  if (!skipped.empty()) return {{"skipped", skipped}, {"notes", notes}};
  return {{"model", model},
          {"backends", backends},
          {"fraction", fraction},
          {"rtol", rtol},
          {"cases", cases},
          {"failures", failures},
          {"worst_relative_diff", Number(worst_relative_diff)},
          {"notes", notes}};
}

std::string CampaignReport::ToJUnit() const {
  return ToJUnitXml("kvdiff", seconds, {ToJUnitSuite()});
}

JUnitSuite CampaignReport::ToJUnitSuite() const {
  JUnitSuite suite;
  suite.name = suite.classname =
      fmt::format("kvdiff.check.seed{}.shard{}of{}", seed, shard.index, shard.count);
  suite.seconds = seconds;
  if (worst_case >= 0) {
    suite.properties.emplace_back("worst_difference",
                                  fmt::format("{} in case {}", WorstRowText(worst), worst_case));
  }
  for (const auto& r : results) {
    JUnitCase c;
    c.name = fmt::format("case {}", r.index);
    if (!r.passed) {
      c.outcome = JUnitOutcome::kFailure;
      c.type = "divergence";
      c.message = r.failure;
      c.text = (r.shape.empty() ? "" : "shape: " + r.shape + "\n") + "replay: kvdiff run " +
               (r.shrunk ? r.shrunk->file + "\nthe whole case: " : std::string()) + r.scenario_file;
    }
    suite.cases.push_back(std::move(c));
  }
  return suite;
}

CampaignReport RunCampaign(const ModelSpec& model, const std::vector<const Backend*>& backends,
                           const CampaignOptions& options) {
  return RunCampaignOnJobs(model, {backends}, options);
}

namespace campaign_detail {

void CheckOptions(const CampaignOptions& options) {
  KVDIFF_CHECK(options.cases >= 0, "--cases: expected a count >= 0, got {}", options.cases);
  KVDIFF_CHECK(options.gate.abs >= 0 && std::isfinite(options.gate.abs),
               "--tolerance: expected a finite number >= 0, got {}", options.gate.abs);
}

CampaignReport NewReport(const std::vector<std::string>& backend_names,
                         const CampaignOptions& options) {
  CampaignReport report;
  report.backends = backend_names;
  report.seed = options.seed;
  report.cases = options.cases;
  report.shard = options.shard;
  report.tolerance = options.gate.abs;
  report.generation = options.generation;
  return report;
}

Scenario NewCase(const format::LlamaConfig& config, const ModelSpec& model,
                 const std::vector<std::string>& backend_names, const CampaignOptions& options,
                 const GenerationOptions& generation, int64_t k, double tolerance_rel) {
  Scenario sc = GenerateCase(config, model, options.seed, k, generation);
  sc.backends = backend_names;
  sc.gate = options.gate;
  sc.gate.rel = tolerance_rel;
  if (tolerance_rel > 0) sc.description += " (demanding)";
  ValidateScenario(sc, config);
  return sc;
}

void HungBackends::Add(const std::string& name, int64_t k) {
  std::lock_guard<std::mutex> lock(mutex_);
  first_case_.emplace(name, k);
}

std::optional<HungBackends::Hang> HungBackends::FirstOf(
    const std::vector<std::string>& names) const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const std::string& name : names) {
    const auto it = first_case_.find(name);
    if (it != first_case_.end()) return Hang{name, it->second};
  }
  return std::nullopt;
}

std::string HungBackends::Hang::Refusal() const {
  return fmt::format(
      "not run: backend {} did not answer within its time-out in case {} (--isolate-timeout), "
      "and is not started again",
      backend, first_case);
}

CaseResult RunCase(const Scenario& sc, const std::vector<const Backend*>& backends,
                   const CampaignOptions& options, int64_t k, bool demanding,
                   const ForEachBackend& for_each_backend, HungBackends* hung) {
  if (hung != nullptr) {
    std::vector<std::string> names;
    for (const Backend* b : backends) names.push_back(b->Name());
    if (const std::optional<HungBackends::Hang> hang = hung->FirstOf(names)) {
      CaseResult result;
      result.index = k;
      result.passed = false;
      result.steps = static_cast<int64_t>(sc.steps.size());
      result.demanding = demanding;
      result.failure = hang->Refusal();
      result.threw = true;
      result.hung_backends = {hang->backend};  // not shrunk either
      result.not_run = true;
      result.scenario_file = WriteFailingCase(options, k, sc);
      return result;
    }
  }
  const auto start = std::chrono::steady_clock::now();
  RunOptions run_options = options.run;
  if (for_each_backend) run_options.for_each_backend = for_each_backend;
  const RunReport run = RunScenario(sc, backends, run_options);
  CaseResult result;
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  result.index = k;
  result.passed = run.Passed();
  result.steps = static_cast<int64_t>(sc.steps.size());
  result.rows_compared = run.rows_compared;
  result.worst_diff = run.worst_diff;
  result.worst = run.worst;
  result.distributions = run.distributions;
  result.demanding = demanding;
  result.worst_relative_diff = run.worst_relative_diff;
  if (!run.Passed()) {
    result.failure = FailureLine(run, demanding);
    result.threw = !run.first_divergence.has_value();
    result.hung_backends = run.hung_backends;
    result.scenario_file = WriteFailingCase(options, k, sc);
  }
  if (hung != nullptr) {
    for (const std::string& name : result.hung_backends) hung->Add(name, k);
  }
  return result;
}

std::string FailureLine(const RunReport& run, bool demanding) {
  if (run.first_divergence) {
    const Divergence& d = *run.first_divergence;
    return fmt::format(
        "step {} {}: {} vs {} at conversation {}, position {}: max |a-b| {}{}", d.step, d.params,
        d.a, d.b, d.row.conversation, d.row.position, FormatDiff(d.row.cmp.max_abs_diff),
        demanding ? fmt::format(" ({} of max |logit| {}; demanding case)",
                                FormatDiff(d.row.cmp.relative_diff()), FormatDiff(d.row.cmp.scale))
                  : std::string());
  }
  const BackendFailure& e = *run.first_error;
  return fmt::format("step {} {}: {} threw: {}", e.step, e.params, e.backend, e.message);
}

void ShrinkFirstFailures(const format::LlamaConfig& config, const std::vector<Scenario>& scenarios,
                         std::vector<CaseResult>& results, const std::vector<size_t>& which,
                         const std::vector<const Backend*>& backends,
                         const CampaignOptions& options, int64_t* shrinks_left) {
  for (size_t i : which) {
    if (*shrinks_left <= 0) return;
    CaseResult& r = results[i];
    if (r.passed) continue;
    --*shrinks_left;
    // A backend that outlasted its time-out is not called again, and a new one would wait as long
    // for every candidate: there is nothing to shrink with.
    if (!r.hung_backends.empty()) {
      r.not_shrunk =
          "not shrunk: a backend did not answer within its time-out (--isolate-timeout); each "
          "candidate would wait for it again";
      continue;
    }
    // A case whose one run outlasts the budget would spend it on its first candidate and find
    // nothing smaller.
    if (r.seconds > options.shrink_budget.max_seconds) {
      r.not_shrunk = fmt::format(
          "not shrunk: one run of it took {:.3g} s, more than the shrink budget of {:.3g} s "
          "(--shrink-seconds)",
          r.seconds, options.shrink_budget.max_seconds);
      continue;
    }
    // A candidate must fail the way the case did (a divergence, or a backend's error), so that
    // shrinking a wrong number cannot end on an unrelated refusal.
    // `failure` ends as the failure line of the last candidate that failed: the smallest.
    std::string failure;
    auto still_fails = [&](const Scenario& candidate) {
      try {
        const RunReport run = RunScenario(candidate, backends, options.run);
        if (run.Passed() || !run.hung_backends.empty() ||
            run.first_divergence.has_value() == r.threw)
          return false;
        failure = FailureLine(run, r.demanding);
        return true;
      } catch (const std::exception&) {
        return false;
      }
    };
    const Shrink shrink = ShrinkScenario(scenarios[i], config, still_fails, options.shrink_budget);
    if (failure.empty()) continue;  // no candidate failed: nothing smaller to write
    Scenario smallest = shrink.scenario;
    smallest.description += fmt::format(" (shrunk from {} steps)", scenarios[i].steps.size());
    r.shrunk = CaseResult::Shrunk{WriteFailingCase(options, r.index, smallest, "-shrunk"), failure,
                                  static_cast<int64_t>(smallest.steps.size()), shrink.runs,
                                  shrink.exhausted};
  }
}

std::string WriteFailingCase(const CampaignOptions& options, int64_t k, const Scenario& sc,
                             const std::string& suffix) {
  const auto file =
      options.out_dir / fmt::format("check-seed{}-case{}{}.json", options.seed, k, suffix);
  static std::mutex write_mutex;  // jobs share the out-dir, which the first write creates
  std::lock_guard<std::mutex> lock(write_mutex);
  WriteTextFile(file, sc.ToText());
  return file.string();
}

void AddWorst(CampaignReport& report, const CaseResult& result) {
  if (!result.worst.Found()) return;
  if (report.worst_case < 0 || !(result.worst_diff <= report.worst_diff)) {
    report.worst_diff = result.worst_diff;
    report.worst = result.worst;
    report.worst_case = result.index;
  }
}

void AddResult(CampaignReport& report, CaseResult result) {
  report.rows_compared += result.rows_compared;
  for (const auto& [path, stats] : result.distributions) report.distributions[path].Merge(stats);
  if (result.demanding) {  // held to a relative gate: its absolute figure would mean nothing
    ++report.demanding.cases;
    report.demanding.failures += result.passed ? 0 : 1;
    if (!(result.worst_relative_diff <= report.demanding.worst_relative_diff))
      report.demanding.worst_relative_diff = result.worst_relative_diff;
  } else {
    AddWorst(report, result);
  }
  report.results.push_back(std::move(result));
}

}  // namespace campaign_detail

CampaignReport RunCampaignOnJobs(const ModelSpec& model,
                                 const std::vector<std::vector<const Backend*>>& jobs,
                                 const CampaignOptions& options) {
  return RunCampaignOnJobs(model, PartBackends{{}, jobs}, options);
}

CampaignReport RunCampaignOnJobs(const ModelSpec& model, PartBackends ordinary,
                                 const CampaignOptions& options) {
  const std::vector<std::vector<const Backend*>>& jobs = ordinary.jobs;
  KVDIFF_CHECK(!jobs.empty() && !jobs[0].empty(), "check: no backend to run");
  const std::vector<const Backend*>& backends = jobs[0];
  for (const auto& job : jobs) {
    KVDIFF_CHECK(job.size() == backends.size(), "check: every job needs the same backends");
  }
  // Copies: the backends they come from are freed before the demanding part.
  const format::LlamaConfig config = backends[0]->config();
  const size_t job_count = jobs.size();
  campaign_detail::CheckOptions(options);
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::string> backend_names;
  for (const Backend* b : backends) backend_names.push_back(b->Name());
  CampaignReport report = campaign_detail::NewReport(backend_names, options);
  report.model = model;
  report.model_description = DescribeModel(config);
  const std::vector<int64_t> indices = ShardCases(options.cases, options.shard);
  GenerationOptions generation = options.generation;
  // Within what every backend holds: its positions, its sessions, its tokens per call.
  generation.max_length = CampaignMaxLength(config, generation.max_length, backends);
  const int64_t context = generation.max_length;
  generation.boundaries = CampaignBoundaries(backends, context);
  generation.max_sessions = CampaignMaxSessions(backends);
  generation.max_call_tokens = CampaignMaxCallTokens(backends);
  generation.shifts = CampaignShifts(backends);
  report.coverage = NewCoverage(generation.boundaries, context);
  report.coverage.reach_limit = CampaignReachLimit(config, options.generation.max_length, backends);
  report.coverage.shift_limit = CampaignShiftLimit(backends, generation.shift_percent);
  const DemandingPart& demanding = options.demanding;
  if (demanding.Active()) ValidateDemandingOptions(demanding.options);
  report.demanding.skipped = demanding.Active() || !demanding.skipped.empty()
                                 ? demanding.skipped
                                 : "--demanding-fraction 0";
  report.demanding.notes = demanding.notes;
  report.demanding.model = demanding.model.Describe();
  report.demanding.backends = demanding.backends;
  report.demanding.fraction = demanding.options.fraction;
  report.demanding.rtol = demanding.options.rtol;
  // The ordinary cases, then the demanding ones (each part on its own backends, freed after it);
  // results land in case order whichever part and job ran them, and the report (and the
  // coverage) is folded from them after, so it is the same for any number of jobs.
  std::vector<size_t> ordinary_cases, demanding_cases;
  for (size_t i = 0; i < indices.size(); ++i) {
    const bool is_demanding =
        demanding.Active() && IsDemandingCase(options.seed, indices[i], demanding.options.fraction);
    (is_demanding ? demanding_cases : ordinary_cases).push_back(i);
  }
  std::vector<CaseResult> results(indices.size());
  std::vector<Scenario> scenarios(indices.size());
  int64_t done = 0, failures = 0, shrinks_left = options.shrink_cases;
  campaign_detail::HungBackends hung;  // across the jobs and both parts
  auto run_part = [&](const std::vector<size_t>& part,
                      const std::vector<std::vector<const Backend*>>& part_jobs,
                      const ModelSpec& part_model, const std::vector<std::string>& names,
                      bool demanding_part) {
    KVDIFF_CHECK(part_jobs.size() == job_count,
                 "check: the demanding part needs one backend set per job ({} for {} jobs)",
                 part_jobs.size(), job_count);
    for (size_t i : part) {
      scenarios[i] =
          campaign_detail::NewCase(config, part_model, names, options, generation, indices[i],
                                   demanding_part ? demanding.options.rtol : 0);
    }
    // The costliest cases first, and an idle job runs a busy job's backend replays with its own
    // backends (the same model): the long cases no longer end the campaign on one core.
    const std::vector<size_t> order = CostliestFirst(scenarios, part);
    SharedWork shared;
    RunJobs(
        static_cast<int64_t>(order.size()), static_cast<int>(part_jobs.size()),
        [&](int job, int64_t p) {
          const size_t i = order[p];
          const ForEachBackend on_any_job = [&, job](const std::vector<size_t>& which,
                                                     const auto& work) {
            shared.Run(job, static_cast<int64_t>(which.size()), [&](int64_t t, int runner) {
              const size_t b = which[static_cast<size_t>(t)];
              work(b, *part_jobs[runner][b]);
            });
          };
          results[i] = campaign_detail::RunCase(scenarios[i], part_jobs[job], options, indices[i],
                                                demanding_part, on_any_job, &hung);
        },
        [&](int64_t p) {
          ++done;
          failures += results[order[p]].passed ? 0 : 1;
          if (options.progress) {
            options.progress(done, static_cast<int64_t>(indices.size()), failures);
          }
        },
        &shared);
    campaign_detail::ShrinkFirstFailures(config, scenarios, results, part, part_jobs[0], options,
                                         &shrinks_left);
  };
  run_part(ordinary_cases, jobs, model, report.backends, false);
  ordinary = PartBackends{};  // the ordinary model is freed here when the campaign owned it
  if (!demanding_cases.empty()) {
    PartBackends built;
    if (demanding.jobs.empty()) built = demanding.build();
    run_part(demanding_cases, demanding.jobs.empty() ? built.jobs : demanding.jobs, demanding.model,
             demanding.backends, true);
  }
  for (size_t i = 0; i < results.size(); ++i) {
    report.coverage.Add(scenarios[i], report.model_description,
                        IsLongCase(options.seed, indices[i], generation.long_fraction, context), 0,
                        config.sliding_window);
    campaign_detail::AddResult(report, std::move(results[i]));
  }
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

}  // namespace kvdiff::harness
