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

// What the source document says an experiment shows; an experiment's verdict and its scenario
// file's expectation follow from it.
enum class Outcome {
  kCorrect,             // both lines equal their correct lines
  kFirstDeparts,        // no error; the first line departs from ok at its 2nd token or later
  kReuseError,          // the second prompt's call raises the reuse broadcast error
  kStalePositionError,  // the second prompt's call raises the stale-position broadcast error
  kSecondDeparts,       // no error; the second line departs from its correct line
};

// One experiment: its name, what it does, what the document says happens, how it runs.
struct ExperimentSpec {
  Experiment experiment;
  const char* name;
  const char* what;
  const char* documented;
  // kRaw: the raw call used right; an engine with only the checked API runs it on its session.
  DriverKind driver;
  bool one_token;  // the second prompt is the one-token one (reuse1, fresh1)
  Outcome outcome;
};

// In the order of the source document.
const ExperimentSpec kExperiments[] = {
    {Experiment::kOk, "ok",
     "the caller tracks positions: prefill at index_pos 0, then +1 per step; a new cache per "
     "conversation",
     "the correct output", DriverKind::kRaw, false, Outcome::kCorrect},
    {Experiment::kPos0, "pos0", "index_pos 0 on every decode step",
     "no error; departs from ok (SmolLM2: from the 2nd token)", DriverKind::kPos0, false,
     Outcome::kFirstDeparts},
    {Experiment::kReuse, "reuse",
     "the second, multi-token prompt reuses the first conversation's cache at index_pos 0",
     "the raw call fails: cannot broadcast [s, s] to [1, nh, s, P+s]", DriverKind::kReuse, false,
     Outcome::kReuseError},
    {Experiment::kReuse1, "reuse1",
     "the one-token second prompt reuses the first conversation's cache at index_pos 0",
     "no error; continues the first conversation (departs from fresh1)", DriverKind::kReuse, true,
     Outcome::kSecondDeparts},
    {Experiment::kFresh, "fresh", "the second, multi-token prompt in a new cache",
     "the correct output", DriverKind::kRaw, false, Outcome::kCorrect},
    {Experiment::kFresh1, "fresh1", "the one-token second prompt in a new cache",
     "the correct output", DriverKind::kRaw, true, Outcome::kCorrect},
    {Experiment::kQuantized, "quantized",
     "reuse on candle's quantized_llama, which drops its cache when index_pos is 0",
     "no error; the cache is dropped at index_pos 0: equals fresh", DriverKind::kQuantized, false,
     Outcome::kCorrect},
    {Experiment::kStalePosition, "stale-position",
     "the second prompt in a new cache, at the index_pos the first conversation reached",
     "the raw call fails: cannot broadcast [s, P+s] to [1, nh, s, s]", DriverKind::kStalePosition,
     false, Outcome::kStalePositionError},
    {Experiment::kReferenceReuse, "reference-reuse",
     "transformers' way (LibTorch reference): one DynamicCache reused for the second prompt",
     "no error; departs from fresh", DriverKind::kReuse, false, Outcome::kSecondDeparts},
};

const ExperimentSpec& SpecOf(Experiment e) {
  for (const ExperimentSpec& spec : kExperiments)
    if (spec.experiment == e) return spec;
  throw std::logic_error("an Experiment missing from kExperiments");
}

}  // namespace

std::vector<Experiment> AllExperiments() {
  std::vector<Experiment> all;
  for (const ExperimentSpec& spec : kExperiments) all.push_back(spec.experiment);
  return all;
}

std::string ExperimentName(Experiment e) { return SpecOf(e).name; }
std::string ExperimentWhat(Experiment e) { return SpecOf(e).what; }
std::string ExperimentDocumented(Experiment e) { return SpecOf(e).documented; }

Experiment ParseExperimentName(const std::string& name) {
  std::vector<std::string> names;
  for (const ExperimentSpec& spec : kExperiments) {
    if (spec.name == name) return spec.experiment;
    names.push_back(spec.name);
  }
  throw InputError(
      fmt::format("experiment \"{}\": expected one of {}, all", name, fmt::join(names, ", ")));
}

