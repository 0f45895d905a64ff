#include "harness/run/differential_run.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>

#include "format/chat_template.h"
#include "format/error.h"
#include "format/tokenizer.h"
#include "format/tokenizer_json.h"
#include "harness/backend/registry.h"
#include "harness/compare/tolerance_profile.h"
#include "harness/replay/drivers.h"
#include "harness/replay/oracle_check.h"
#include "harness/scenario/conversations.h"

namespace kvdiff::harness {
namespace {

ComparedRow ToCompared(const RecordedRow& rec, const RowComparison& cmp) {
  return ComparedRow{rec.row, rec.conversation, rec.position, rec.token, cmp};
}

// max |a - b| of row ra of a and row rb of b; NaN when the rows do not exist or differ in width.
double MaxAbs(const RowMatrix& a, int64_t ra, const RowMatrix& b, int64_t rb) {
  if (ra >= a.rows() || rb >= b.rows() || a.cols() != b.cols()) {
    return std::numeric_limits<double>::quiet_NaN();
  }
  return MaxAbsDiff(a.row(ra).data(), b.row(rb).data(), a.cols());
}

// Layer-by-layer comparison of two traces of the same position (rows ra and rb).
Localization CompareTraces(const ForwardTrace& a, int64_t ra, const ForwardTrace& b, int64_t rb,
                           double tolerance, const std::string& a_name, const std::string& b_name) {
  Localization loc;
  if (a.layers.empty() || b.layers.empty()) {
    loc.note = fmt::format("no layer trace recorded by {}", a.layers.empty() ? a_name : b_name);
    return loc;
  }
  const size_t n = std::min(a.layers.size(), b.layers.size());
  for (size_t l = 0; l < n; ++l) {
    const double d_attn = MaxAbs(a.layers[l].after_attention, ra, b.layers[l].after_attention, rb);
    const double d_mlp = MaxAbs(a.layers[l].after_mlp, ra, b.layers[l].after_mlp, rb);
    loc.attention_diffs.push_back(d_attn);
    loc.mlp_diffs.push_back(d_mlp);
    if (!loc.found && !(d_attn <= tolerance)) {
      loc.found = true;
      loc.layer = static_cast<int64_t>(l);
      loc.block = "attention";
    } else if (!loc.found && !(d_mlp <= tolerance)) {
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
  return loc;
}

// Replays the backend with a trace on the forward call that produced `row`.
const RecordedRow* TraceCall(const Scenario& sc, const Backend& backend, const Recording& rec,
                             int64_t step, int64_t row, TraceRequest& request) {
  const StepRecord& sr = rec.steps[step];
  for (size_t k = sr.rows_begin; k < sr.rows_end; ++k) {
    if (rec.rows[k].row != row) continue;
    request.step = step;
    request.call = rec.rows[k].call;
    Replay(sc, backend, &request);
    return request.hit ? &rec.rows[k] : nullptr;
  }
  return nullptr;
}

Localization Localize(const Scenario& sc, const Divergence& div, double tolerance,
                      const std::vector<const Backend*>& backends,
                      const std::vector<Recording>& recs) {
  const Localization not_replayed{false, -1, "", "could not replay the divergent call", {}, {}};
  try {
    TraceRequest ta;
    const RecordedRow* ra =
        TraceCall(sc, *backends[div.a_index], recs[div.a_index], div.step, div.row.row, ta);
    if (!ra) return not_replayed;
    if (div.kind == PathKind::kOracle) {
      ForwardTrace full;
      const Tokens& history = recs[div.a_index].histories[ra->history];
      const Tokens prefix(history.begin(), history.begin() + ra->position + 1);
      backends[div.a_index]->ForwardFull(prefix, &full);
      return CompareTraces(ta.trace, ra->row_in_call, full, ra->position, tolerance, div.a, div.b);
    }
    TraceRequest tb;
    const RecordedRow* rb =
        TraceCall(sc, *backends[div.b_index], recs[div.b_index], div.step, div.row.row, tb);
    if (!rb) return not_replayed;
    return CompareTraces(ta.trace, ra->row_in_call, tb.trace, rb->row_in_call, tolerance, div.a,
                         div.b);
  } catch (const std::exception& e) {
    return Localization{false, -1, "", fmt::format("localization failed: {}", e.what()), {}, {}};
  }
}

// A step's column for one backend against its own ForwardFull.
PathOutcome OracleOutcome(const Backend& backend, const Recording& rec, const OracleCheck& oracle,
                          size_t step) {
  const StepRecord& sr = rec.steps[step];
  PathOutcome o;
  o.path = backend.Name();
  o.kind = PathKind::kOracle;
  o.a = o.path;
  o.b = o.path + " ForwardFull";
  o.message = sr.message;
  bool all_within = true;
  for (size_t k = sr.rows_begin; k < sr.rows_end; ++k) {
    if (!oracle.rows[k]) continue;
    o.rows.push_back(ToCompared(rec.rows[k], *oracle.rows[k]));
    o.max_abs_diff = std::max(o.max_abs_diff, oracle.rows[k]->max_abs_diff);
    all_within = all_within && oracle.rows[k]->within_tolerance;
  }
  if (const std::optional<std::string> error = oracle.StepError(rec, step)) {
    o.status = PathStatus::kError;
    o.message = *error;
  } else if (sr.status == StepStatus::kSkipped) {
    o.status = PathStatus::kSkipped;
  } else {
    o.status = sr.rows_end == sr.rows_begin ? PathStatus::kNoRows
               : all_within                 ? PathStatus::kPass
                                            : PathStatus::kFail;
  }
  return o;
}

// A step's column for two backends, row by row, where both saw the same history.
PathOutcome CrossOutcome(const Backend& bx, const Recording& rx, const Backend& by,
                         const Recording& ry, size_t step, const Gate& gate) {
  const StepRecord& sx = rx.steps[step];
  const StepRecord& sy = ry.steps[step];
  PathOutcome o;
  o.a = bx.Name();
  o.b = by.Name();
  o.path = o.a + "~" + o.b;
  o.kind = PathKind::kCross;
  std::map<int64_t, const RecordedRow*> ys;
  for (size_t k = sy.rows_begin; k < sy.rows_end; ++k) ys[ry.rows[k].row] = &ry.rows[k];
  const bool any_row = sx.rows_end > sx.rows_begin || sy.rows_end > sy.rows_begin;
  bool all_within = true;
  for (size_t k = sx.rows_begin; k < sx.rows_end; ++k) {
    const RecordedRow& row = rx.rows[k];
    auto it = ys.find(row.row);
    if (it == ys.end() || !rx.SameHistory(row, ry, *it->second)) continue;
    const RowComparison c = CompareRows(row.logits.data(), it->second->logits.data(),
                                        static_cast<int64_t>(row.logits.size()),
                                        gate.Across(bx.Info(), by.Info(), row.position));
    o.rows.push_back(ToCompared(row, c));
    o.max_abs_diff = std::max(o.max_abs_diff, c.max_abs_diff);
    all_within = all_within && c.within_tolerance;
  }
  // Rows only one backend produced (the other threw) count as not compared too.
  o.rows_not_compared =
      static_cast<int64_t>(std::max(sx.rows_end - sx.rows_begin, sy.rows_end - sy.rows_begin)) -
      static_cast<int64_t>(o.rows.size());
  if (!o.rows.empty()) {
    o.status = all_within ? PathStatus::kPass : PathStatus::kFail;
    if (o.rows_not_compared > 0) {
      o.message =
          fmt::format("{} rows not compared: different token histories", o.rows_not_compared);
    }
  } else if (any_row) {
    o.status = PathStatus::kSkipped;
    o.message = o.rows_not_compared > 0 ? "not compared: the backends' token histories differ"
                                        : "not compared: a backend produced no rows";
  } else {
    o.status = PathStatus::kNoRows;
  }
  return o;
}

// What the gate of a compared row was made of (see WorstRow::gate_basis).
std::string GateBasis(const ComparedRow& r, const PathOutcome& o, const Gate& gate,
                      const std::vector<const Backend*>& backends) {
  const RowComparison& c = r.cmp;
  if (gate.rel > 0 && c.gate > gate.abs) {
    return fmt::format("{} x max |logit| {}", FormatDiff(gate.rel), FormatDiff(c.scale));
  }
  if (o.kind == PathKind::kCross && gate.rope_f32_per_position > 0 &&
      gate.Across(backends[o.a_index]->Info(), backends[o.b_index]->Info(), r.position).abs >
          gate.abs) {
    return fmt::format("tolerance {} + rope-f32 allowance {} x {}", FormatDiff(gate.abs),
                       FormatDiff(gate.rope_f32_per_position), r.position);
  }
  return "tolerance";
}

WorstRow WorstRowOf(const ComparedRow& r, const PathOutcome& o, int64_t step, const Gate& gate,
                    const std::vector<const Backend*>& backends) {
  WorstRow w;
  w.diff = r.cmp.max_abs_diff;
  w.gate = r.cmp.gate;
  w.gate_basis = GateBasis(r, o, gate, backends);
  w.path = o.path;
  w.step = step;
  w.conversation = r.conversation;
  w.position = r.position;
  w.within = r.cmp.within_tolerance;
  return w;
}

// The tokens of step i's text or chat prompt, encoded with the model's tokenizer (loaded into
// `tokenizer` at the first prompt): with BOS when the prompt starts its conversation (as llama2.c
// starts a prompt), without it when the text continues one.
Tokens EncodePrompt(const Scenario& scenario, size_t i, bool starts_conversation,
                    const format::ModelWeights& weights,
                    std::optional<format::Tokenizer>& tokenizer) {
  const Step& s = scenario.steps[i];
  const char* field = s.text ? "text" : "messages";
  if (!tokenizer) {
    KVDIFF_CHECK(!scenario.model.preset && !scenario.model.config,
                 "steps[{}].{}: text prompts need a tokenizer, and a {} model has "
                 "none; give \"tokens\" or a model directory with {} or {}",
                 i, field, scenario.model.preset ? "preset" : "random (inline config)",
                 format::kHfTokenizerFileName, format::kTokenizerFileName);
    tokenizer = LoadTokenizerFor(scenario.model, weights.config.vocab_size);
    KVDIFF_CHECK(!scenario.model.llama2c || tokenizer,
                 "steps[{}].{}: text prompts need a tokenizer; add \"tokenizer\": "
                 "\"FILE.bin\" to model.llama2c, or give \"tokens\" instead",
                 i, field);
    KVDIFF_CHECK(tokenizer,
                 "steps[{}].{}: the model directory {} has no tokenizer ({} or {}); "
                 "give \"tokens\" instead",
                 i, field, scenario.model.path ? scenario.model.path->string() : "?",
                 format::kHfTokenizerFileName, format::kTokenizerFileName);
  }
  Tokens tokens;
  if (s.text) {
    tokens = tokenizer->Encode(*s.text, starts_conversation);
  } else {
    // The template writes BOS itself (apply_chat_template(add_generation_prompt=True)).
    KVDIFF_CHECK(scenario.model.path.has_value(),
                 "steps[{}].messages: chat messages need a model directory with a chat "
                 "template (tokenizer_config.json); give \"text\" or \"tokens\" instead",
                 i);
    tokens = format::EncodeChat(*scenario.model.path, *tokenizer, *s.messages,
                                /*add_generation_prompt=*/true);
  }
  KVDIFF_CHECK(!tokens.empty(), "steps[{}].{}: encodes to no tokens", i, field);
  return tokens;
}

}  // namespace

std::string PathKindName(PathKind kind) { return kind == PathKind::kOracle ? "oracle" : "cross"; }

std::string PathStatusName(PathStatus status) {
  switch (status) {
    case PathStatus::kPass:
      return "pass";
    case PathStatus::kFail:
      return "FAIL";
    case PathStatus::kError:
      return "ERROR";
    case PathStatus::kSkipped:
      return "skip";
    case PathStatus::kNoRows:
      return "-";
  }
  return "?";
}

bool StepReport::Passed() const {
  for (const auto& o : outcomes)
    if (o.status == PathStatus::kFail || o.status == PathStatus::kError) return false;
  return true;
}

double StepReport::MaxAbsDiff() const {
  double m = 0;
  for (const auto& o : outcomes) m = std::max(m, o.max_abs_diff);
  return m;
}

std::vector<std::string> PlanBackends(const std::vector<std::string>& requested,
                                      const Scenario& scenario, std::vector<std::string>* notes) {
  const bool explicit_list = !requested.empty() || !scenario.backends.empty();
  const std::vector<std::string> names = !requested.empty()           ? requested
                                         : !scenario.backends.empty() ? scenario.backends
                                                                      : DefaultBackends();
  std::vector<std::string> out;
  for (const std::string& name : names) {
    const std::string why =
        DriverNotApplicable(scenario.driver, BackendRegistry::Global().Info(name));
    if (why.empty()) {
      out.push_back(name);
    } else if (explicit_list) {
      throw InputError(fmt::format("backends: {} (leave \"{}\" out of the backends)", why, name));
    } else if (notes) {
      notes->push_back(fmt::format("backend {} left out: {}", name, why));
    }
  }
  KVDIFF_CHECK(!out.empty(), "backends: none of {} can run driver \"{}\"", fmt::join(names, ","),
               DriverName(scenario.driver));
  return out;
}

void PrepareScenario(Scenario& scenario, const format::ModelWeights& weights) {
  std::optional<format::Tokenizer> tokenizer;  // loaded at the first text prompt
  Conversations convs;
  for (size_t i = 0; i < scenario.steps.size(); ++i) {
    Step& s = scenario.steps[i];
    if (s.op == Op::kPrefill && (s.text || s.messages) && s.tokens.empty()) {
      // A conversation not created yet is refused by the validation below, after every prompt.
      const bool starts_conversation =
          !convs.Exists(s.conversation) || convs.At(s.conversation).length == 0;
      s.tokens = EncodePrompt(scenario, i, starts_conversation, weights, tokenizer);
    }
    convs.Apply(s);
  }
  ValidateScenario(scenario, weights.config);
}

RunReport RunScenario(const Scenario& sc, const std::vector<const Backend*>& backends,
                      const RunOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  KVDIFF_CHECK(!backends.empty(), "RunScenario: no backend to run");
  // What a backend cannot hold is bad input, refused before any backend runs a step.
  for (const Backend* b : backends) ValidateScenarioFor(sc, b->Info());
  RunReport report;
  report.scenario = sc.name;
  report.model_source = sc.model.Describe();
  report.config = backends[0]->config();
  report.model_description = DescribeModel(report.config);
  report.gate = sc.gate;
  report.driver = sc.driver;
  for (const Backend* b : backends) report.backends.push_back(b->Name());

  std::vector<bool> profiled;  // held to a tolerance profile: its paths' distributions are reported
  for (const Backend* b : backends)
    profiled.push_back(ProfileFor(b->Info().cache_dtype) != nullptr);
  std::vector<Recording> recs;
  std::vector<OracleCheck> oracles;  // each backend's rows against its own ForwardFull
  for (const Backend* b : backends) {
    recs.push_back(Replay(sc, *b));
    oracles.push_back(CheckAgainstOracle(recs.back(), *b, sc.gate.Own()));
  }
  for (size_t i = 0; i < sc.steps.size(); ++i) {
    StepReport step_report;
    step_report.index = static_cast<int64_t>(i);
    step_report.step = sc.steps[i];
    for (size_t b = 0; b < backends.size(); ++b) {
      step_report.outcomes.push_back(OracleOutcome(*backends[b], recs[b], oracles[b], i));
      step_report.outcomes.back().a_index = step_report.outcomes.back().b_index = b;
    }
    for (size_t x = 0; x < backends.size(); ++x) {
      for (size_t y = x + 1; y < backends.size(); ++y) {
        step_report.outcomes.push_back(
            CrossOutcome(*backends[x], recs[x], *backends[y], recs[y], i, sc.gate));
        step_report.outcomes.back().a_index = x;
        step_report.outcomes.back().b_index = y;
      }
    }
    for (const PathOutcome& o : step_report.outcomes) {
      if (profiled[o.a_index] || profiled[o.b_index]) {
        DistributionStats& stats = report.distributions[o.path];
        for (const ComparedRow& r : o.rows) stats.Add(r.cmp);
      }
      for (const ComparedRow& r : o.rows) {
        ++report.rows_compared;
        if (!(r.cmp.max_abs_diff <= report.worst_diff) || !report.worst.Found()) {
          report.worst_diff = r.cmp.max_abs_diff;
          report.worst = WorstRowOf(r, o, step_report.index, sc.gate, backends);
        }
        const double rel = r.cmp.relative_diff();
        if (!(rel <= report.worst_relative_diff)) report.worst_relative_diff = rel;
      }
    }
    // The first divergence: the earliest row of the earliest failing step.
    if (!report.first_divergence) {
      for (const PathOutcome& o : step_report.outcomes) {
        for (const ComparedRow& r : o.rows) {
          if (r.cmp.within_tolerance) continue;
          if (!report.first_divergence || r.row < report.first_divergence->row.row) {
            report.first_divergence = Divergence{step_report.index,
                                                 sc.steps[i].op,
                                                 sc.steps[i].ParamString(),
                                                 o.kind,
                                                 o.path,
                                                 o.a,
                                                 o.b,
                                                 o.a_index,
                                                 o.b_index,
                                                 r};
          }
          break;
        }
      }
    }
    if (!report.first_error) {
      for (size_t b = 0; b < backends.size(); ++b) {
        const std::optional<std::string> error = oracles[b].StepError(recs[b], i);
        if (!error) continue;
        report.first_error = BackendFailure{step_report.index, sc.steps[i].ParamString(),
                                            backends[b]->Name(), sc.steps[i].conversation, *error};
        break;
      }
    }
    report.steps.push_back(std::move(step_report));
  }
  if (options.localize && report.first_divergence) {
    report.localization = Localize(sc, *report.first_divergence, sc.gate.abs, backends, recs);
  }
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

}  // namespace kvdiff::harness
