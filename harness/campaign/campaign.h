// `kvdiff check`: a campaign of random scenarios on the checked API. Case k is generated from
// (seed, k) alone, so shard i/n (the cases with k % n == i - 1) runs the same cases on any machine.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "harness/backend/backend.h"
#include "harness/campaign/case_generator.h"
#include "harness/campaign/coverage.h"
#include "harness/campaign/demanding_part.h"
#include "harness/campaign/shape_generator.h"
#include "harness/campaign/shrink.h"
#include "harness/report/junit.h"
#include "harness/run/differential_run.h"
#include "harness/scenario/scenario.h"

namespace kvdiff::harness {

struct Shard {
  int64_t index = 1;  // 1-based
  int64_t count = 1;
};
// "i/n" with 1 <= i <= n; InputError naming --shard otherwise.
Shard ParseShard(const std::string& text);
// The case indices shard runs out of cases: k with k % count == index - 1, ascending.
std::vector<int64_t> ShardCases(int64_t cases, const Shard& shard);
// ShardCases(cases, shard).size(), without listing them (a shard count may exceed the cases).
int64_t ShardCaseCount(int64_t cases, const Shard& shard);

// The most cases one campaign holds: `check --cases` takes 1 to kMaxCases, and `merge` refuses a
// report that says more. The campaign lists its cases' indices and results, so a count far past
// this ran out of memory before the first case (docs/bad-input.md).
constexpr int64_t kMaxCases = 10'000'000;

struct CampaignOptions {
  uint64_t seed = 0;
  int64_t cases = 0;
  Shard shard;
  std::filesystem::path out_dir = "kvdiff-failures";  // failing cases are written here
  // --tolerance (or a tolerance profile's) and the rope-f32 allowance, resolved over the backends
  // (ResolveGate); rel stays 0: the demanding cases take theirs from DemandingOptions::rtol.
  Gate gate;
  // --max-length, --long-fraction; the boundaries are filled in by RunCampaign from the
  // backends' declared sizes and the powers of two (CampaignBoundaries).
  GenerationOptions generation;
  // Which random shapes RunRandomShapeCampaign draws: --shapes random, or the long tier (--long).
  ShapeTier shape_tier = ShapeTier::kSmall;
  RunOptions run;
  // The cases run on the demanding variant of the model against ref64
  // (harness/campaign/demanding_part.h), after the ordinary ones; the caller gives its backends or
  // how to build them. Inactive (skipped set, or no backends): every case is an ordinary one.
  DemandingPart demanding;
  // The first `shrink_cases` failing cases are shrunk (harness/campaign/shrink.h) on the backends
  // that failed them (the ordinary part's first, in case order, then the demanding part's), each
  // within shrink_budget, and the smallest failing scenario found is written beside the whole case
  // (check-seedS-caseK-shrunk.json); 0: none.
  // --shapes random (and --long) cases are not shrunk (each has its own model).
  int64_t shrink_cases = 3;
  ShrinkBudget shrink_budget;
  // Called after every case with (done, total, failures) for a progress line.
  std::function<void(int64_t, int64_t, int64_t)> progress;
};

struct CaseResult {
  int64_t index = 0;
  bool passed = true;
  int64_t steps = 0, rows_compared = 0;
  double worst_diff = 0;
  bool demanding = false;                  // run on the demanding model (DemandingPart)
  double worst_relative_diff = 0;          // max |a-b| / max |logit| over its rows
  WorstRow worst;                          // the row of worst_diff, with its gate
  std::string failure;                     // first divergence or error, one line
  bool threw = false;                      // the failure is a backend's error, not a divergence
  std::vector<std::string> hung_backends;  // outlasted their time-out in it (RunReport's)
  bool not_run = false;  // failed unrun: a backend of it hung in an earlier case (HungBackends)
  std::string scenario_file;  // written when it failed
  // When the failing case was shrunk (CampaignOptions::shrink_cases): the smallest failing
  // scenario found, its file and first failure, its steps, and the replays it took.
  struct Shrunk {
    std::string file, failure;
    int64_t steps = 0, runs = 0;
    bool exhausted = false;  // the budget ran out first: a smaller one may exist
  };
  std::optional<Shrunk> shrunk;
  // Why a failing case among the first shrink_cases was not shrunk (a backend hung in it, or one
  // run of it outlasts the whole shrink budget); else empty.
  std::string not_shrunk;
  double seconds = 0;  // wall time of the case's run on its backends
  std::string shape;   // --shapes random: the case's model (ShapeParams); else empty
  std::map<std::string, DistributionStats> distributions;  // RunReport's
};

struct CampaignReport {
  ModelSpec model;  // --shapes fixed: the model every case ran on
  std::string model_description;
  bool random_shapes = false;  // --shapes random: each case its own model (CaseResult::shape)
  bool long_shapes = false;    // check --long: those models are the long tier's (ShapeTier::kLong)
  std::vector<std::string> backends;
  double tolerance = kDefaultTolerance;
  uint64_t seed = 0;
  int64_t cases = 0;
  GenerationOptions generation;  // --max-length, --long-fraction
  Shard shard;
  std::vector<CaseResult> results;  // in case order
  int64_t rows_compared = 0;
  double worst_diff = 0;    // over the ordinary cases (the demanding ones are relative)
  WorstRow worst;           // the row of worst_diff, with its gate
  int64_t worst_case = -1;  // the case it is in
  // The demanding part: its model, backends and gate, or why it was skipped; how many of the cases
  // run were demanding, and their worst difference relative to max |logit|.
  struct Demanding {
    std::string skipped;
    std::vector<std::string> notes;
    std::string model;  // ModelSpec::Describe() of the demanding variant
    std::vector<std::string> backends;
    double fraction = 0, rtol = 0;
    int64_t cases = 0, failures = 0;
    double worst_relative_diff = 0;
    std::string Text() const;  // the summary's line(s)
    nlohmann::json ToJson() const;
  } demanding;
  double seconds = 0;
  Coverage coverage;  // what the cases exercised (of the cases run: this shard's)
  // Per path of a backend held to a tolerance profile, over every case (RunReport's).
  std::map<std::string, DistributionStats> distributions;