DriverKind ExperimentDriver(Experiment e, const BackendInfo& backend) {
  const DriverKind driver = SpecOf(e).driver;
  return driver == DriverKind::kRaw && backend.raw_call == RawCall::kNone ? DriverKind::kSession
                                                                          : driver;
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
  const bool one_token = SpecOf(e).one_token;
  return {
      prefill("main", p.first, p.first_text), Step::Decode("main", p.n - 1),
      Step::NewConversation("second"),
      one_token ? Step::Prefill("second", p.second1) : prefill("second", p.second, p.second_text),
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
    const size_t first =
        step == prefill_step && sr.rows_end > sr.rows_begin ? sr.rows_end - 1 : sr.rows_begin;
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
  std::map<std::string, Tokens> correct;     // "ok", "fresh", "fresh1"
  std::optional<Tokens> transformers_fresh;  // reference-reuse's baseline, "fresh (ref)"

  const Backend& Transformers() {
    if (!transformers) transformers = make_transformers();
    return *transformers;
  }

  // The correct lines: greedy with no cache at all, every step a ForwardFull of the whole history
  // (the document's check), in one replay of three conversations.
  void ComputeCorrect() {
    const ReproPrompts& p = prompts;
    std::vector<Step> steps = {
        Step::Prefill("main", p.first),      Step::Decode("main", p.n - 1),
        Step::NewConversation("second"),     Step::Prefill("second", p.second),
        Step::Decode("second", p.n - 1),     Step::NewConversation("second1"),
        Step::Prefill("second1", p.second1), Step::Decode("second1", p.n - 1)};
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
  const bool one_token = SpecOf(e).one_token;
  const Tokens& second = one_token ? p.second1 : p.second;
  std::string second_baseline = one_token ? "fresh1" : "fresh";
  const Tokens* second_correct = nullptr;
  if (e == Experiment::kReferenceReuse) {
    // transformers' own correct line: the second prompt in a new DynamicCache.
    if (!st.transformers_fresh) {
      const Recording fresh =
          ReplaySteps(backend, DriverKind::kRaw, ExperimentSteps(Experiment::kFresh, p, false));
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
  switch (SpecOf(e).outcome) {
    case Outcome::kCorrect:
      r.as_documented = first_ok && last.error.empty() && last.departs_at == 0;
      r.observed = fmt::format("first {}, second {}", VsCorrect(first), VsCorrect(last));
      break;
    case Outcome::kFirstDeparts:
      r.as_documented = first.error.empty() && first.departs_at >= 2;
      r.observed = !first.error.empty() ? first.error
                   : first.departs_at == 0
                       ? "no error; equal to ok"
                       : fmt::format("no error; departs from ok at token {}", first.departs_at);
      break;
    case Outcome::kReuseError:
      raised(ExpectedReuseError());
      break;
    case Outcome::kStalePositionError:
      raised(ExpectedStalePositionError());
      break;
    case Outcome::kSecondDeparts:
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
  switch (SpecOf(e).outcome) {
    case Outcome::kCorrect:
      expect = "every row agrees with the uncached forward: kvdiff run exits 0";
      break;
    case Outcome::kStalePositionError:
      expect = fmt::format(
          "step {3} raises cannot broadcast [{0}, {2}] to [1, {1}, {0}, {0}]: kvdiff run exits 1",
          p.second.size(), config.num_attention_heads, p.first.size() + p.n - 1 + p.second.size(),
          second_prefill);
      break;
    case Outcome::kFirstDeparts:
      expect =
          "step 1 diverges from its first row (the one that picks the 2nd generated token): "
          "kvdiff run exits 1";
      break;
    case Outcome::kReuseError:
      expect = fmt::format(
          "step {3} raises cannot broadcast [{0}, {0}] to [1, {1}, {0}, {2}]: "
          "kvdiff run exits 1",
          p.second.size(), config.num_attention_heads, p.first.size() + p.n - 1 + p.second.size(),
          second_prefill);
      break;
    case Outcome::kSecondDeparts:
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
