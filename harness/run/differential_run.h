// The differential runner: replays a scenario on each backend through a driver, compares every
// cached logits row with the same backend's ForwardFull over that conversation's history (the
// oracle), and each backend's rows with the others'.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "format/model_files.h"
#include "format/tokenizer.h"
#include "harness/backend/backend.h"
#include "harness/backend/registry.h"
#include "harness/compare/compare.h"
#include "harness/compare/gate.h"
#include "harness/replay/oracle_check.h"
#include "harness/replay/replay.h"
#include "harness/run/localization.h"
#include "harness/run/model_for.h"
#include "harness/scenario/scenario.h"

namespace kvdiff::harness {

enum class PathStatus {
  kPass,     // every row within tolerance
  kFail,     // a row beyond tolerance or not finite
  kError,    // the backend threw; message holds what it said
  kSkipped,  // not run or not comparable; message says why
  kNoRows,   // the step produces no logits (new_conversation, truncate, fork, reset)
};
std::string PathStatusName(PathStatus status);  // "pass", "FAIL", "ERROR", "skip", "-"

struct ComparedRow {
  int64_t row = 0;  // index of the row within the step
  std::string conversation;
  int64_t position = 0;  // position in the conversation's history
  Token token = 0;       // the input token at that position
  RowComparison cmp;
  int64_t rope_reach = 0;  // RecordedRow::rope_reach: where a rope-f32 allowance is taken
};

// What a column compares: a backend against its own ForwardFull, or two backends.
enum class PathKind { kOracle, kCross };
std::string PathKindName(PathKind kind);  // "oracle", "cross" (as the JSON report writes them)

// One column of a step: a backend against its own ForwardFull (kOracle: path "impl"), or two
// backends against each other (kCross: path "impl~ref", a = impl, b = ref).
struct PathOutcome {
  std::string path;
  PathKind kind = PathKind::kOracle;
  std::string a, b;  // what was compared: "impl" vs "impl ForwardFull", or "impl" vs "ref"
  PathStatus status = PathStatus::kNoRows;
  std::string message;
  double max_abs_diff = 0;        // over the compared rows
  int64_t rows_not_compared = 0;  // cross only: rows whose token histories differ
  std::vector<ComparedRow> rows;
  size_t a_index = 0, b_index = 0;  // a's and b's places in RunReport::backends
};

struct StepReport {
  int64_t index = 0;
  Step step;
  std::vector<PathOutcome> outcomes;
  bool Passed() const;
  double MaxAbsDiff() const;
};

struct Divergence {
  int64_t step = 0;
  Op op = Op::kPrefill;  // the step's
  std::string params;
  PathKind kind = PathKind::kOracle;
  std::string path, a, b;
  size_t a_index = 0, b_index = 0;  // into RunReport::backends
  ComparedRow row;
};

struct BackendFailure {
  int64_t step = 0;
  std::string params, backend, conversation, message;
};

// The row with the largest max |a-b| of a run, and the gate it was held to there, so a summary
// says which gate a worst figure was held to: "worst difference 1.8e-04 at impl~ref, conversation
// c0, position 511, within its gate 6.1e-04 (tolerance 1.0e-04 + rope-f32 allowance 1.0e-06 x
// 511)". Empty (step -1) when no row was compared.
struct WorstRow {
  double diff = 0;  // max |a-b|; +inf when a value was not finite
  double gate = 0;  // the row's gate (RowComparison::gate)
  // How the gate was made: "tolerance" (the run's), "tolerance 1.0e-04 + rope-f32 allowance
  // 1.0e-06 x 511", "1.0e-02 x max |logit| 1.3e+03".
  std::string gate_basis;
  std::string path;  // "impl~ref"; "impl" against its own ForwardFull
  int64_t step = -1;
  std::string conversation;
  int64_t position = -1;
  bool within = true;  // diff within the gate
  bool Found() const { return step >= 0; }
};

struct RunReport {
  std::string scenario;
  std::string model_source;       // ModelSpec::Describe()
  std::string model_description;  // DescribeModel(config)
  format::LlamaConfig config;
  Gate gate;  // the scenario's, recorded
  DriverKind driver = DriverKind::kSession;
  std::vector<std::string> backends;
  std::vector<std::string> notes;
  std::vector<StepReport> steps;
  std::optional<Divergence> first_divergence;
  std::optional<BackendFailure> first_error;
  std::optional<Localization> localization;
  int64_t rows_compared = 0;
  double worst_diff = 0;  // over every comparison (+inf when a row was not finite)
  WorstRow worst;         // the row of worst_diff, with its gate
  // max over the comparisons of max |a-b| / max |b_i| (RowComparison::relative_diff)
  double worst_relative_diff = 0;
  double seconds = 0;
  // Per path ("impl~llama.cpp?kv=f16") of a backend held to a tolerance profile: its argmax, top-5
  // and KL metrics over every compared row.
  std::map<std::string, DistributionStats> distributions;

