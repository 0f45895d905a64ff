#include "harness/repro/repro.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <optional>
#include <stdexcept>

#include "format/error.h"
#include "harness/backend/registry.h"
#include "harness/compare/compare.h"
#include "harness/replay/drivers.h"
#include "harness/replay/replay.h"

namespace kvdiff::harness {
namespace {

// The document's prompts are 5 tokens each and differ in one ("France" / "Germany"); these ids
// do the same and fit every vocabulary (tiny's is 256).
const Tokens kDefaultFirstIds = {5, 17, 3, 99, 42};
const Tokens kDefaultSecondIds = {8, 17, 3, 120, 42};
constexpr const char* kDefaultFirstText = "Once upon a time, Lily";
constexpr const char* kDefaultSecondText = "The dog";

int64_t DepartsAt(const Tokens& line, const Tokens& correct) {
  const size_t n = std::min(line.size(), correct.size());
  for (size_t k = 0; k < n; ++k)
    if (line[k] != correct[k]) return static_cast<int64_t>(k) + 1;
  return line.size() == correct.size() ? 0 : static_cast<int64_t>(n) + 1;
}

Tokens CheckedIds(const Tokens& ids, const format::LlamaConfig& config, const char* option) {
  KVDIFF_CHECK(!ids.empty(), "{}: expected at least one token id", option);
  for (size_t i = 0; i < ids.size(); ++i) {
    KVDIFF_CHECK(ids[i] >= 0 && ids[i] < config.vocab_size,
                 "{}: token id {} (index {}) outside the vocabulary [0, {})", option, ids[i], i,
                 config.vocab_size);
  }
  return ids;
}

std::string Quote(const std::string& bytes) {
  std::string out = "\"";
  for (unsigned char c : bytes) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (c < 0x20 || c == 0x7f) {
          out += fmt::format("\\x{:02x}", c);
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

std::string Ids(const Tokens& tokens) { return fmt::format("[{}]", fmt::join(tokens, " ")); }

std::string VsCorrect(const ReproLine& line) {
  if (!line.error.empty()) return "error";
  if (line.departs_at == 0) return "= " + line.baseline;
  return fmt::format("departs from {} at token {}", line.baseline, line.departs_at);
}

// Pads to a display width counted in UTF-8 characters, so text columns line up.
std::string Pad(const std::string& s, size_t width) {
  size_t chars = 0;
  for (unsigned char c : s) chars += (c & 0xC0) != 0x80;
  return chars >= width ? s : s + std::string(width - chars, ' ');
}
size_t Width(const std::string& s) {
  size_t chars = 0;
  for (unsigned char c : s) chars += (c & 0xC0) != 0x80;
  return chars;
}

}  // namespace

std::vector<Experiment> AllExperiments() {
  return {Experiment::kOk,     Experiment::kPos0,      Experiment::kReuse,
          Experiment::kReuse1, Experiment::kFresh,     Experiment::kFresh1,
          Experiment::kQuantized, Experiment::kStalePosition, Experiment::kReferenceReuse};
}

std::string ExperimentName(Experiment e) {
  switch (e) {
    case Experiment::kOk:
      return "ok";
    case Experiment::kPos0:
      return "pos0";
    case Experiment::kReuse:
      return "reuse";
    case Experiment::kReuse1:
      return "reuse1";
    case Experiment::kFresh:
      return "fresh";
    case Experiment::kFresh1:
      return "fresh1";
    case Experiment::kQuantized:
      return "quantized";
    case Experiment::kStalePosition:
      return "stale-position";
    case Experiment::kReferenceReuse:
      return "reference-reuse";
  }
  return "?";
}

Experiment ParseExperimentName(const std::string& name) {
  std::vector<std::string> names;
  for (Experiment e : AllExperiments()) {
    if (ExperimentName(e) == name) return e;
    names.push_back(ExperimentName(e));
  }
  throw InputError(
      fmt::format("experiment \"{}\": expected one of {}, all", name, fmt::join(names, ", ")));
}

std::string ExperimentWhat(Experiment e) {
  switch (e) {
    case Experiment::kOk:
      return "the caller tracks positions: prefill at index_pos 0, then +1 per step; a new cache "
             "per conversation";
    case Experiment::kPos0:
      return "index_pos 0 on every decode step";
    case Experiment::kReuse:
      return "the second, multi-token prompt reuses the first conversation's cache at index_pos 0";
    case Experiment::kReuse1:
      return "the one-token second prompt reuses the first conversation's cache at index_pos 0";
    case Experiment::kFresh:
      return "the second, multi-token prompt in a new cache";
    case Experiment::kFresh1:
      return "the one-token second prompt in a new cache";
    case Experiment::kQuantized:
      return "reuse on candle's quantized_llama, which drops its cache when index_pos is 0";
    case Experiment::kStalePosition:
      return "the second prompt in a new cache, at the index_pos the first conversation reached";
    case Experiment::kReferenceReuse:
      return "transformers' way (LibTorch reference): one DynamicCache reused for the second "
             "prompt";
  }
  return "?";
}

std::string ExperimentDocumented(Experiment e) {
  switch (e) {
    case Experiment::kOk:
      return "the correct output";
    case Experiment::kPos0:
      return "no error; departs from ok (SmolLM2: from the 2nd token)";
    case Experiment::kReuse:
      return "the raw call fails: cannot broadcast [s, s] to [1, nh, s, P+s]";
    case Experiment::kReuse1:
      return "no error; continues the first conversation (departs from fresh1)";
    case Experiment::kFresh:
      return "the correct output";
    case Experiment::kFresh1:
      return "the correct output";
    case Experiment::kQuantized:
      return "no error; the cache is dropped at index_pos 0: equals fresh";
    case Experiment::kStalePosition:
      return "the raw call fails: cannot broadcast [s, P+s] to [1, nh, s, s]";
    case Experiment::kReferenceReuse:
      return "no error; departs from fresh";
  }
  return "?";
}

DriverKind ExperimentDriver(Experiment e, const BackendInfo& backend) {
  switch (e) {
    case Experiment::kOk:
    case Experiment::kFresh:
    case Experiment::kFresh1:
      // The document's fix is on the raw call; an engine with only the checked API runs it there.
      return backend.raw_call == RawCall::kNone ? DriverKind::kSession : DriverKind::kRaw;
    case Experiment::kPos0:
      return DriverKind::kPos0;
    case Experiment::kReuse:
    case Experiment::kReuse1:
    case Experiment::kReferenceReuse:
      return DriverKind::kReuse;
    case Experiment::kQuantized:
      return DriverKind::kQuantized;
    case Experiment::kStalePosition:
      return DriverKind::kStalePosition;
  }
  return DriverKind::kSession;
}

ReproPrompts MakeReproPrompts(const ReproInput& in, const format::LlamaConfig& config,
                              const format::Tokenizer* tokenizer) {
  KVDIFF_CHECK(!(in.prompt && in.tokens), "--prompt and --tokens: give one of them, not both");
  KVDIFF_CHECK(!(in.second && in.second_tokens),
               "--second and --second-tokens: give one of them, not both");
  KVDIFF_CHECK(in.n >= 2,
               "-n: expected at least 2 generated tokens (pos0 departs from the 2nd), "
               "got {}",
               in.n);
  const bool any_text = in.prompt || in.second;
  KVDIFF_CHECK(!any_text || tokenizer,
               "--prompt/--second: text prompts need a tokenizer ({} or {} in the model "
               "directory); give --tokens and --second-tokens instead",
               format::kHfTokenizerFileName, format::kTokenizerFileName);
  // Defaults: text when the model has a tokenizer and no ids were given, else ids.
  const bool use_text = tokenizer && !in.tokens && !in.second_tokens;

  ReproPrompts p;
  p.n = in.n;
  if (in.tokens) {
    p.first = CheckedIds(*in.tokens, config, "--tokens");
  } else if (in.prompt || use_text) {
    p.first_text = in.prompt.value_or(kDefaultFirstText);
    p.first = tokenizer->Encode(*p.first_text, /*add_bos=*/true);
  } else {
    p.first = CheckedIds(kDefaultFirstIds, config, "the default first prompt");
  }
  if (in.second_tokens) {
    p.second = CheckedIds(*in.second_tokens, config, "--second-tokens");
  } else if (in.second || use_text) {
    p.second_text = in.second.value_or(kDefaultSecondText);
    p.second = tokenizer->Encode(*p.second_text, /*add_bos=*/true);
  } else {
    p.second = CheckedIds(kDefaultSecondIds, config, "the default second prompt");
  }
  KVDIFF_CHECK(p.second.size() >= 2,
               "the second prompt has {} token; reuse needs at least 2 (a one-token prompt is the "
               "reuse1 experiment, --second1-token)",
               p.second.size());
  if (in.second1_token) {
    p.second1 = CheckedIds({*in.second1_token}, config, "--second1-token");
  } else {
    // The second prompt's first token after BOS.
    const bool bos_first = config.bos_token_id >= 0 && p.second[0] == config.bos_token_id;
    p.second1 = {p.second[bos_first ? 1 : 0]};
  }
  // reuse keeps both conversations in one cache: P + s + n - 1 positions.
  const int64_t first_len = static_cast<int64_t>(p.first.size()) + p.n - 1;
  const int64_t second_len = static_cast<int64_t>(p.second.size()) + p.n - 1;
  KVDIFF_CHECK(first_len + second_len <= config.max_position_embeddings,
               "the two conversations need {} + {} = {} positions in one cache (prompts of {} and "
               "{} tokens, n = {}), more than the model's max_position_embeddings {}",
               first_len, second_len, first_len + second_len, p.first.size(), p.second.size(), p.n,
               config.max_position_embeddings);
  return p;
}

namespace {

// The experiment's steps: the first conversation (its prompt, then n - 1 decode steps: the n-th
// token is chosen by the last row and never fed), then the second one. Text prompts stay text
// when `text` is set (a scenario file), else their tokens are used.
std::vector<Step> ExperimentSteps(Experiment e, const ReproPrompts& p, bool text) {
  auto prefill = [text](const std::string& conversation, const Tokens& tokens,
                        const std::optional<std::string>& as_text) {
    return text && as_text ? Step::PrefillText(conversation, *as_text)
                           : Step::Prefill(conversation, tokens);
  };
  const bool one_token = e == Experiment::kReuse1 || e == Experiment::kFresh1;
  return {prefill("main", p.first, p.first_text), Step::Decode("main", p.n - 1),
          Step::NewConversation("second"),
          one_token ? Step::Prefill("second", p.second1)
                    : prefill("second", p.second, p.second_text),
          Step::Decode("second", p.n - 1)};
}

// A conversation's generated line: the greedy choice of its prefill's last row, then of each of
// its decode rows; an error stops the line where it was raised.
ReproLine LineOf(const Recording& rec, size_t prefill_step, const std::string& conversation,
                 const Tokens& prompt) {
  ReproLine line;
  line.conversation = conversation;
  line.prompt = prompt;
  for (size_t step : {prefill_step, prefill_step + 1}) {
    const StepRecord& sr = rec.steps.at(step);
    const size_t first = step == prefill_step && sr.rows_end > sr.rows_begin ? sr.rows_end - 1
                                                                            : sr.rows_begin;
    for (size_t k = first; k < sr.rows_end; ++k) {
      const RecordedRow& row = rec.rows[k];
      line.generated.push_back(GreedyNext(row.logits.data(), row.logits.size()));
    }
    if (sr.status != StepStatus::kDone) {
      line.error = sr.message;
      break;
    }
  }
  return line;
}

Recording ReplaySteps(const Backend& backend, DriverKind driver, std::vector<Step> steps) {
  Scenario sc;
  sc.driver = driver;
  sc.steps = std::move(steps);
  return Replay(sc, backend);
}

}  // namespace

struct Repro::State {
  std::unique_ptr<Backend> backend;
  ReproPrompts prompts;
  std::function<std::unique_ptr<Backend>()> make_transformers;
  std::unique_ptr<Backend> transformers;
  std::map<std::string, Tokens> correct;  // "ok", "fresh", "fresh1"
  std::optional<Tokens> transformers_fresh;  // reference-reuse's baseline, "fresh (ref)"

  const Backend& Transformers() {
    if (!transformers) transformers = make_transformers();
    return *transformers;
  }

  // The correct lines: greedy with no cache at all, every step a ForwardFull of the whole history
  // (the document's check), in one replay of three conversations.
  void ComputeCorrect() {
    const ReproPrompts& p = prompts;
    std::vector<Step> steps = {Step::Prefill("main", p.first),   Step::Decode("main", p.n - 1),
                               Step::NewConversation("second"),  Step::Prefill("second", p.second),
                               Step::Decode("second", p.n - 1),  Step::NewConversation("second1"),
                               Step::Prefill("second1", p.second1),
                               Step::Decode("second1", p.n - 1)};
    const Recording rec = ReplaySteps(*backend, DriverKind::kUncached, steps);
    const std::pair<const char*, size_t> baselines[] = {{"ok", 0}, {"fresh", 3}, {"fresh1", 6}};
    for (const auto& [name, step] : baselines) {
      ReproLine line = LineOf(rec, step, name, steps[step].tokens);
      KVDIFF_CHECK(line.error.empty(), "the uncached {} line failed: {}", name, line.error);
      correct[name] = std::move(line.generated);
    }
  }
};

Repro::Repro(std::unique_ptr<Backend> backend, ReproPrompts prompts,
             std::function<std::unique_ptr<Backend>()> make_transformers)
    : state_(std::make_unique<State>()) {
  KVDIFF_CHECK(backend != nullptr, "Repro: no backend");
  state_->backend = std::move(backend);
  state_->prompts = std::move(prompts);
  state_->make_transformers = std::move(make_transformers);
}

Repro Repro::OnModel(std::shared_ptr<const format::ModelWeights> weights, ReproPrompts prompts,
                     const std::string& backend, const BackendOptions& options) {
  const BackendRegistry& registry = BackendRegistry::Global();
  std::function<std::unique_ptr<Backend>()> transformers;
  const std::string name = registry.FirstWithRawCall(RawCall::kPositionFromCache);
  if (!name.empty()) {
    transformers = [weights, name, options] {
      return BackendRegistry::Global().Make(name, weights, options);
    };
  }
  return Repro(registry.Make(backend, weights, options), std::move(prompts),
               std::move(transformers));
}

Repro::~Repro() = default;
Repro::Repro(Repro&&) noexcept = default;

const ReproPrompts& Repro::prompts() const { return state_->prompts; }
const format::LlamaConfig& Repro::config() const { return state_->backend->config(); }

std::string Repro::Unavailable(Experiment e) const {
  if (e == Experiment::kReferenceReuse) {
    return state_->make_transformers
               ? ""
               : "needs a backend with transformers' semantics (the LibTorch reference), and this "
                 "kvdiff was built without one (-DKVDIFF_WITH_TORCH=OFF)";
  }
  const BackendInfo& info = state_->backend->Info();
  return DriverNotApplicable(ExperimentDriver(e, info), info);
}

const Tokens& Repro::Correct(const std::string& baseline) {
  KVDIFF_CHECK(baseline == "ok" || baseline == "fresh" || baseline == "fresh1",
               "baseline \"{}\": expected ok, fresh or fresh1", baseline);
  if (state_->correct.empty()) state_->ComputeCorrect();
  return state_->correct.at(baseline);
}

std::string Repro::ExpectedReuseError() const {
  const auto& p = state_->prompts;
  const int64_t s = static_cast<int64_t>(p.second.size());
  const int64_t cached = static_cast<int64_t>(p.first.size()) + p.n - 1;
  return fmt::format("cannot broadcast [{}, {}] to [1, {}, {}, {}]", s, s,
                     config().num_attention_heads, s, cached + s);
}

std::string Repro::ExpectedStalePositionError() const {
  const auto& p = state_->prompts;
  const int64_t s = static_cast<int64_t>(p.second.size());
  const int64_t stale = static_cast<int64_t>(p.first.size()) + p.n - 1;
  return fmt::format("cannot broadcast [{}, {}] to [1, {}, {}, {}]", s, stale + s,
                     config().num_attention_heads, s, s);
}

ExperimentResult Repro::Run(Experiment e) {
  ExperimentResult r;
  r.experiment = e;
  r.skipped = Unavailable(e);
  if (!r.skipped.empty()) return r;
  State& st = *state_;
  const ReproPrompts& p = st.prompts;
  const Backend& backend = e == Experiment::kReferenceReuse ? st.Transformers() : *st.backend;
  const Recording rec =
      ReplaySteps(backend, ExperimentDriver(e, backend.Info()), ExperimentSteps(e, p, false));

  // The second conversation's prompt and the correct line it is held to.
  const bool one_token = e == Experiment::kReuse1 || e == Experiment::kFresh1;
  const Tokens& second = one_token ? p.second1 : p.second;
  std::string second_baseline = one_token ? "fresh1" : "fresh";
  const Tokens* second_correct = nullptr;
  if (e == Experiment::kReferenceReuse) {
    // transformers' own correct line: the second prompt in a new DynamicCache.
    if (!st.transformers_fresh) {
      const Recording fresh = ReplaySteps(backend, DriverKind::kRaw,
                                          ExperimentSteps(Experiment::kFresh, p, false));
      st.transformers_fresh = LineOf(fresh, 3, "second", p.second).generated;
    }
    second_baseline = "fresh (ref)";
    second_correct = &*st.transformers_fresh;
  } else {
    second_correct = &Correct(second_baseline);
  }

  ReproLine first = LineOf(rec, 0, "first", p.first);
  first.baseline = "ok";
  if (first.error.empty()) first.departs_at = DepartsAt(first.generated, Correct("ok"));
  ReproLine last = LineOf(rec, 3, "second", second);
  last.baseline = second_baseline;
  if (last.error.empty()) last.departs_at = DepartsAt(last.generated, *second_correct);
  r.lines = {first, last};

  // The verdict, in the words of ExperimentDocumented.
  const bool first_ok = first.error.empty() && first.departs_at == 0;
  const std::string first_note =
      first_ok ? "" : fmt::format(" (but the first conversation: {})", VsCorrect(first));
  auto raised = [&](const std::string& expected) {
    r.as_documented = first_ok && last.error == expected;
    r.observed = (last.error.empty() ? "no error: " + VsCorrect(last) : last.error) + first_note;
  };
  switch (e) {
    case Experiment::kOk:
    case Experiment::kFresh:
    case Experiment::kFresh1:
    case Experiment::kQuantized:
      r.as_documented = first_ok && last.error.empty() && last.departs_at == 0;
      r.observed = fmt::format("first {}, second {}", VsCorrect(first), VsCorrect(last));
      break;
    case Experiment::kPos0:
      r.as_documented = first.error.empty() && first.departs_at >= 2;
      r.observed = !first.error.empty()  ? first.error
                   : first.departs_at == 0 ? "no error; equal to ok"
                                           : fmt::format("no error; departs from ok at token {}",
                                                         first.departs_at);
      break;
    case Experiment::kReuse:
      raised(ExpectedReuseError());
      break;
    case Experiment::kStalePosition:
      raised(ExpectedStalePositionError());
      break;
    case Experiment::kReuse1:
    case Experiment::kReferenceReuse:
      r.as_documented = first_ok && last.error.empty() && last.departs_at >= 1;
      r.observed = (last.error.empty() ? "no error; " + VsCorrect(last) : last.error) + first_note;
      break;
  }
  return r;
}

int ReproExitCode(const std::vector<ExperimentResult>& results) {
  for (const auto& r : results)
    if (r.skipped.empty() && !r.as_documented) return 1;
  return 0;
}

std::string FormatLineOutput(const ReproLine& line, const format::Tokenizer* tokenizer) {
  if (!line.error.empty()) return "Error: " + line.error;
  if (!tokenizer) return Ids(line.generated);
  return Quote(tokenizer->DecodeAll(line.generated, line.prompt.back()));
}

std::string FormatReproHeader(const std::string& model_source, const format::LlamaConfig& config,
                              const ReproPrompts& p, const format::Tokenizer* tokenizer) {
  auto prompt = [&](const Tokens& t, const std::optional<std::string>& text) {
    std::string shown = Ids(t);
    if (text) {
      shown = Quote(*text) + " = " + shown;
    } else if (tokenizer) {
      shown += " = " + Quote(tokenizer->DecodeAll(t, -1));
    }
    return fmt::format("{} ({} token{})", shown, t.size(), t.size() == 1 ? "" : "s");
  };
  std::string out =
      fmt::format("model: {} ({} layers, {} heads, vocab {})\n", model_source,
                  config.num_hidden_layers, config.num_attention_heads, config.vocab_size);
  out += fmt::format("first prompt:            {}\n", prompt(p.first, p.first_text));
  out += fmt::format("second prompt:           {}\n", prompt(p.second, p.second_text));
  out += fmt::format("one-token second prompt: {}\n", prompt(p.second1, std::nullopt));
  out += fmt::format("each conversation: the prompt, then {} greedy tokens\n", p.n);
  return out;
}

std::string FormatExperiment(const ExperimentResult& r, const format::Tokenizer* tokenizer) {
  std::string out =
      fmt::format("{}: {}\n", ExperimentName(r.experiment), ExperimentWhat(r.experiment));
  if (!r.skipped.empty()) return out + fmt::format("  skipped: {}\n", r.skipped);
  size_t w_vs = 0;
  for (const ReproLine& line : r.lines) w_vs = std::max(w_vs, Width(VsCorrect(line)));
  for (const ReproLine& line : r.lines) {
    out += fmt::format("  {:<7} {}  {}\n", line.conversation, Pad(VsCorrect(line), w_vs),
                       FormatLineOutput(line, tokenizer));
  }
  out += fmt::format("  source document: {}\n", ExperimentDocumented(r.experiment));
  out += fmt::format("  observed:        {}\n", r.observed);
  out += fmt::format("  as documented:   {}\n", r.as_documented ? "yes" : "NO");
  return out;
}

std::string FormatReproTable(const std::vector<ExperimentResult>& results,
                             const format::Tokenizer* tokenizer) {
  // The document's table: ok and pos0 show the first conversation, the others the second.
  struct Row {
    std::string name, conversation, output, vs;
  };
  std::vector<Row> rows;
  for (const auto& r : results) {
    Row row{ExperimentName(r.experiment), "", "", ""};
    if (!r.skipped.empty()) {
      row.output = "(skipped)";
    } else {
      const bool show_first = r.experiment == Experiment::kOk || r.experiment == Experiment::kPos0;
      const ReproLine& line = r.lines.at(show_first ? 0 : 1);
      row.conversation = line.conversation;
      row.output = FormatLineOutput(line, tokenizer);
      row.vs = VsCorrect(line);
    }
    rows.push_back(row);
  }
  size_t w_name = 10, w_conv = 12, w_out = 9;
  for (const auto& row : rows) {
    w_name = std::max(w_name, Width(row.name));
    w_out = std::max(w_out, Width(row.output));
  }
  std::string out = Pad("experiment", w_name) + "  " + Pad("conversation", w_conv) + "  " +
                    Pad("generated", w_out) + "  vs correct\n";
  for (const auto& row : rows) {
    out += Pad(row.name, w_name) + "  " + Pad(row.conversation, w_conv) + "  " +
           Pad(row.output, w_out) + "  " + row.vs + "\n";
  }

  out += "\n";
  // A skip's reason, short: the part before its first explanation.
  auto skipped_short = [](const std::string& why) {
    return "skipped: " + why.substr(0, std::min(why.find(':'), why.find(" (")));
  };
  size_t w_doc = 21, w_obs = 8;
  for (const auto& r : results) {
    w_doc = std::max(w_doc, Width(ExperimentDocumented(r.experiment)));
    w_obs = std::max(w_obs, Width(r.skipped.empty() ? r.observed : skipped_short(r.skipped)));
  }
  out += Pad("experiment", w_name) + "  " + Pad("source document says", w_doc) + "  " +
         Pad("observed", w_obs) + "  as documented\n";
  for (const auto& r : results) {
    const std::string observed = r.skipped.empty() ? r.observed : skipped_short(r.skipped);
    const std::string verdict = !r.skipped.empty() ? "-" : r.as_documented ? "yes" : "NO";
    out += Pad(ExperimentName(r.experiment), w_name) + "  " +
           Pad(ExperimentDocumented(r.experiment), w_doc) + "  " + Pad(observed, w_obs) + "  " +
           verdict + "\n";
  }
  return out;
}

Scenario ExperimentScenario(Experiment e, const ReproPrompts& p, const ModelSpec& model,
                            const format::LlamaConfig& config, const std::string& backend) {
  const BackendRegistry& registry = BackendRegistry::Global();
  const std::string runs_on = e == Experiment::kReferenceReuse
                                  ? registry.FirstWithRawCall(RawCall::kPositionFromCache)
                                  : backend;
  KVDIFF_CHECK(!runs_on.empty(), "experiment {}: no backend with transformers' semantics here",
               ExperimentName(e));
  Scenario sc;
  sc.name = ExperimentName(e);
  sc.model = model;
  sc.driver = ExperimentDriver(e, registry.Info(runs_on));
  // The fixes run on every backend; a bug runs on the backend it was reproduced with.
  if (sc.driver != DriverKind::kRaw && sc.driver != DriverKind::kSession) sc.backends = {runs_on};
  sc.steps = ExperimentSteps(e, p, /*text=*/true);
  const size_t second_prefill = 3;

  std::string expect;
  switch (e) {
    case Experiment::kOk:
    case Experiment::kFresh:
    case Experiment::kFresh1:
    case Experiment::kQuantized:
      expect = "every row agrees with the uncached forward: kvdiff run exits 0";
      break;
    case Experiment::kStalePosition:
      expect = fmt::format(
          "step {3} raises cannot broadcast [{0}, {2}] to [1, {1}, {0}, {0}]: kvdiff run exits 1",
          p.second.size(), config.num_attention_heads, p.first.size() + p.n - 1 + p.second.size(),
          second_prefill);
      break;
    case Experiment::kPos0:
      expect =
          "step 1 diverges from its first row (the one that picks the 2nd generated token): "
          "kvdiff run exits 1";
      break;
    case Experiment::kReuse:
      expect = fmt::format(
          "step {3} raises cannot broadcast [{0}, {0}] to [1, {1}, {0}, {2}]: "
          "kvdiff run exits 1",
          p.second.size(), config.num_attention_heads, p.first.size() + p.n - 1 + p.second.size(),
          second_prefill);
      break;
    case Experiment::kReuse1:
    case Experiment::kReferenceReuse:
      expect = fmt::format(
          "no error; step {} diverges from the uncached forward of the new "
          "conversation: kvdiff run exits 1",
          second_prefill);
      break;
  }
  sc.description =
      fmt::format("kvdiff repro {}: {}. The source document: {}. Expected: {}.", ExperimentName(e),
                  ExperimentWhat(e), ExperimentDocumented(e), expect);
  if (model.path && model.path->is_relative()) {
    sc.description += fmt::format(
        " The model is the directory {} beside this file (a path relative to it); to use one "
        "elsewhere: kvdiff run FILE --model DIR.",
        model.path->string());
  } else if (model.llama2c && model.llama2c->checkpoint.is_relative()) {
    sc.description += fmt::format(
        " The model is the llama2.c checkpoint {} (a path relative to this file), converted in "
        "memory; to use a model directory instead: kvdiff run FILE --model DIR.",
        model.llama2c->checkpoint.string());
  }

  return sc;
}

}  // namespace kvdiff::harness
