// The oracle pass: every recorded row held to an uncached ForwardFull over its history. It returns
// its own table and leaves the recording as replayed. It is a comparison, but it reads a
// Recording, which replay/ defines; in compare/, which replay/ links (the greedy choice and the
// NaN/inf check are built on the row comparison), it would make a cycle, so it lives here.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "harness/backend/backend.h"
#include "harness/compare/compare.h"
#include "harness/replay/replay.h"

namespace kvdiff::harness {

struct OracleCheck {
  // Parallel to Recording::rows: the row against the oracle's row of the same history and
  // position; nullopt when the ForwardFull of that history failed, and for rows after a shift
  // (RecordedRow::after_shift), which no uncached forward is the oracle of.
  std::vector<std::optional<RowComparison>> rows;
  // Parallel to Recording::rows: true for a row whose history is longer than the oracle takes in
  // one call (its BackendInfo::max_batch_tokens): no uncached forward of it can be asked, so the
  // row is left nullopt and compared across backends only.
  std::vector<bool> beyond_call;
  int64_t max_call_tokens = 0;  // the oracle's max_batch_tokens, when a row was beyond it
  // Parallel to Recording::steps: why rows of a step that ran could not be checked ("the oracle
  // ForwardFull failed: ..."); empty for every other step.
  std::vector<std::string> failures;
  // Why no row was checked: the recording's own backend stopped answering (Recording::hung_at),
  // so the pass did not call it; the rows are compared across backends only. Else empty.
  std::string not_run;
  // The oracle outlasted its time-out (EngineHungError): the histories after it were not run.
  bool hung = false;

  // What failed step i: the replay's error, else the oracle's; nullopt when neither did.
  std::optional<std::string> StepError(const Recording& recording, size_t i) const;
  // The first step that failed in the replay or in this check, if any.
  std::optional<size_t> FirstError(const Recording& recording) const;
};

// The gate of a row at a position; a run's own oracle pass uses the run's tolerance throughout.
using GateAt = std::function<Tolerance(int64_t position)>;

// ForwardFull is causal (row p depends on tokens 0..p only), so one ForwardFull over a history
// checks every recorded row of it. It runs once per history, not once per step, so a case costs
// O(length) oracle tokens. `oracle` is the recording's own backend for a run; conform holds an
// engine to another one. An oracle that outlasts its time-out (EngineHungError) is called no more:
// the histories after it fail with that error.
OracleCheck CheckAgainstOracle(const Recording& recording, const Backend& oracle,
                               const Tolerance& tolerance);
OracleCheck CheckAgainstOracle(const Recording& recording, const Backend& oracle,
                               const GateAt& gate);

}  // namespace kvdiff::harness