  // The backends that outlasted their time-out (EngineHungError) in their replay or their oracle
  // pass: killed, and not called again (Recording::hung_at, OracleCheck::hung).
  std::vector<std::string> hung_backends;
  bool Passed() const { return !first_divergence && !first_error; }
  int ExitCode() const { return Passed() ? 0 : 1; }
};

// How RunScenario runs a round of its backends' replays and oracle passes (tasks independent of
// each other): called with `which` and work, it must call work(b, backend) once for every b in
// `which`, where backend is backends[b] or an equal instance of it (the same model, kind and
// options). A campaign passes one that lets its idle jobs take some (SharedWork); empty: in order,
// on the calling thread.
using ForEachBackend =
    std::function<void(const std::vector<size_t>& which,
                       const std::function<void(size_t b, const Backend& backend)>& work)>;

struct RunOptions {
  bool localize = false;
  ForEachBackend for_each_backend;
};

// The backends to run: requested (e.g. --backends) if given, else the scenario's, else the
// default (impl and ref with LibTorch, impl without). A backend the driver cannot drive is an
// InputError when named explicitly, and is left out with a note (in *notes) when defaulted.
std::vector<std::string> PlanBackends(const std::vector<std::string>& requested,
                                      const Scenario& scenario, std::vector<std::string>* notes);

// Tokenizes the text prompts with the model's tokenizer (LoadTokenizerFor; InputError when the
// model has none) and validates the scenario against the model.
void PrepareScenario(Scenario& scenario, const format::ModelWeights& weights);

// Every backend's rows of a scenario, each against its own ForwardFull and against each other
// backend's: what RunScenario folds into its report.
struct Replayed {
  std::vector<Recording> recs;       // by backend; the logits of all but the last one's are freed
  std::vector<OracleCheck> oracles;  // by backend: its rows against its ForwardFull
  // (x, y) for x < y: one outcome a step, the rows of x and y where their histories agree
  std::map<std::pair<size_t, size_t>, std::vector<PathOutcome>> cross;
};

// A row's logits are read by its backend's oracle pass and by the cross comparisons with each
// other backend. Holding every backend's rows until all were compared held a case's logits once
// per backend (the long case of smollm2-135m's campaign: 2,708 rows of 196 KB, 0.53 GB, a
// backend). So backend b replays after the ones before it and compares each of its steps with
// theirs once it has recorded it, and the last backend frees their rows step by step (their oracle
// passes done): a case holds about one backend's rows at a time. The oracle pass of b - 1 and the
// replay of b are one round of options.for_each_backend, so that a campaign's idle job can take
// either; the rows of b - 1 are freed only once its oracle pass is done.
Replayed ReplayAndCompare(const Scenario& scenario, const std::vector<const Backend*>& backends,
                          const RunOptions& options);

// Runs a prepared, validated scenario: one Replay per backend, the oracle pass on each, then every
// pair of backends compared row by row where their histories agree.
RunReport RunScenario(const Scenario& scenario, const std::vector<const Backend*>& backends,
                      const RunOptions& options);

}  // namespace kvdiff::harness
