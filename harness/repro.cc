#include "harness/repro.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <stdexcept>

#include "harness/compare.h"
#include "format/error.h"
#include "impl/kv_cache.h"
#include "impl/model.h"
#ifdef KVDIFF_HAVE_TORCH
#include "reference/reference_model.h"
#endif

namespace kvdiff::harness {
namespace {

// The document's prompts are 5 tokens each and differ in one ("France" / "Germany"); these ids
// do the same and fit every vocabulary (tiny's is 256).
const Tokens kDefaultFirstIds = {5, 17, 3, 99, 42};
const Tokens kDefaultSecondIds = {8, 17, 3, 120, 42};
constexpr const char* kDefaultFirstText = "Once upon a time, Lily";
constexpr const char* kDefaultSecondText = "The dog";

Token ArgmaxLastRow(const Logits& logits) {
  const int64_t row = logits.rows() - 1;
  const int64_t best = Argmax(logits.row(row).data(), logits.cols());
  if (best < 0) throw std::runtime_error("greedy step: the logits row has no finite value");
  return static_cast<Token>(best);
}

// The document's greedy(prompt, cache, n) on candle's raw call: prefill at index_pos 0 (a new
// conversation starts at 0, whatever the cache holds), then n - 1 single-token steps whose
// index_pos either advances by the tokens fed (the fix) or stays 0 (pos0).
Tokens RawGreedy(const impl::Model& model, impl::KvCache& cache, const Tokens& prompt, int64_t n,
                 bool pos0) {
  int64_t pos = 0;
  Token next = ArgmaxLastRow(model.Forward(prompt, pos, cache));
  Tokens out = {next};
  pos += static_cast<int64_t>(prompt.size());
  for (int64_t k = 1; k < n; ++k) {
    next = ArgmaxLastRow(model.Forward({next}, pos0 ? 0 : pos, cache));
    out.push_back(next);
    pos += 1;
  }
  return out;
}

// Greedy without any cache, as the document's check feeds "all at once without a cache". One
// ForwardFull over prompt + candidate[0..n-2] verifies a candidate line (row p of a causal forward
// depends on tokens 0..p only, so its argmaxes are the uncached greedy choices); when one differs,
// the line is recomputed step by step, each step a ForwardFull of the whole history.
Tokens UncachedGreedy(const impl::Model& model, const Tokens& prompt, int64_t n,
                      const Tokens& candidate) {
  if (static_cast<int64_t>(candidate.size()) == n) {
    Tokens history = prompt;
    history.insert(history.end(), candidate.begin(), candidate.end() - 1);
    const Logits full = model.ForwardFull(history);  // (history, vocab)
    bool same = true;
    for (int64_t k = 0; k < n && same; ++k) {
      const int64_t row = static_cast<int64_t>(prompt.size()) - 1 + k;
      same = Argmax(full.row(row).data(), full.cols()) == candidate[k];
    }
    if (same) return candidate;
  }
  Tokens history = prompt, out;
  for (int64_t k = 0; k < n; ++k) {
    const Token next = ArgmaxLastRow(model.ForwardFull(history));
    out.push_back(next);
    history.push_back(next);
  }
  return out;
}

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
  return {Experiment::kOk,    Experiment::kPos0,   Experiment::kReuse,         Experiment::kReuse1,
          Experiment::kFresh, Experiment::kFresh1, Experiment::kReferenceReuse};
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
    case Experiment::kReferenceReuse:
      return "no error; departs from fresh";
  }
  return "?";
}

std::string ExperimentUnavailable(Experiment e) {
#ifdef KVDIFF_HAVE_TORCH
  (void)e;
  return {};
#else
  if (e == Experiment::kReferenceReuse) {
    return "needs the LibTorch reference, and this kvdiff was built without it "
           "(-DKVDIFF_WITH_TORCH=OFF)";
  }
  return {};
#endif
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
               "--prompt/--second: text prompts need a tokenizer ({} in the model directory); "
               "give --tokens and --second-tokens instead",
               format::kTokenizerFileName);
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

struct Repro::State {
  std::shared_ptr<const format::ModelWeights> weights;
  ReproPrompts prompts;
  int threads = 0;
  impl::Model model;
  std::map<std::string, Tokens> correct;  // "ok", "fresh", "fresh1"
#ifdef KVDIFF_HAVE_TORCH
  std::unique_ptr<ref::ReferenceModel> reference;
#endif

  State(std::shared_ptr<const format::ModelWeights> w, ReproPrompts p, int t)
      : weights(w), prompts(std::move(p)), threads(t), model(std::move(w), t) {}

  const Tokens& PromptOf(const std::string& baseline) const {
    if (baseline == "ok") return prompts.first;
    if (baseline == "fresh") return prompts.second;
    return prompts.second1;
  }

