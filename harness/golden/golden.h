// Golden files: what the arbiter backend produced for a scenario, pinned in the repository so a
// change anywhere (a kernel, a dependency, a cache refactor) that moves the numbers is seen in
// review. The format is documented in golden/README.md; in short, a golden set is three files in
// one folder:
//   NAME.json                  the scenario, as `kvdiff run` reads it
//   NAME.golden.json           per compared row: token fed, greedy token, top-10 ids and logits,
//                              sum / sum of squares / max of the full row; a header naming the
//                              model, backend, dtype, tolerance, kvdiff version, regen command
//   NAME.golden.safetensors    the full float32 row of each conversation's last position
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "format/model_files.h"
#include "harness/backend/backend.h"
#include "harness/compare/compare.h"
#include "harness/replay/replay.h"
#include "harness/run/differential_run.h"
#include "harness/scenario/scenario.h"

namespace kvdiff::harness {

inline constexpr const char* kGoldenFormat = "kvdiff-golden";
inline constexpr int kGoldenVersion = 1;
inline constexpr int kGoldenTopK = 10;
// regen keeps a file when nothing moved by more than this fraction of the field's tolerance: a
// float64 backend's last bits may differ between machines (BLAS kernels, thread counts), and a
// golden must not churn over noise a million times below what verify can see.
inline constexpr double kGoldenNoiseFraction = 1e-3;

struct GoldenRow {
  int64_t step = 0, row = 0;  // the row's step index and its index within the step
  std::string conversation;
  int64_t position = 0;
  Token token = 0;                             // the token fed at this position
  Token greedy = 0;                            // the row's argmax (the first on ties)
  std::vector<std::pair<Token, float>> top_k;  // highest logits first; ties by lower id
  double sum = 0, sum_sq = 0;  // over the full row, accumulated in float64 in index order
  double max = 0, min = 0;     // the largest and smallest logit (float32 values)
  std::string full;  // tensor name in the rows file when the row is stored whole, else empty
};

struct Golden {
  std::string scenario;         // the scenario's file name (same folder)
  std::string scenario_sha256;  // of its bytes: an edited scenario makes the golden stale
  nlohmann::json model;         // the scenario's "model" object as written
  std::map<std::string, std::string> model_files;  // file name -> sha256 (path and llama2c kinds)
  std::string model_description;
  int64_t vocab_size = 0;
  std::string backend;  // what produced it: ref64 by default
  std::string dtype;    // that backend's compute dtype: float64 or float32
  std::string driver;
  double tolerance = kDefaultTolerance;  // the scenario's tolerance.abs, which verify checks with
  int top_k = kGoldenTopK;
  std::string kvdiff_version;
  std::string regenerate;  // the command that rewrites this file, run from its folder
  std::string rows_file;   // NAME.golden.safetensors
  std::string rows_sha256;
  std::vector<GoldenRow> rows;
  // Loaded from rows_file (not part of the JSON text): tensor name -> (vocab_size) floats.
  std::map<std::string, std::vector<float>> full_rows;
};

// A row's greedy token, top-k (highest first, ties by lower id) and digests; the identifying
// fields (step, row, conversation, position, token) are left for the caller.
GoldenRow SummarizeRow(const std::vector<float>& logits, int top_k);

// The JSON text: fixed key order, one row per line, floats in the shortest form that reads back
// exactly. No timestamps or hostnames, so the same values give the same bytes.
std::string GoldenToText(const Golden& golden);
// Parses GoldenToText's output (full_rows left empty); InputError naming `where` and the field.
Golden ParseGolden(const std::string& text, const std::string& where);
// The backend's compute dtype, from the registry ("float64" for ref64); "" for one this build
// cannot make.
std::string BackendDtype(const std::string& backend);

// The three files of a golden set.
struct GoldenPaths {
  std::filesystem::path scenario, golden, rows;
};
// From a scenario (NAME.json) or a golden (NAME.golden.json) path.
GoldenPaths GoldenPathsFor(const std::filesystem::path& scenario_or_golden);
// Each argument is a file (a scenario or a golden) or a folder searched recursively for scenarios
// (*.json but not *.golden.json, no dot files). Sorted by path, no duplicates. InputError for a
// path that does not exist or a folder with no scenario.
std::vector<GoldenPaths> FindGoldenSets(const std::vector<std::filesystem::path>& args);

// A golden set's scenario, loaded and prepared against its model.
struct GoldenInput {
  Scenario scenario;
  std::string scenario_sha256;
  nlohmann::json model_json;                       // as written in the scenario
  std::map<std::string, std::string> model_files;  // file name -> sha256
  std::shared_ptr<const format::ModelWeights> weights;
  std::string missing;  // not empty: the model's data is absent here, and the set is skipped
};
// The model is whatever ParseScenario accepts (a preset, a directory, a llama2c checkpoint); when
// its files are absent here, `missing` says which and nothing is loaded.
GoldenInput LoadGoldenInput(const std::filesystem::path& scenario_file);

// ---- regen ----

struct GoldenChange {
  bool is_new = false;
  std::vector<std::string> header_fields;  // header fields whose value changed
  int64_t rows_changed = 0, rows_total = 0;
  int64_t tokens_changed = 0;  // rows whose fed or greedy token changed
  double largest_change = 0;   // largest logit move (top-k by id, max, full rows)
  std::string largest_where;   // "step 2 row 1"
  bool Any() const { return is_new || !header_fields.empty() || rows_changed > 0; }
  std::string Summary() const;
};
// What moved between two goldens, ignoring moves below kGoldenNoiseFraction of their tolerance.
GoldenChange DiffGolden(const Golden& before, const Golden& after);

struct RegenOptions {
  std::string backend;  // empty: the golden's recorded backend, else the registry's arbiter
  bool check_only = false;
  int threads = 0;
};
enum class RegenStatus { kUnchanged, kWritten, kWouldChange, kRefused, kSkipped, kError };
std::string RegenStatusName(RegenStatus status);
struct RegenResult {
  GoldenPaths paths;
  RegenStatus status = RegenStatus::kUnchanged;
  std::string message;                // refusal, skip or error reason
  std::vector<std::string> warnings;  // fragile greedy choices
  GoldenChange change;
};
// Recomputes one golden set; writes the rows file then the JSON, each atomically (temporary file
// + rename), and only when something moved (an unchanged file keeps its bytes and its mtime).
// Refuses (kRefused) when the backend's cached rows disagree with its own uncached forward.
RegenResult RegenGoldenSet(const GoldenPaths& paths, const RegenOptions& options);

// ---- verify ----

struct GoldenMismatch {
  int64_t step = 0;
  std::string params;  // "prefill(main,n=5,chunks=3+2)"
  int64_t row = 0;
  std::string conversation;
  int64_t position = 0;
  Token token = 0;
  std::string detail;  // what differs, with both values and the tolerance
  double diff = 0;
};
struct GoldenCheck {  // one golden set on one backend
  std::string backend;
  PathStatus status = PathStatus::kPass;  // kPass, kFail, kError (backend threw), kSkipped
  std::string message;
  int64_t rows_compared = 0;
  double worst_diff = 0;  // largest |a - golden| over compared logits
  std::optional<GoldenMismatch> first;
  double tolerance = 0;        // what this backend was held to
  std::string tolerance_note;  // the tolerance profile that applied, if one did
};
struct GoldenSetReport {
  GoldenPaths paths;
  std::string model;      // the scenario's model, described
  std::string made_with;  // the golden's backend
  double tolerance = 0;
  std::string skipped;      // the model data is absent
  std::string input_error;  // the set cannot be read (exit 2)
  std::string stale;        // the golden does not describe this scenario or model any more
  std::vector<GoldenCheck> checks;
  bool Passed() const;
};
struct VerifyReport {
  std::vector<std::string> backends;
  std::vector<GoldenSetReport> sets;
  double seconds = 0;
  int ExitCode() const;  // 2 when a set could not be read, else 1 on any failure, else 0
  std::string ToTerminal(bool color) const;
  nlohmann::json ToJson() const;
  std::string ToJUnit() const;
};
// Compares one recorded row with its golden (and the full golden row when stored). Empty when the
// row is within tolerance; else what differs.
std::string CompareWithGolden(const GoldenRow& golden, const std::vector<float>* golden_full,
                              const RecordedRow& row, double tolerance, double* diff);
// backends: empty means the registry's default set (impl,ref with LibTorch, impl without).
// tolerance: --tolerance, which wins over each golden's recorded tolerance when given.
VerifyReport VerifyGoldens(const std::vector<GoldenPaths>& sets,
                           const std::vector<std::string>& backends, const BackendOptions& options,
                           const std::optional<double>& tolerance = std::nullopt);

}  // namespace kvdiff::harness
