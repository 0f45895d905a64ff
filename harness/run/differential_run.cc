#include "harness/run/differential_run.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <utility>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "format/chat_template.h"
#include "format/error.h"
#include "format/sanitizer_runtime.h"
#include "format/tokenizer.h"
#include "format/tokenizer_json.h"
#include "harness/backend/registry.h"
#include "harness/compare/tolerance_profile.h"
#include "harness/replay/drivers.h"
#include "harness/replay/oracle_check.h"
#include "harness/scenario/conversations.h"

namespace kvdiff::harness {
namespace {

// Gives the pages of freed blocks back to the system (glibc keeps them for its next allocation).
// A replay frees its sessions' caches and an oracle pass its ForwardFull's logits (200 MB for a
// 1024-token history on smollm2-135m) while the recordings stay: without this, what the next
// phase or the other job allocates comes on top of what this one no longer uses.
// Not under a sanitizer's allocator: glibc's malloc_trim has nothing of ours to trim then, and its
// first call initializes glibc's unused arenas, which two jobs calling it at once raced on (ASan
// build, CI: SEGV in mtrim).
void ReleaseFreedMemory() {
#if defined(__GLIBC__) && !defined(KVDIFF_SANITIZER_RUNTIME)
  malloc_trim(0);
#endif
}

ComparedRow ToCompared(const RecordedRow& rec, const RowComparison& cmp) {
  return ComparedRow{rec.row, rec.conversation, rec.position, rec.token, cmp, rec.rope_reach};
}

// Rows appended after a shift: the kept keys were computed with the dropped tokens in view, so
// no uncached forward of the shifted history is their oracle.
constexpr const char* kAfterShiftNote = "after shift: no uncached oracle, compared across backends";

// Rows whose history is longer than the backend takes in one call: its ForwardFull would be
// refused.
std::string BeyondCallNote(int64_t max_call_tokens) {
  return fmt::format(
      "beyond max_batch_tokens {}: no uncached forward in one call, compared across backends",
      max_call_tokens);
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
  int64_t after_shift = 0;  // rows no uncached forward is the oracle of
  int64_t beyond_call = 0;  // rows whose uncached forward is more than the backend takes at once
  for (size_t k = sr.rows_begin; k < sr.rows_end; ++k) {
    after_shift += rec.rows[k].after_shift ? 1 : 0;
    beyond_call += oracle.beyond_call.empty() || !oracle.beyond_call[k] ? 0 : 1;
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
  } else if (!oracle.not_run.empty() && sr.rows_end > sr.rows_begin) {
    o.status = PathStatus::kSkipped;
    o.message = oracle.not_run;
  } else if ((after_shift > 0 || beyond_call > 0) && o.rows.empty()) {
    o.status = PathStatus::kSkipped;
    o.message = after_shift > 0 ? kAfterShiftNote : BeyondCallNote(oracle.max_call_tokens);
  } else {
    o.status = sr.rows_end == sr.rows_begin ? PathStatus::kNoRows
               : all_within                 ? PathStatus::kPass
                                            : PathStatus::kFail;
    if (after_shift > 0) o.message = fmt::format("{} rows {}", after_shift, kAfterShiftNote);
    if (beyond_call > 0)
      o.message = fmt::format("{} rows {}", beyond_call, BeyondCallNote(oracle.max_call_tokens));
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
                                        gate.Across(bx.Info(), by.Info(), row.rope_reach));
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

// Frees the logits of step `step`'s rows: nothing reads them once their comparisons are made.
void ReleaseLogits(Recording& rec, size_t step) {
  const StepRecord& sr = rec.steps[step];
  for (size_t k = sr.rows_begin; k < sr.rows_end; ++k) {
    std::vector<float>().swap(rec.rows[k].logits);
  }
}

// What the gate of a compared row was made of (see WorstRow::gate_basis).
std::string GateBasis(const ComparedRow& r, const PathOutcome& o, const Gate& gate,
                      const std::vector<const Backend*>& backends) {
  const RowComparison& c = r.cmp;
  if (gate.rel > 0 && c.gate > gate.abs) {
    return fmt::format("{} x max |logit| {}", FormatDiff(gate.rel), FormatDiff(c.scale));
  }
  if (o.kind == PathKind::kCross && gate.rope_f32_per_position > 0 &&
      gate.Across(backends[o.a_index]->Info(), backends[o.b_index]->Info(), r.rope_reach).abs >
          gate.abs) {
    return fmt::format("tolerance {} + rope-f32 allowance {} x {}{}", FormatDiff(gate.abs),
                       FormatDiff(gate.rope_f32_per_position), r.rope_reach,
                       r.rope_reach > r.position ? " (the reach of keys a shift moved)" : "");
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

Replayed ReplayAndCompare(const Scenario& sc, const std::vector<const Backend*>& backends,
                          const RunOptions& options) {
  KVDIFF_CHECK(!backends.empty(), "ReplayAndCompare: no backend to run");
  const size_t n = backends.size();
  Replayed out;
  out.recs.resize(n);
  out.oracles.resize(n);
  using Work = std::function<void(size_t, const Backend&)>;
  const auto run = [&](const std::vector<size_t>& which, const Work& work) {
    if (options.for_each_backend) return options.for_each_backend(which, work);
    for (size_t b : which) work(b, *backends[b]);
  };
  const Work oracle = [&](size_t b, const Backend& backend) {
    out.oracles[b] = CheckAgainstOracle(out.recs[b], backend, sc.gate.Own());
    ReleaseFreedMemory();
  };
  std::atomic<bool> previous_checked{false};  // the oracle pass of b - 1, in the round of b
  const Work replay = [&](size_t b, const Backend& backend) {
    size_t released = 0;  // the steps whose rows of the earlier backends are freed
    const AfterStep compare = [&](const Recording& so_far, size_t step) {
      for (size_t x = 0; x < b; ++x) {
        PathOutcome o =
            CrossOutcome(*backends[x], out.recs[x], *backends[b], so_far, step, sc.gate);
        o.a_index = x;
        o.b_index = b;
        out.cross[{x, b}].push_back(std::move(o));
      }
      if (b + 1 < n || !previous_checked.load()) return;
      for (; released <= step; ++released) {
        for (size_t x = 0; x < b; ++x) ReleaseLogits(out.recs[x], released);
      }
    };
    out.recs[b] = Replay(sc, backend, nullptr, compare);
    ReleaseFreedMemory();
  };
  run({0}, replay);
  for (size_t b = 1; b < n; ++b) {
    previous_checked = false;
    run({b - 1, b}, [&](size_t k, const Backend& backend) {
      if (k == b) return replay(k, backend);
      oracle(k, backend);
      previous_checked = true;
    });
  }
  // What the last replay left: rows of steps recorded before its round's oracle pass was done.
  for (size_t x = 0; x + 1 < n; ++x) {
    for (size_t i = 0; i < out.recs[x].steps.size(); ++i) ReleaseLogits(out.recs[x], i);
  }
  ReleaseFreedMemory();
  run({n - 1}, oracle);
  return out;
}

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
  // What a backend cannot hold is bad input, refused before any backend runs a step; so is a
  // cache that fits each backend but not all of them together.
  int64_t cache_value_bytes = 0;
  for (const Backend* b : backends) {
    ValidateScenarioFor(sc, b->Info());
    cache_value_bytes += b->Info().dtype == "float64" ? 8 : 4;
  }
  if (cache_value_bytes > 4) ValidateCacheFits(sc, backends[0]->config(), cache_value_bytes);
  RunReport report;
  report.scenario = sc.name;
  report.model_source = sc.model.Describe();
  report.config = backends[0]->config();
  report.model_description = DescribeModel(report.config);
  report.gate = sc.gate;
  report.driver = sc.driver;
  for (const Backend* b : backends) report.backends.push_back(b->Name());

  std::vector<bool> profiled;  // held to a tolerance profile: its paths' distributions are reported
  for (const Backend* b : backends) profiled.push_back(ProfileFor(b->Info()) != nullptr);
  Replayed replayed = ReplayAndCompare(sc, backends, options);
  const std::vector<Recording>& recs = replayed.recs;
  const std::vector<OracleCheck>& oracles = replayed.oracles;
  for (size_t b = 0; b < backends.size(); ++b) {
    if (recs[b].hung_at || oracles[b].hung) report.hung_backends.push_back(backends[b]->Name());
  }
  for (const Step& s : sc.steps) {
    if (s.op != Op::kShift || s.discard == 0) continue;
    report.notes.push_back(fmt::format(
        "rows appended after a shift have no uncached oracle (the kept keys were computed with "
        "the dropped tokens in view): they are compared across backends only{}",
        backends.size() < 2 ? "; with one backend, they are not compared at all (add ref64, the "
                              "arbiter)"
                            : ""));
    break;
  }
  for (size_t b = 0; b < backends.size(); ++b) {
    if (oracles[b].max_call_tokens == 0) continue;
    report.notes.push_back(fmt::format(
        "{} takes at most {} tokens a call (max_batch_tokens): rows of longer histories have no "
        "uncached forward of its own and are compared across backends only{}",
        backends[b]->Name(), oracles[b].max_call_tokens,
        backends.size() < 2 ? "; with one backend, they are not compared at all" : ""));
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
        step_report.outcomes.push_back(std::move(replayed.cross[{x, y}][i]));
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
