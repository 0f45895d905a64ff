// The conformance suite an engine author runs (`kvdiff conform`): every op of the checked session
// on one backend, each row held to an oracle backend's uncached forward of the same history (impl
// by default: an engine that reads its weights wrong agrees with itself, so self-consistency is
// not enough), then the error paths (each refused as bad input, changing nothing), fork
// independence, reset, determinism and the capacity, batched calls (Backend::AppendBatch: every
// row held to the oracle and to the same items appended alone, after forks and truncates too, and
// a bad batch refused as a whole), context shifts (rows after a shift held to an arbiter that
// shifts too, ref64 from the command line; bad shifts refused) when the engine shifts, and finally
// a `check` campaign of the engine beside the oracle. An engine's declared limits (max_length,
// max_sessions, max_batch_tokens) are kept: a check that needs more is skipped, saying so.
// Written for engine plugins; any Backend can be put through it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "harness/backend/backend.h"
#include "harness/compare/compare.h"
#include "harness/compare/gate.h"
#include "harness/scenario/scenario.h"

namespace kvdiff::harness {

struct ConformOptions {
  Gate gate;                     // resolved over the engine and the oracle (ResolveGate)
  int64_t campaign_cases = 100;  // 0 leaves the campaign out
  uint64_t seed = 0;             // the tokens of every check and the campaign's seed
  std::filesystem::path out_dir = "kvdiff-failures";  // the campaign's failing cases
  // The capacity check fills a session to the positions the engine holds (its max_length, else
  // max_position_embeddings); above this it is skipped.
  int64_t max_capacity_fill = 4096;
  // What rows after a shift are held to: no uncached forward is their oracle, so a backend that
  // replays the same shifts arbitrates (`kvdiff conform` passes ref64, which shifts exactly, in
  // double, when it is built). Null: the oracle, if it shifts; else the shift check is skipped.
  const Backend* shift_arbiter = nullptr;
};

struct ConformCheck {
  std::string name;  // "prefill", "fork", "token-out-of-range", ...
  std::string what;  // what it asks of the engine, one line
  enum class Result { kPass, kFail, kSkip } result = Result::kPass;
  std::string detail;  // the figures when it passed, what went wrong when not, why when skipped
  double seconds = 0;
};

struct ConformReport {
  std::string backend, oracle;
  // What rows after a shift were held to; "" when the engine does not shift or nothing
  // arbitrates (the shift check is then skipped).
  std::string shift_arbiter;
  std::string model;  // ModelSpec::Describe() and the shape
  double tolerance = kDefaultTolerance;
  std::vector<ConformCheck> checks;
  double seconds = 0;

  int64_t Failures() const;
  bool Passed() const { return Failures() == 0; }
  int ExitCode() const { return Passed() ? 0 : 1; }
  std::string Table() const;  // the terminal table and the closing line
  nlohmann::json ToJson() const;
  std::string ToJUnit() const;  // one testcase per check
};

// Runs every check on `engine`, holding its rows to `oracle`'s ForwardFull. Never throws for what
// the engine does (a throw where none is expected, or none where one is, fails that check); the
// other checks still run. Both backends must be built over the model `model` describes.
ConformReport RunConformance(const ModelSpec& model, const Backend& engine, const Backend& oracle,
                             const ConformOptions& options);

}  // namespace kvdiff::harness
