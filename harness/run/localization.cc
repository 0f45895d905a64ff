#include "harness/run/localization.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <utility>

#include "harness/compare/compare.h"
#include "harness/run/differential_run.h"

namespace kvdiff::harness {
namespace {

// max |a - b| of row ra of a and row rb of b; NaN when the rows do not exist or differ in width.
double MaxAbs(const RowMatrix& a, int64_t ra, const RowMatrix& b, int64_t rb) {
  if (ra >= a.rows() || rb >= b.rows() || a.cols() != b.cols()) {
    return std::numeric_limits<double>::quiet_NaN();
  }
  return MaxAbsDiff(a.row(ra).data(), b.row(rb).data(), a.cols());
}

Localization Unlocalized(std::string note) {
  Localization loc;
  loc.note = std::move(note);
  return loc;
}

// A row of one path's layer trace.
struct TracedRow {
  const ForwardTrace* trace = nullptr;
  int64_t row = 0;  // into each LayerTrace matrix
};

// A column of the map: the same row of the step on both paths.
struct TracedColumn {
  LocalizedRow where;
  TracedRow a, b;
};

// Every layer's hidden states compared at every column; `divergent` is the first divergence's.
Localization CompareTraces(const std::vector<TracedColumn>& columns, size_t divergent,
                           double tolerance, const std::string& a_name, const std::string& b_name) {
  const ForwardTrace& da = *columns[divergent].a.trace;
  const ForwardTrace& db = *columns[divergent].b.trace;
  if (da.layers.empty() || db.layers.empty()) {
    return Unlocalized(
        fmt::format("no layer trace recorded by {}", da.layers.empty() ? a_name : b_name));
  }
  Localization loc;
  loc.divergent_column = divergent;
  for (const TracedColumn& c : columns) loc.columns.push_back(c.where);
  // max |a - b| of one block's output at layer l, column c; NaN where a trace lacks the layer.
  const auto diff = [&](size_t l, const TracedColumn& c, RowMatrix LayerTrace::*block) {
    if (l >= c.a.trace->layers.size() || l >= c.b.trace->layers.size()) {
      return std::numeric_limits<double>::quiet_NaN();
    }
    return MaxAbs(c.a.trace->layers[l].*block, c.a.row, c.b.trace->layers[l].*block, c.b.row);
  };
  const size_t n = std::min(da.layers.size(), db.layers.size());
  for (size_t l = 0; l < n; ++l) {
    std::vector<double>& attn = loc.attention_map.emplace_back();
    std::vector<double>& mlp = loc.mlp_map.emplace_back();
    for (const TracedColumn& c : columns) {
      attn.push_back(diff(l, c, &LayerTrace::after_attention));
      mlp.push_back(diff(l, c, &LayerTrace::after_mlp));
    }
    loc.attention_diffs.push_back(attn[divergent]);
    loc.mlp_diffs.push_back(mlp[divergent]);
    if (!loc.found && !(attn[divergent] <= tolerance)) {
      loc.found = true;
      loc.layer = static_cast<int64_t>(l);
      loc.block = "attention";
    } else if (!loc.found && !(mlp[divergent] <= tolerance)) {
      loc.found = true;
      loc.layer = static_cast<int64_t>(l);
      loc.block = "mlp";
    }
  }
  if (!loc.found) {
    loc.note =
        "every layer's hidden state is within tolerance: the difference arises in the "
        "final norm or lm_head";
  }
  // Where it starts: the earliest column with a block beyond the tolerance, and its first block.
  for (size_t c = 0; c < columns.size() && !loc.first_cell; ++c) {
    for (size_t l = 0; l < n && !loc.first_cell; ++l) {
      if (!(loc.attention_map[l][c] <= tolerance)) {
        loc.first_cell = LocalizedCell{static_cast<int64_t>(l), "attention", c};
      } else if (!(loc.mlp_map[l][c] <= tolerance)) {
        loc.first_cell = LocalizedCell{static_cast<int64_t>(l), "mlp", c};
      }
    }
  }
  return loc;
}

// The row of a recording's step with this index within the step, or nullptr.
const RecordedRow* RowOf(const Recording& rec, int64_t step, int64_t row) {
  const StepRecord& sr = rec.steps[step];
  for (size_t k = sr.rows_begin; k < sr.rows_end; ++k)
    if (rec.rows[k].row == row) return &rec.rows[k];
  return nullptr;
}

// The trace of the call that made `row`, or nullptr when the replay did not trace it.
const ForwardTrace* TraceOf(const TraceRequest& request, const RecordedRow& row) {
  auto it = request.traces.find(row.call);
  return it == request.traces.end() ? nullptr : &it->second;
}

}  // namespace

Localization Localize(const Scenario& sc, const Divergence& div, double tolerance,
                      const std::vector<const Backend*>& backends,
                      const std::vector<Recording>& recs) {
  const std::string not_replayed = "could not replay the divergent call";
  try {
    const Recording& rec_a = recs[div.a_index];
    const StepRecord& step = rec_a.steps[div.step];
    const RecordedRow* ra = RowOf(rec_a, div.step, div.row.row);
    if (!ra) return Unlocalized(not_replayed);
    if (sc.steps[div.step].op == Op::kBatch) {
      return Unlocalized("not localized: a batch step's call records no layer trace");
    }
    TraceRequest ta{div.step, {}};
    Replay(sc, *backends[div.a_index], &ta);
    if (!TraceOf(ta, *ra)) return Unlocalized(not_replayed);
    std::vector<TracedColumn> columns;
    std::optional<size_t> divergent;
    ForwardTrace full;              // kOracle: ForwardFull's, (last + 1, hidden) a layer
    TraceRequest tb{div.step, {}};  // kCross: b's calls
    if (div.kind == PathKind::kOracle) {
      // One ForwardFull over the history up to the step's last row is the oracle of every row of
      // the step on that history (row p of a causal forward depends on tokens 0..p only).
      int64_t last = ra->position;
      for (size_t k = step.rows_begin; k < step.rows_end; ++k)
        if (rec_a.rows[k].history == ra->history) last = std::max(last, rec_a.rows[k].position);
      const Tokens& history = rec_a.histories[ra->history];
      backends[div.a_index]->ForwardFull(Tokens(history.begin(), history.begin() + last + 1),
                                         &full);
      for (size_t k = step.rows_begin; k < step.rows_end; ++k) {
        const RecordedRow& r = rec_a.rows[k];
        const ForwardTrace* trace = TraceOf(ta, r);
        if (r.history != ra->history || !trace) continue;
        if (&r == ra) divergent = columns.size();
        columns.push_back(
            {{r.row, r.conversation, r.position}, {trace, r.row_in_call}, {&full, r.position}});
      }
    } else {
      Replay(sc, *backends[div.b_index], &tb);
      const Recording& rec_b = recs[div.b_index];
      for (size_t k = step.rows_begin; k < step.rows_end; ++k) {
        const RecordedRow& r = rec_a.rows[k];
        const RecordedRow* rb = RowOf(rec_b, div.step, r.row);
        const ForwardTrace* trace_a = TraceOf(ta, r);
        const ForwardTrace* trace_b = rb ? TraceOf(tb, *rb) : nullptr;
        // Only rows fed the same tokens on both paths are compared, as their logits are.
        if (!trace_a || !trace_b || !rec_a.SameHistory(r, rec_b, *rb)) continue;
        if (&r == ra) divergent = columns.size();
        columns.push_back({{r.row, r.conversation, r.position},
                           {trace_a, r.row_in_call},
                           {trace_b, rb->row_in_call}});
      }
    }
    if (!divergent) return Unlocalized(not_replayed);
    return CompareTraces(columns, *divergent, tolerance, div.a, div.b);
  } catch (const std::exception& e) {
    return Unlocalized(fmt::format("localization failed: {}", e.what()));
  }
}

}  // namespace kvdiff::harness
