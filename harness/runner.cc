#include "harness/runner.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>

#include "harness/drivers.h"
#include "format/error.h"
#include "format/llama2c.h"
#include "format/tokenizer.h"

namespace kvdiff::harness {
namespace {

// One logits row a cached path produced, with what identifies it across backends.
struct RowRecord {
  int64_t step = 0, row = 0;          // row index within the step
  int64_t call = 0, row_in_call = 0;  // which forward call of the step (for --localize)
  std::string conversation;
  int64_t position = 0;
  Token token = 0;
  uint64_t history_hash = 0;  // of the tokens at positions 0..position: rows compare across
                              // backends only when their histories are the same
  std::vector<float> logits;  // (vocab)
  RowComparison vs_oracle;
};

struct StepRun {
  PathStatus status = PathStatus::kNoRows;
  std::string message;
  size_t rows_begin = 0, rows_end = 0;  // into BackendRun::rows
};

struct BackendRun {
  std::vector<StepRun> steps;
  std::vector<RowRecord> rows;
};

// For --localize: which forward call to trace on a replay, and what it saw.
struct TraceTarget {
  int64_t step = 0, call = 0;
  ForwardTrace trace;
  Tokens history;  // the conversation's history after the call
  bool hit = false;
};

uint64_t HashTokens(const Tokens& tokens, size_t n) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (size_t i = 0; i < n; ++i) {
    h ^= static_cast<uint32_t>(tokens[i]);
    h *= 1099511628211ull;
  }
  return h;
}

void CheckLogitsShape(const Logits& logits, size_t n, int64_t vocab, const std::string& backend) {
  KVDIFF_CHECK(logits.rows() == static_cast<int64_t>(n) && logits.cols() == vocab,
               "backend {} returned logits [{}, {}] for {} tokens; expected [{}, {}]", backend,
               logits.rows(), logits.cols(), n, n, vocab);
}

// Replays the scenario on one backend through the scenario's driver. A thrown error ends that
// conversation (later steps on it, and forks of it, are skipped); the others go on.
BackendRun RunBackend(const Scenario& sc, const Backend& backend,
                      std::shared_ptr<const format::ModelWeights> weights, int threads,
                      double tolerance, TraceTarget* target) {
  struct Conv {
    Tokens history;  // the correct history: every token this path was fed, in order
    std::vector<float> last_row;
    std::string dead;  // why the conversation stopped, empty while alive
  };
  const int64_t vocab = backend.config().vocab_size;
  BackendRun run;
  std::unique_ptr<Driver> driver = MakeDriver(sc.driver, backend, weights, threads);
  std::map<std::string, Conv> convs = {{"main", Conv{}}};

  for (size_t i = 0; i < sc.steps.size(); ++i) {
    const Step& step = sc.steps[i];
    StepRun sr;
    sr.rows_begin = run.rows.size();
    const std::string& source = step.op == Op::kFork ? step.from : step.conversation;
    if (step.op != Op::kNewConversation && !convs[source].dead.empty()) {
      sr.status = PathStatus::kSkipped;
      sr.message = convs[source].dead;
      if (step.op == Op::kFork) convs[step.to] = Conv{{}, {}, convs[source].dead};
      sr.rows_end = run.rows.size();
      run.steps.push_back(sr);
      continue;
    }
    Conv* conv = &convs[step.conversation];
    int64_t call = 0;
    // Appends tokens through the driver and records one row per token.
    auto append = [&](const Tokens& tokens) {
      ForwardTrace* trace = nullptr;
      if (target && target->step == static_cast<int64_t>(i) && target->call == call) {
        trace = &target->trace;
      }
      Logits logits = driver->Append(step.conversation, tokens, trace);
      CheckLogitsShape(logits, tokens.size(), vocab, backend.Name());
      for (size_t r = 0; r < tokens.size(); ++r) {
        conv->history.push_back(tokens[r]);
        RowRecord rec;
        rec.step = static_cast<int64_t>(i);
        rec.row = static_cast<int64_t>(run.rows.size() - sr.rows_begin);
        rec.call = call;
        rec.row_in_call = static_cast<int64_t>(r);
        rec.conversation = step.conversation;
        rec.position = static_cast<int64_t>(conv->history.size()) - 1;
        rec.token = tokens[r];
        rec.history_hash = HashTokens(conv->history, conv->history.size());
        rec.logits.assign(logits.row(r).data(), logits.row(r).data() + vocab);
        run.rows.push_back(std::move(rec));
      }
      conv->last_row = run.rows.back().logits;
      if (trace) {
        target->history = conv->history;
        target->hit = true;
      }
      ++call;
    };
    try {
      switch (step.op) {
        case Op::kNewConversation:
          driver->NewConversation(step.name);
          convs[step.name] = Conv{};
          break;
        case Op::kPrefill: {
          std::vector<int64_t> chunks = step.chunks;
          if (chunks.empty()) chunks = {static_cast<int64_t>(step.tokens.size())};
          size_t offset = 0;
          for (int64_t size : chunks) {
            append(Tokens(step.tokens.begin() + offset, step.tokens.begin() + offset + size));
            offset += size;
          }
          break;
        }
        case Op::kDecode:
          for (int64_t k = 0; k < step.n; ++k) {
            const int64_t next = Argmax(conv->last_row.data(), vocab);
            KVDIFF_CHECK(next >= 0, "decode: the previous row has no finite logit to choose");
            append({static_cast<Token>(next)});
          }
          break;
        case Op::kTruncate:
          driver->Truncate(step.conversation, step.length);
          if (static_cast<int64_t>(conv->history.size()) != step.length) conv->last_row.clear();
          conv->history.resize(step.length);
          break;
        case Op::kFork:
          driver->Fork(step.from, step.to);
          convs[step.to] = convs[step.from];
          break;
        case Op::kReset:
          driver->Reset(step.conversation);
          *conv = Conv{};
          break;
      }
      sr.status = PathStatus::kPass;
    } catch (const std::exception& e) {
      sr.status = PathStatus::kError;
      sr.message = e.what();
      conv->dead = fmt::format("conversation \"{}\" failed at step {} ({})", step.conversation, i,
                               step.ParamString());
    }
    sr.rows_end = run.rows.size();

    // The oracle: ForwardFull over the history up to the last row of this step gives every
    // row of the step at once (row p of a causal forward depends on tokens 0..p only).
    if (sr.rows_end > sr.rows_begin) {
      const int64_t last_pos = run.rows[sr.rows_end - 1].position;
      try {
        Tokens prefix(conv->history.begin(), conv->history.begin() + last_pos + 1);
        Logits full = backend.ForwardFull(prefix);
        CheckLogitsShape(full, prefix.size(), vocab, backend.Name());
        bool all_within = true;
        for (size_t k = sr.rows_begin; k < sr.rows_end; ++k) {
          RowRecord& rec = run.rows[k];
          rec.vs_oracle =
              CompareRows(rec.logits.data(), full.row(rec.position).data(), vocab, tolerance);
          all_within = all_within && rec.vs_oracle.within_tolerance;
        }
        if (sr.status == PathStatus::kPass && !all_within) sr.status = PathStatus::kFail;
      } catch (const std::exception& e) {
        sr.status = PathStatus::kError;
        sr.message = fmt::format("the oracle ForwardFull failed: {}", e.what());
        run.rows.resize(sr.rows_begin);
        sr.rows_end = sr.rows_begin;
      }
    } else if (sr.status == PathStatus::kPass) {
      sr.status = PathStatus::kNoRows;
    }
    run.steps.push_back(sr);
  }
  return run;
}

ComparedRow ToCompared(const RowRecord& rec, const RowComparison& cmp) {
  return ComparedRow{rec.row, rec.conversation, rec.position, rec.token, cmp};
}

double MaxAbs(const RowMatrix& a, int64_t ra, const RowMatrix& b, int64_t rb) {
  if (ra >= a.rows() || rb >= b.rows() || a.cols() != b.cols()) {
    return std::numeric_limits<double>::quiet_NaN();
  }
  double m = 0;
  for (int64_t c = 0; c < a.cols(); ++c) {
    const double d = std::fabs(double(a(ra, c)) - double(b(rb, c)));
    if (!(d <= m)) m = d;  // NaN wins
  }
  return m;
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

Localization Localize(const Scenario& sc, const Divergence& div,
                      const std::vector<const Backend*>& backends,
                      std::shared_ptr<const format::ModelWeights> weights, int threads,
                      const std::vector<BackendRun>& runs) {
  auto find_backend = [&](const std::string& name) -> size_t {
    for (size_t i = 0; i < backends.size(); ++i)
      if (backends[i]->Name() == name) return i;
    return backends.size();
  };
  auto find_row = [&](size_t b) -> const RowRecord* {
    const StepRun& sr = runs[b].steps[div.step];
    for (size_t k = sr.rows_begin; k < sr.rows_end; ++k)
      if (runs[b].rows[k].row == div.row.row) return &runs[b].rows[k];
    return nullptr;
  };
  // Replays backend b with a trace on the call that produced the divergent row.
  auto trace_cached = [&](size_t b, TraceTarget& target) -> const RowRecord* {
    const RowRecord* rec = find_row(b);
    if (!rec) return nullptr;
    target.step = div.step;
    target.call = rec->call;
    RunBackend(sc, *backends[b], weights, threads, sc.tolerance_abs, &target);
    return target.hit ? rec : nullptr;
  };
  try {
    const size_t ia = find_backend(div.a);
    TraceTarget ta;
    const RowRecord* ra = trace_cached(ia, ta);
    if (!ra) return Localization{false, -1, "", "could not replay the divergent call", {}, {}};
    if (div.kind == "oracle") {
      ForwardTrace full;
      Tokens prefix(ta.history.begin(), ta.history.begin() + ra->position + 1);
      backends[ia]->ForwardFull(prefix, &full);
      return CompareTraces(ta.trace, ra->row_in_call, full, ra->position, sc.tolerance_abs, div.a,
                           div.b);
    }
    const size_t ib = find_backend(div.b);
    TraceTarget tb;
    const RowRecord* rb = trace_cached(ib, tb);
    if (!rb) return Localization{false, -1, "", "could not replay the divergent call", {}, {}};
    return CompareTraces(ta.trace, ra->row_in_call, tb.trace, rb->row_in_call, sc.tolerance_abs,
                         div.a, div.b);
  } catch (const std::exception& e) {
    return Localization{false, -1, "", fmt::format("localization failed: {}", e.what()), {}, {}};
  }
}

}  // namespace

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

std::shared_ptr<const format::ModelWeights> LoadModelFor(const ModelSpec& spec) {
  if (spec.path) return std::make_shared<const format::ModelWeights>(format::LoadModel(*spec.path));
  if (spec.llama2c) {
    // Checked before reading: a missing shared-data file is the likely mistake, and it deserves
    // a message naming the field rather than the reader's "cannot open".
    KVDIFF_CHECK(std::filesystem::is_regular_file(spec.llama2c->checkpoint),
                 "model.llama2c.checkpoint: {} does not exist (the llama2.c model file, e.g. "
                 "stories260K.bin; a scenario file's relative paths are read from its folder)",
                 spec.llama2c->checkpoint.string());
    if (spec.llama2c->tokenizer) {
      KVDIFF_CHECK(std::filesystem::is_regular_file(*spec.llama2c->tokenizer),
                   "model.llama2c.tokenizer: {} does not exist (the llama2.c tokenizer file, "
                   "e.g. tok512.bin; a scenario file's relative paths are read from its folder)",
                   spec.llama2c->tokenizer->string());
    }
    return std::make_shared<const format::ModelWeights>(
        format::ReadLlama2cCheckpoint(spec.llama2c->checkpoint));
  }
  return std::make_shared<const format::ModelWeights>(
      format::MakeRandomModel(format::PresetConfig(spec.preset.value_or("")), spec.seed));
}

std::optional<format::Tokenizer> LoadTokenizerFor(const ModelSpec& spec, int64_t vocab_size) {
  if (spec.path) return format::Tokenizer::LoadFromModelDir(*spec.path);
  if (spec.llama2c && spec.llama2c->tokenizer) {
    return format::Tokenizer::ReadLlama2c(*spec.llama2c->tokenizer, vocab_size);
  }
  return std::nullopt;
}

std::string MissingModelData(const ModelSpec& spec) {
  if (spec.path) {
    if (!std::filesystem::is_regular_file(*spec.path / "config.json")) {
      return fmt::format("model data not found: {} has no config.json", spec.path->string());
    }
  } else if (spec.llama2c) {
    std::vector<std::filesystem::path> files = {spec.llama2c->checkpoint};
    if (spec.llama2c->tokenizer) files.push_back(*spec.llama2c->tokenizer);
    for (const auto& f : files) {
      if (!std::filesystem::is_regular_file(f)) {
        return fmt::format(
            "model data not found: {} (the llama2.c model is read from outside the repository; "
            "set it up to run this set)",
            f.string());
      }
    }
  }
  return "";
}

std::vector<std::filesystem::path> ModelDataFiles(const ModelSpec& spec) {
  std::vector<std::filesystem::path> files;
  if (spec.path) {
    files.push_back(*spec.path / "config.json");
    for (const auto& f : format::InspectModel(*spec.path).safetensors_files) files.push_back(f);
  } else if (spec.llama2c) {
    files.push_back(spec.llama2c->checkpoint);
    if (spec.llama2c->tokenizer) files.push_back(*spec.llama2c->tokenizer);
  }
  return files;
}

std::string DescribeModel(const format::LlamaConfig& c) {
  return fmt::format(
      "{} layers, hidden {}, {}/{} heads (head_dim {}), intermediate {}, vocab {}, {} positions{}",
      c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
      c.intermediate_size, c.vocab_size, c.max_position_embeddings,
      c.tie_word_embeddings ? ", tied head" : "");
}

std::vector<std::string> DefaultBackends() {
#ifdef KVDIFF_HAVE_TORCH
  return {"impl", "ref"};
#else
  return {"impl"};
#endif
}

std::vector<std::string> PlanBackends(const std::vector<std::string>& requested,
                                      const Scenario& scenario, std::vector<std::string>* notes) {
  const bool explicit_list = !requested.empty() || !scenario.backends.empty();
  const std::vector<std::string> names = !requested.empty()           ? requested
                                         : !scenario.backends.empty() ? scenario.backends
                                                                      : DefaultBackends();
  std::vector<std::string> out;
  for (const std::string& name : names) {
    const std::string why = DriverNotApplicable(scenario.driver, name);
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
  // Text prompts: encoded with the model directory's tokenizer, with BOS when the conversation is
  // empty at that step (as llama2.c starts a prompt), without it when the text continues one.
  std::optional<format::Tokenizer> tokenizer;
  std::map<std::string, bool> empty = {{"main", true}};
  for (size_t i = 0; i < scenario.steps.size(); ++i) {
    Step& s = scenario.steps[i];
    switch (s.op) {
      case Op::kNewConversation:
        empty[s.name] = true;
        break;
      case Op::kFork:
        empty[s.to] = empty[s.from];
        break;
      case Op::kReset:
        empty[s.conversation] = true;
        break;
      case Op::kTruncate:
        if (s.length == 0) empty[s.conversation] = true;
        break;
      case Op::kDecode:
        empty[s.conversation] = false;
        break;
      case Op::kPrefill:
        if (s.text && s.tokens.empty()) {
          if (!tokenizer) {
            KVDIFF_CHECK(!scenario.model.preset,
                         "steps[{}].text: text prompts need a tokenizer, and a preset model has "
                         "none; give \"tokens\" or a model directory with {}",
                         i, format::kTokenizerFileName);
            tokenizer = LoadTokenizerFor(scenario.model, weights.config.vocab_size);
            KVDIFF_CHECK(!scenario.model.llama2c || tokenizer,
                         "steps[{}].text: text prompts need a tokenizer; add \"tokenizer\": "
                         "\"FILE.bin\" to model.llama2c, or give \"tokens\" instead",
                         i);
            KVDIFF_CHECK(tokenizer,
                         "steps[{}].text: the model directory {} has no tokenizer ({}); "
                         "give \"tokens\" instead",
                         i, scenario.model.path ? scenario.model.path->string() : "?",
                         format::kTokenizerFileName);
          }
          s.tokens = tokenizer->Encode(*s.text,
                                       empty.count(s.conversation) ? empty[s.conversation] : true);
          KVDIFF_CHECK(!s.tokens.empty(), "steps[{}].text: encodes to no tokens", i);
        }
        empty[s.conversation] = false;
        break;
    }
  }
  ValidateScenario(scenario, weights.config);
}

RunReport RunScenario(const Scenario& sc, std::shared_ptr<const format::ModelWeights> weights,
                      const std::vector<const Backend*>& backends, const RunOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  KVDIFF_CHECK(!backends.empty(), "RunScenario: no backend to run");
  RunReport report;
  report.scenario = sc.name;
  report.model_source = sc.model.Describe();
  report.config = weights->config;
  report.model_description = DescribeModel(weights->config);
  report.tolerance = sc.tolerance_abs;
  report.driver = sc.driver;
  for (const Backend* b : backends) report.backends.push_back(b->Name());

  std::vector<BackendRun> runs;
  for (const Backend* b : backends) {
    runs.push_back(RunBackend(sc, *b, weights, options.threads, sc.tolerance_abs, nullptr));
  }
  const int64_t vocab = weights->config.vocab_size;
  auto note_diff = [&report](const RowComparison& c) {
    ++report.rows_compared;
    if (!(c.max_abs_diff <= report.worst_diff)) report.worst_diff = c.max_abs_diff;
  };

  for (size_t i = 0; i < sc.steps.size(); ++i) {
    StepReport step_report;
    step_report.index = static_cast<int64_t>(i);
    step_report.step = sc.steps[i];
    // Each backend against its own ForwardFull.
    for (size_t b = 0; b < backends.size(); ++b) {
      const StepRun& sr = runs[b].steps[i];
      PathOutcome o;
      o.path = backends[b]->Name();
      o.kind = "oracle";
      o.a = o.path;
      o.b = o.path + " ForwardFull";
      o.status = sr.status;
      o.message = sr.message;
      for (size_t k = sr.rows_begin; k < sr.rows_end; ++k) {
        const RowRecord& rec = runs[b].rows[k];
        o.rows.push_back(ToCompared(rec, rec.vs_oracle));
        o.max_abs_diff = std::max(o.max_abs_diff, rec.vs_oracle.max_abs_diff);
        note_diff(rec.vs_oracle);
      }
      step_report.outcomes.push_back(std::move(o));
    }
    // Each pair of backends, row by row, where both saw the same history.
    for (size_t x = 0; x < backends.size(); ++x) {
      for (size_t y = x + 1; y < backends.size(); ++y) {
        const StepRun& sx = runs[x].steps[i];
        const StepRun& sy = runs[y].steps[i];
        PathOutcome o;
        o.a = backends[x]->Name();
        o.b = backends[y]->Name();
        o.path = o.a + "~" + o.b;
        o.kind = "cross";
        std::map<int64_t, const RowRecord*> ys;
        for (size_t k = sy.rows_begin; k < sy.rows_end; ++k)
          ys[runs[y].rows[k].row] = &runs[y].rows[k];
        bool any_row = sx.rows_end > sx.rows_begin || sy.rows_end > sy.rows_begin;
        bool all_within = true;
        for (size_t k = sx.rows_begin; k < sx.rows_end; ++k) {
          const RowRecord& rx = runs[x].rows[k];
          auto it = ys.find(rx.row);
          if (it == ys.end() || it->second->history_hash != rx.history_hash) {
            ++o.rows_not_compared;
            continue;
          }
          const RowComparison c =
              CompareRows(rx.logits.data(), it->second->logits.data(), vocab, sc.tolerance_abs);
          o.rows.push_back(ToCompared(rx, c));
          o.max_abs_diff = std::max(o.max_abs_diff, c.max_abs_diff);
          all_within = all_within && c.within_tolerance;
          note_diff(c);
        }
        // Rows only one backend produced (the other threw) count as not compared too.
        o.rows_not_compared = static_cast<int64_t>(std::max(sx.rows_end - sx.rows_begin,
                                                            sy.rows_end - sy.rows_begin)) -
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
        step_report.outcomes.push_back(std::move(o));
      }
    }
    // The first divergence: the earliest row of the earliest failing step.
    if (!report.first_divergence) {
      for (const PathOutcome& o : step_report.outcomes) {
        for (const ComparedRow& r : o.rows) {
          if (r.cmp.within_tolerance) continue;
          if (!report.first_divergence || r.row < report.first_divergence->row.row) {
            report.first_divergence = Divergence{
                step_report.index, sc.steps[i].ParamString(), o.path, o.kind, o.a, o.b, r};
          }
          break;
        }
      }
    }
    if (!report.first_error) {
      for (size_t b = 0; b < backends.size(); ++b) {
        if (runs[b].steps[i].status == PathStatus::kError) {
          report.first_error =
              BackendFailure{step_report.index, sc.steps[i].ParamString(), backends[b]->Name(),
                             sc.steps[i].conversation, runs[b].steps[i].message};
          break;
        }
      }
    }
    report.steps.push_back(std::move(step_report));
  }
  if (options.localize && report.first_divergence) {
    report.localization =
        Localize(sc, *report.first_divergence, backends, weights, options.threads, runs);
  }
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

}  // namespace kvdiff::harness