  // A conversation in a new cache, on the raw call.
  Tokens NewCacheGreedy(const Tokens& prompt, bool pos0 = false) {
    impl::KvCache cache = model.NewCache();
    return RawGreedy(model, cache, prompt, prompts.n, pos0);
  }
};

Repro::Repro(std::shared_ptr<const format::ModelWeights> weights, ReproPrompts prompts, int threads)
    : state_(std::make_unique<State>(std::move(weights), std::move(prompts), threads)) {
  const Tokens* all[] = {&state_->prompts.first, &state_->prompts.second, &state_->prompts.second1};
  for (const Tokens* t : all) state_->model.CheckTokens(*t);
}

Repro::~Repro() = default;
Repro::Repro(Repro&&) noexcept = default;

const ReproPrompts& Repro::prompts() const { return state_->prompts; }
const format::LlamaConfig& Repro::config() const { return state_->model.config(); }

const Tokens& Repro::Correct(const std::string& baseline) {
  KVDIFF_CHECK(baseline == "ok" || baseline == "fresh" || baseline == "fresh1",
               "baseline \"{}\": expected ok, fresh or fresh1", baseline);
  auto it = state_->correct.find(baseline);
  if (it != state_->correct.end()) return it->second;
  const Tokens& prompt = state_->PromptOf(baseline);
  // The cached line is only a candidate: the uncached forward decides.
  const Tokens candidate = state_->NewCacheGreedy(prompt);
  return state_->correct[baseline] =
             UncachedGreedy(state_->model, prompt, state_->prompts.n, candidate);
}

std::string Repro::ExpectedReuseError() const {
  const auto& p = state_->prompts;
  const int64_t s = static_cast<int64_t>(p.second.size());
  const int64_t cached = static_cast<int64_t>(p.first.size()) + p.n - 1;
  return fmt::format("cannot broadcast [{}, {}] to [1, {}, {}, {}]", s, s,
                     config().num_attention_heads, s, cached + s);
}