  int64_t Failures() const;
  bool Passed() const { return Failures() == 0; }
  int ExitCode() const { return Passed() ? 0 : 1; }
  std::string Summary() const;  // the closing lines for the terminal
  // "worst difference: <WorstRowText> in case 17\n", or "" when no ordinary row was compared.
  std::string WorstLine() const;
  nlohmann::json ToJson() const;
  std::string ToJUnit() const;
  JUnitSuite ToJUnitSuite() const;  // the suite ToJUnit writes (merge adds to it)
};

// The backends are built over the model `model` describes (it is recorded in failing cases).
CampaignReport RunCampaign(const ModelSpec& model, const std::vector<const Backend*>& backends,
                           const CampaignOptions& options);
// The same campaign on jobs.size() threads, job j running its cases on jobs[j] only (each its own
// backend instances, built alike): the report is the one a single job gives, case for case.
CampaignReport RunCampaignOnJobs(const ModelSpec& model,
                                 const std::vector<std::vector<const Backend*>>& jobs,
                                 const CampaignOptions& options);
// The same with backends it owns: they are freed once the ordinary cases are done, before the
// demanding part's are built (PartBackends).
CampaignReport RunCampaignOnJobs(const ModelSpec& model, PartBackends ordinary,
                                 const CampaignOptions& options);

// Whether every named backend applies a sliding window (BackendInfo::sliding_windows): only
// then do random shapes have windows (ShapeModel's `windows`).
bool CampaignWindows(const std::vector<std::string>& backend_names);

// --shapes random: case k runs on a model of its own, ShapeModel(options.seed, k)
// (harness/campaign/shape_generator.h), with backends built for it by the registry from
// `backend_names` (every one for every case, on whichever of the `jobs` threads runs it). Its
// history is capped by its own context, and its boundaries are the powers of two and declared sizes
// below that context; the coverage's boundaries are the union of the cases' and its context the
// largest (docs/campaign-cases.md, "Random shapes"). A backend that cannot be built for a shape (an
// engine that refuses it) fails that case, naming the backend and saying why. The report is the
// same for any jobs.
CampaignReport RunRandomShapeCampaign(const std::vector<std::string>& backend_names,
                                      const BackendOptions& backend_options, int jobs,
                                      const CampaignOptions& options);

}  // namespace kvdiff::harness
