// `kvdiff repro`: the source document's experiments (../shared/seed/kv-cache-pitfall.zh.txt) as
// ready-made reproductions. Each experiment runs a first conversation (a prompt and n greedy
// tokens) and then a second one, the way the document's loops do, and says whether and where each
// generated line departs from the correct output, and whether the whole behaves as the document
// says it does:
//   ok               the caller tracks positions (prefill at 0, then +1 per step): correct
//   pos0             index_pos 0 on every decode step: no error, wrong from the 2nd token
//   reuse            a multi-token second prompt on the first conversation's cache at index_pos
//                    0: the raw call fails with "cannot broadcast [s, s] to [1, nh, s, P+s]"
//   reuse1           the same with a one-token second prompt: no error, continues the old talk
//   fresh, fresh1    the second prompt (multi-token, one-token) in a new cache: correct
//   quantized        reuse on candle's quantized_llama, which drops its cache at index_pos 0:
//                    correct (the document's note on quantized_llama)
//   stale-position   the second prompt in a new cache at the first conversation's index_pos:
//                    "cannot broadcast [s, P+s] to [1, nh, s, s]"
//   reference-reuse  transformers' way: one DynamicCache reused: silent, departs from fresh
// Each experiment is a scenario replayed through a driver (harness/replay/drivers.h) on the backend
// under test: the raw call for the candle experiments, a transformers-semantics backend's raw call
// (ref) for reference-reuse.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "format/model_files.h"
#include "format/tensor.h"
#include "format/tokenizer.h"
#include "harness/backend/backend.h"
#include "harness/scenario/scenario.h"

namespace kvdiff::harness {

enum class Experiment {
  kOk,
  kPos0,
  kReuse,
  kReuse1,
  kFresh,
  kFresh1,
  kQuantized,
  kStalePosition,
  kReferenceReuse
};

std::vector<Experiment> AllExperiments();           // in the order of the source document
std::string ExperimentName(Experiment experiment);  // "ok", "pos0", ..., "reference-reuse"
// Throws InputError listing the known names (and "all", which the CLI handles).
Experiment ParseExperimentName(const std::string& name);
std::string ExperimentWhat(Experiment experiment);        // what the experiment does, one line
std::string ExperimentDocumented(Experiment experiment);  // what the source document says happens
// The driver an experiment runs with on a backend like `backend` (ok, fresh, fresh1: the raw call
// used right, or the session API on a backend without a raw call).
DriverKind ExperimentDriver(Experiment experiment, const BackendInfo& backend);

// The prompts of the two conversations, as token ids (text kept for display and scenario files).
struct ReproPrompts {
  Tokens first;    // the first conversation's prompt
  Tokens second;   // the second, multi-token prompt (reuse, fresh, reference-reuse)
  Tokens second1;  // the one-token second prompt (reuse1, fresh1)
  std::optional<std::string> first_text, second_text;
  int64_t n = 20;  // greedy tokens generated per conversation (the last one is never fed)
};

// What the user gave; every field optional. Text needs a tokenizer and is encoded with BOS first
// (as llama2.c and `kvdiff generate` do). Without any prompt: "Once upon a time, Lily" / "The dog"
// when there is a tokenizer, else ids 5 17 3 99 42 / 8 17 3 120 42 (5-token prompts, as the
// document's "The capital of France is" / "The capital of Germany is"). The one-token prompt
// defaults to the second prompt's first token after BOS: the document's one-token prompt "The" is
// the first token of its second prompt (SmolLM2 adds no BOS); for "The dog" it is " The".
struct ReproInput {
  std::optional<std::string> prompt, second;
  std::optional<Tokens> tokens, second_tokens;
  std::optional<Token> second1_token;
  int64_t n = 20;
};

// Throws InputError (naming the option) on: text without a tokenizer, a prompt and ids for the
// same conversation, an empty prompt, an id outside the vocabulary, a second prompt of fewer than
// 2 tokens (the one-token case is reuse1), n < 2, or two conversations (plus n - 1 fed tokens
// each) that do not fit in max_position_embeddings (reuse puts both in one cache).
ReproPrompts MakeReproPrompts(const ReproInput& input, const format::LlamaConfig& config,
                              const format::Tokenizer* tokenizer);

// One generated line: a conversation's n greedy tokens, or the error that stopped it.
struct ReproLine {
  std::string conversation;  // "first" or "second"
  Tokens prompt;
  Tokens generated;        // empty when the call raised
  std::string error;       // the raw call's message (a ShapeError), empty when none
  std::string baseline;    // the correct line it is compared with: "ok", "fresh", "fresh1"
  int64_t departs_at = 0;  // 1-based index of the first token that differs from it; 0: equal
};

// "= ok", "departs from fresh at token 3" or "error": a line against its correct line.
std::string VsCorrect(const ReproLine& line);

struct ExperimentResult {
  Experiment experiment = Experiment::kOk;
  std::vector<ReproLine> lines;  // first, second
  std::string observed;          // in the words of ExperimentDocumented
  bool as_documented = false;
  std::string skipped;  // why it did not run (no LibTorch); lines empty then
};

// Runs the experiments on one model. The correct outputs (ok, fresh, fresh1) are computed without
// any cache: greedy over ForwardFull of the whole history (the document's check), so `ok` and
// `fresh` are themselves tested against them, not defined as them.
class Repro {
 public:
  // backend: the engine under test; experiments whose driver it cannot run are skipped, saying
  // why. make_transformers: builds a backend with transformers' semantics for reference-reuse on
  // first use (null: that experiment is skipped).
  Repro(std::unique_ptr<Backend> backend, ReproPrompts prompts,
        std::function<std::unique_ptr<Backend>()> make_transformers = nullptr);
  // The usual set-up: `backend` from the registry over `weights`, and the registry's first
  // backend whose raw call reads positions from its cache (ref) for reference-reuse.
  static Repro OnModel(std::shared_ptr<const format::ModelWeights> weights, ReproPrompts prompts,
                       const std::string& backend = "impl", const BackendOptions& options = {});
  ~Repro();
  Repro(Repro&&) noexcept;