ExperimentResult Repro::Run(Experiment e) {
  ExperimentResult r;
  r.experiment = e;
  r.skipped = ExperimentUnavailable(e);
  if (!r.skipped.empty()) return r;
  State& st = *state_;
  const ReproPrompts& p = st.prompts;

  auto make_line = [&](const std::string& conversation, const Tokens& prompt,
                       const std::string& baseline, const Tokens& generated) {
    ReproLine line;
    line.conversation = conversation;
    line.prompt = prompt;
    line.baseline = baseline;
    line.generated = generated;
    line.departs_at = DepartsAt(generated, Correct(baseline));
    return line;
  };
  // The second conversation's prompt and baseline: multi-token or one-token.
  const bool one_token = e == Experiment::kReuse1 || e == Experiment::kFresh1;
  const Tokens& second = one_token ? p.second1 : p.second;
  const std::string second_baseline = one_token ? "fresh1" : "fresh";

  switch (e) {
    case Experiment::kOk:
    case Experiment::kFresh:
    case Experiment::kFresh1:
    case Experiment::kPos0: {
      const bool pos0 = e == Experiment::kPos0;
      r.lines.push_back(make_line("first", p.first, "ok", st.NewCacheGreedy(p.first, pos0)));
      r.lines.push_back(
          make_line("second", second, second_baseline, st.NewCacheGreedy(second, pos0)));
      break;
    }
    case Experiment::kReuse:
    case Experiment::kReuse1: {
      // One cache for both conversations, as llama.rs's Cache has no way to clear it.
      impl::KvCache cache = st.model.NewCache();
      r.lines.push_back(
          make_line("first", p.first, "ok", RawGreedy(st.model, cache, p.first, p.n, false)));
      ReproLine line;
      line.conversation = "second";
      line.prompt = second;
      line.baseline = second_baseline;
      try {
        line.generated = RawGreedy(st.model, cache, second, p.n, false);
        line.departs_at = DepartsAt(line.generated, Correct(second_baseline));
      } catch (const ShapeError& err) {
        line.error = err.what();
      }
      r.lines.push_back(line);
      break;
    }
    case Experiment::kReferenceReuse: {
#ifdef KVDIFF_HAVE_TORCH
      if (!st.reference) {
        st.reference =
            std::make_unique<ref::ReferenceModel>(st.weights, ref::Precision::kFloat32, st.threads);
      }
      const ref::ReferenceModel& model = *st.reference;
      // kv.py's greedy(): positions come from the cache length, so the loop passes none.
      auto greedy = [&](const Tokens& prompt, ref::DynamicCache& cache) {
        Token next = ArgmaxLastRow(model.Forward(prompt, cache));
        Tokens out = {next};
        for (int64_t k = 1; k < p.n; ++k) {
          next = ArgmaxLastRow(model.Forward({next}, cache));
          out.push_back(next);
        }
        return out;
      };
      ref::DynamicCache cache;
      r.lines.push_back(make_line("first", p.first, "ok", greedy(p.first, cache)));
      const Tokens again = greedy(p.second, cache);  // not cleared: reused
      ref::DynamicCache new_cache;
      const Tokens fresh = greedy(p.second, new_cache);  // transformers' own correct line
      ReproLine line;
      line.conversation = "second";
      line.prompt = p.second;
      line.baseline = "fresh (ref)";
      line.generated = again;
      line.departs_at = DepartsAt(again, fresh);
      r.lines.push_back(line);
#endif
      break;
    }
  }

  // The verdict, in the words of ExperimentDocumented.
  const ReproLine& first = r.lines.at(0);
  const ReproLine& last = r.lines.at(1);
  const bool first_ok = first.error.empty() && first.departs_at == 0;
  const std::string first_note =
      first_ok ? "" : fmt::format(" (but the first conversation: {})", VsCorrect(first));
  switch (e) {
    case Experiment::kOk:
    case Experiment::kFresh:
    case Experiment::kFresh1: {
      r.as_documented = first_ok && last.error.empty() && last.departs_at == 0;
      r.observed = fmt::format("first {}, second {}", VsCorrect(first), VsCorrect(last));
      break;
    }
    case Experiment::kPos0:
      r.as_documented = first.error.empty() && first.departs_at >= 2;
      r.observed = first.departs_at == 0
                       ? "no error; equal to ok"
                       : fmt::format("no error; departs from ok at token {}", first.departs_at);
      break;
    case Experiment::kReuse:
      r.as_documented = first_ok && last.error == ExpectedReuseError();
      r.observed = (last.error.empty() ? "no error: " + VsCorrect(last) : last.error) + first_note;
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
  // The only reason to skip is a build without LibTorch; the single-experiment form says it whole.
  const std::string kSkippedShort = "skipped (no LibTorch in this build)";
  size_t w_doc = 21, w_obs = 8;
  for (const auto& r : results) {
    w_doc = std::max(w_doc, Width(ExperimentDocumented(r.experiment)));
    w_obs = std::max(w_obs, Width(r.skipped.empty() ? r.observed : kSkippedShort));
  }
  out += Pad("experiment", w_name) + "  " + Pad("source document says", w_doc) + "  " +
         Pad("observed", w_obs) + "  as documented\n";
  for (const auto& r : results) {
    const std::string observed = r.skipped.empty() ? r.observed : kSkippedShort;
    const std::string verdict = !r.skipped.empty() ? "-" : r.as_documented ? "yes" : "NO";
    out += Pad(ExperimentName(r.experiment), w_name) + "  " +
           Pad(ExperimentDocumented(r.experiment), w_doc) + "  " + Pad(observed, w_obs) + "  " +
           verdict + "\n";
  }
  return out;
}

Scenario ExperimentScenario(Experiment e, const ReproPrompts& p, const ModelSpec& model,
                            const format::LlamaConfig& config) {
  Scenario sc;
  sc.name = ExperimentName(e);
  sc.model = model;
  const bool one_token = e == Experiment::kReuse1 || e == Experiment::kFresh1;
  switch (e) {
    case Experiment::kOk:
    case Experiment::kFresh:
    case Experiment::kFresh1:
      sc.driver = DriverKind::kSession;
      break;
    case Experiment::kPos0:
      sc.driver = DriverKind::kPos0;
      sc.backends = {"impl"};
      break;
    case Experiment::kReuse:
    case Experiment::kReuse1:
      sc.driver = DriverKind::kReuse;
      sc.backends = {"impl"};
      break;
    case Experiment::kReferenceReuse:
      sc.driver = DriverKind::kReuse;
      sc.backends = {"ref"};
      break;
  }
  auto prefill = [](const std::string& conversation, const Tokens& tokens,
                    const std::optional<std::string>& text) {
    Step s;
    s.op = Op::kPrefill;
    s.conversation = conversation;
    if (text) {
      s.text = text;
    } else {
      s.tokens = tokens;
    }
    return s;
  };
  auto decode = [&](const std::string& conversation) {
    Step s;
    s.op = Op::kDecode;
    s.conversation = conversation;
    s.n = p.n - 1;  // the n-th generated token is chosen by the last row and never fed
    return s;
  };
  sc.steps.push_back(prefill("main", p.first, p.first_text));
  sc.steps.push_back(decode("main"));
  Step nc;
  nc.op = Op::kNewConversation;
  nc.name = "second";
  sc.steps.push_back(nc);
  if (one_token) {
    sc.steps.push_back(prefill("second", p.second1, std::nullopt));
  } else {
    sc.steps.push_back(prefill("second", p.second, p.second_text));
  }
  const size_t second_prefill = sc.steps.size() - 1;
  sc.steps.push_back(decode("second"));

  std::string expect;
  switch (e) {
    case Experiment::kOk:
    case Experiment::kFresh:
    case Experiment::kFresh1:
      expect = "every row agrees with the uncached forward: kvdiff run exits 0";
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
