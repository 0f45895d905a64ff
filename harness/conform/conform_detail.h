// What the checks of `kvdiff conform` share (conform.cc, conform_batch.cc, conform_shift.cc; the
// Script's code is in conform_script.cc). A check writes its calls as a Script: a scenario, one
// label per step for the report, and the bad calls the engine must refuse between them. Play runs
// it through the one replay (Replay) and the one oracle check (CheckAgainstOracle), so conform
// holds an engine's rows to its oracle exactly as `run` and `check` do; rows after a shift, which
// no uncached forward is the oracle of, are held to the arbiter's replay of the same script, as a
// differential run holds them to ref64. A check returns its figures, throws
// Nonconformance when the engine does not do what it asks and NotApplicable when it does not
// apply to the model. Not for use outside conform.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "harness/backend/backend.h"
#include "harness/compare/gate.h"
#include "harness/replay/oracle_check.h"
#include "harness/replay/replay.h"
#include "harness/scenario/scenario.h"

namespace kvdiff::harness::conform_detail {

// What a check throws when the engine does not do what it asks; the message is the report's.
class Nonconformance : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// What a check throws when it does not apply to this model (it is reported as skipped, and why).
class NotApplicable : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

template <typename... Args>
[[noreturn]] void Fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Nonconformance(fmt::format(format, std::forward<Args>(args)...));
}

// A call the engine must refuse as bad input (an InputError: KVDIFF_INVALID_INPUT for a plugin),
// changing nothing. It is given the engine and its live sessions in the order they were made
// (the scenario's "main" first), and makes its call on them directly: no scenario holds bad input.
using BadCall = std::function<void(const Backend& engine, const std::vector<BackendSession*>&)>;

struct Played;

class Script {
 public:
  // `arbiter` (may be null) replays a script with shifts: the rows after a shift are held to its.
  Script(const Backend& engine, const Backend& oracle, const Backend* arbiter, const Gate& gate,
         uint64_t seed);

  // n tokens drawn from the whole vocabulary (the same for a given seed on every platform).
  Tokens RandomTokens(int64_t n);

  // Adds a step, named `what` in a failure ("chunk of 7"); returns its index.
  size_t Add(Step step, std::string what);
  // A prefill of `tokens` on the conversation: one call, or calls of the engine's max_batch_tokens
  // when it declares fewer (one step either way); returns the step's index.
  size_t Append(const std::string& conversation, const Tokens& tokens, std::string what);
  // The call must be refused, leaving every session's Length() as it was; it is made after the
  // last append added so far, before the next step's call (so a step must follow it), and the
  // appends added after it show that the cache is unchanged.
  void Refuse(std::string what, BadCall call);

  // Rows of `conversation` in step `step` and of `other` in step `other_step` that share a
  // position are held to each other with the engine's own gate (Gate::Own): two ways the engine
  // computes the same rows (a batch and its items alone, twins in one call).
  void Same(std::string what, size_t step, std::string conversation, size_t other_step,
            std::string other);

  // Replays the script on the engine and holds it to the oracle (the rows after a shift to the
  // arbiter's replay). Throws NotApplicable, before any call, when the script needs more than the
  // engine declares it holds (its max_length, max_sessions, max_batch_tokens), and Nonconformance
  // at the first step that failed, in step order: the replay's error (a throw, a wrong shape,
  // NaN/inf, a Length() that is not what was fed), the oracle's failure, a row beyond the gate, a
  // bad call that was not refused or changed a length; then the first pair of Same rows that
  // differ.
  Played Play() const;
  // Replays the script on the engine alone (no oracle, no bad calls): NotApplicable as Play's,
  // Nonconformance at the first step that failed.
  Recording ReplayOnly() const;

  int64_t vocab() const { return engine_.config().vocab_size; }
  // The positions a session of the engine holds: its declared max_length when it has one, else
  // the model's max_position_embeddings.
  int64_t max_positions() const;
  // "max_length 20" or "max_position_embeddings 512": what max_positions() comes from.
  std::string max_positions_name() const;
  const Backend& engine() const { return engine_; }
  const Backend* arbiter() const { return arbiter_; }

 private:
  struct Refusal {
    std::string what;
    BadCall call;
    int64_t after_append;  // the engine's append calls (a batch is one) before it is made
    size_t step;           // the step whose last call it follows
  };
  struct SameRows {
    std::string what;
    size_t step, other_step;
    std::string conversation, other;
  };
  // The scenario checked as the engine's own (ValidateScenario) and against what the engine
  // declares it holds (ValidateScenarioFor: NotApplicable, saying what the check needs).
  void CheckFits() const;
  // The step's failure as the report says it: "chunk of 1: ...".
  std::string At(size_t step, const std::string& message) const;
  void CheckRows(Played& played, size_t step) const;
  // The rows after a shift against the arbiter's replay of the same scenario (Played::arbitrated).
  void Arbitrate(Played& played) const;

  const Backend& engine_;
  const Backend& oracle_;
  const Backend* arbiter_;
  Gate gate_;
  uint64_t rng_;
  Scenario scenario_;
  std::vector<std::string> what_;  // one per step
  int64_t appends_ = 0;
  std::vector<Refusal> refusals_;
  std::vector<SameRows> same_;
};

// A script played on the engine and held to the oracle (Script::Play).
struct Played {
  Recording recording;
  OracleCheck oracle;
  int64_t rows = 0;  // rows held to the oracle
  double worst = 0;
  // Parallel to recording.rows: a row after a shift against the arbiter's row of the same step,
  // conversation and history; nullopt for every other row.
  std::vector<std::optional<RowComparison>> arbitrated;
  int64_t shifted_rows = 0;  // rows held to the arbiter
  double shifted_worst = 0;
  int64_t same_rows = 0;  // rows held to each other (Script::Same)
  double same_worst = 0;
  std::vector<std::string> refusals;  // each bad call's refusal, in order

  // "N rows, max |a-b| D"
  std::string Figures() const;
  // "max |a-b| D over N rows" of the Same rows
  std::string SameRowsFigure() const;
  // "refused: " and the last refusal's message, shortened for the table
  std::string Refused() const;
};

// An item of a batch step: `tokens` appended to `conversation`, every row returned.
inline BatchEntry Item(const std::string& conversation, Tokens tokens) {
  BatchEntry item;
  item.conversation = conversation;
  item.tokens = std::move(tokens);
  return item;
}

struct CheckDef {
  const char* name;
  const char* what;
  std::function<std::string(Script&)> run;
};

// The checks of batched calls (Backend::AppendBatch): conform_batch.cc.
std::vector<CheckDef> BatchChecks();
// The checks of context shifts (BackendSession::Shift): conform_shift.cc.
std::vector<CheckDef> ShiftChecks();
// The checks of work an engine defers or sizes (after a reset, many sessions, long histories):
// conform_edges.cc.
std::vector<CheckDef> EdgeChecks();

}  // namespace kvdiff::harness::conform_detail
