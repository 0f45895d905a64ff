// --localize: where in depth and in time a run's first divergence starts, by replaying the
// divergent step with a layer trace on both paths (docs/scenarios.md, "kvdiff run",
// `--localize`).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "harness/backend/backend.h"
#include "harness/replay/replay.h"
#include "harness/scenario/scenario.h"

namespace kvdiff::harness {

struct Divergence;  // harness/run/differential_run.h

// A column of the --localize map: a row of the divergent step that both paths traced.
struct LocalizedRow {
  int64_t row = 0;  // within the step
  std::string conversation;
  int64_t position = 0;  // in the conversation's history
};

// A cell of the --localize map: a layer's block at a column.
struct LocalizedCell {
  int64_t layer = -1;
  std::string block;  // "attention" or "mlp"
  size_t column = 0;  // into Localization::columns
};

// --localize: where in depth and in time the first divergence starts. The forward calls of the
// divergent step are replayed with a layer trace on both paths (the backend's own calls and its
// ForwardFull over the history, or two backends' calls), and every layer's hidden state after
// attention and after the MLP is compared, as max |a - b| against the run's absolute tolerance,
// at every row of the step both paths have.
struct Localization {
  bool found = false;  // some layer differs beyond the tolerance at the divergent row
  // At the divergent row: the first layer (and block) beyond the tolerance.
  int64_t layer = -1;
  std::string block;  // "attention" or "mlp"
  std::string note;   // when nothing was found or traces were unavailable
  std::vector<double> attention_diffs, mlp_diffs;  // per layer, at the divergent row

  // The layer x position map: [layer][column], max |a - b| of the hidden state.
  std::vector<LocalizedRow> columns;  // the step's rows both paths traced, in row order
  size_t divergent_column = 0;        // columns[divergent_column] is the first divergence's row
  std::vector<std::vector<double>> attention_map, mlp_map;
  // Where the divergence starts: the earliest column with a block beyond the tolerance, and there
  // the first such block in depth (layer by layer, attention before the MLP). Every block is within
  // the tolerance at every earlier column (a row depends on earlier rows only, so none of them
  // caused it), and so is every block below it at its own column. At the divergent column it is
  // `layer` and `block`.
  std::optional<LocalizedCell> first_cell;
};

// The map of `div` (the run's first divergence between backends[div.a_index] and its oracle, or
// backends[div.b_index]), from the recordings the run made. Never throws: what could not be
// localized is said in the note.
Localization Localize(const Scenario& sc, const Divergence& div, double tolerance,
                      const std::vector<const Backend*>& backends,
                      const std::vector<Recording>& recs);

}  // namespace kvdiff::harness