  const ReproPrompts& prompts() const;
  const format::LlamaConfig& config() const;
  // Empty when the experiment can run here, else why not.
  std::string Unavailable(Experiment experiment) const;
  ExperimentResult Run(Experiment experiment);
  // The correct line of a baseline name ("ok", "fresh", "fresh1"): greedy with no cache at all,
  // on the backend under test; computed once.
  const Tokens& Correct(const std::string& baseline);
  // The error message reuse must raise: "cannot broadcast [s, s] to [1, nh, s, P+s]" with
  // s = second.size(), nh = num_attention_heads, P = first.size() + n - 1 cached positions.
  std::string ExpectedReuseError() const;
  // stale-position's: "cannot broadcast [s, P+s] to [1, nh, s, s]" (a fresh cache, index_pos P).
  std::string ExpectedStalePositionError() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// 0 when every experiment that ran behaved as documented (a skipped one does not count), else 1.
int ReproExitCode(const std::vector<ExperimentResult>& results);

// Text. tokenizer may be null: lines then show token ids.
std::string FormatLineOutput(const ReproLine& line, const format::Tokenizer* tokenizer);
std::string FormatReproHeader(const std::string& model_source, const format::LlamaConfig& config,
                              const ReproPrompts& prompts, const format::Tokenizer* tokenizer);
// One experiment: both lines, what the document says, and the verdict.
std::string FormatExperiment(const ExperimentResult& result, const format::Tokenizer* tokenizer);
// `repro all`: the generated line of each experiment, as the document's table shows it (the
// first conversation for ok and pos0, the second for the others), then the verdicts.
std::string FormatReproTable(const std::vector<ExperimentResult>& results,
                             const format::Tokenizer* tokenizer);

// The experiment as a scenario `kvdiff run` replays (driver and steps). A prompt given as text is
// kept as text (PrepareScenario encodes it with BOS in a new conversation, as MakeReproPrompts
// did); the one-token prompt is kept as its id, since its text would get a BOS.
// backend: the one the experiment is reproduced on (reference-reuse runs on the registry's
// transformers-semantics backend whatever it is).
Scenario ExperimentScenario(Experiment experiment, const ReproPrompts& prompts,
                            const ModelSpec& model, const format::LlamaConfig& config,
                            const std::string& backend);

}  // namespace kvdiff::harness
