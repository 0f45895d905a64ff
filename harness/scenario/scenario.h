// Scenarios: a model, tolerances, backends, a driver, and the steps applied to named
// conversations. Parsed from JSON with every error naming the step index and the field.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "format/chat_template.h"
#include "format/config.h"
#include "format/model_files.h"
#include "format/tensor.h"
#include "harness/backend/backend.h"
#include "harness/compare/gate.h"
#include "harness/scenario/driver_kind.h"

namespace kvdiff::harness {

enum class Op {
  kNewConversation,
  kPrefill,
  kDecode,
  kTruncate,
  kFork,
  kReset,
  kEnd,
  kBatch,
  kShift,
};
std::string OpName(Op op);

// Which rows of a batch item come back from the engine (a serving engine's per-row output flags).
enum class BatchLogits {
  kAll,   // every row of the item
  kLast,  // its last row only (what a server asks for after a prompt chunk)
  kNone,  // none: the conversation then has no last row to decode from
};
std::string BatchLogitsName(BatchLogits logits);

// One conversation's part of a batch step: tokens given in the file, or one greedy token chosen
// from the conversation's last row (a decode item).
struct BatchEntry {
  std::string conversation;
  Tokens tokens;        // the item's tokens; empty for a decode item
  bool decode = false;  // one token: the argmax of the conversation's last row
  BatchLogits logits = BatchLogits::kAll;

  int64_t Size() const { return decode ? 1 : static_cast<int64_t>(tokens.size()); }
  // Per token of the item: whether its row is returned.
  std::vector<bool> OutputFlags() const;
  // "a:3", "b:decode", "c:5/last"
  std::string ParamString() const;
};

// One step of a scenario. Build steps with the named constructors, which set exactly the fields
// their op has (and `conversation`, the conversation the step acts on or creates): a step built
// in code then replays exactly as the same step parsed from JSON.
struct Step {
  Op op = Op::kPrefill;
  std::string conversation = "main";  // the conversation acted on; the new one for
                                      // new_conversation (= name) and fork (= to)
  Tokens tokens;                      // prefill (after tokenizing text, if text was given)
  std::optional<std::string> text;    // prefill, as written in the file
  // prefill: chat messages, rendered with the model directory's chat template (and a generation
  // prompt) and tokenized when the scenario is loaded, as written in the file
  std::optional<std::vector<format::ChatMessage>> messages;
  std::vector<int64_t> chunks;    // prefill: sizes summing to tokens.size()
  int64_t n = 0;                  // decode
  int64_t length = 0;             // truncate
  int64_t keep = 0, discard = 0;  // shift
  std::string name;               // new_conversation
  std::string from, to;           // fork
  // batch: the items of ONE engine call, each on its own conversation (a conversation at most
  // once); `conversation` is the first item's.
  std::vector<BatchEntry> items;

  static Step NewConversation(const std::string& name);
  static Step Prefill(const std::string& conversation, Tokens tokens,
                      std::vector<int64_t> chunks = {});
  static Step PrefillText(const std::string& conversation, std::string text,
                          std::vector<int64_t> chunks = {});
  static Step PrefillChat(const std::string& conversation,
                          std::vector<format::ChatMessage> messages,
                          std::vector<int64_t> chunks = {});
  static Step Decode(const std::string& conversation, int64_t n);
  static Step Truncate(const std::string& conversation, int64_t length);
  static Step Fork(const std::string& from, const std::string& to);
  static Step Reset(const std::string& conversation);
  // The conversation's session is freed (a serving engine's request that finished): later steps
  // may not name it until a new_conversation or fork creates it again.
  static Step End(const std::string& conversation);
  static Step Batch(std::vector<BatchEntry> items);
  // llama.cpp's context shift (n_keep, n_discard; StreamingLLM): positions [keep, keep+discard)
  // are dropped, the later ones move down by `discard` with their cached keys re-rotated by
  // -discard positions, values unchanged; the length drops by `discard`. The uncached forward is
  // no oracle for the rows appended after it (docs/scenarios.md, "Shift steps").
  static Step Shift(const std::string& conversation, int64_t keep, int64_t discard);

  // The conversations the step acts on: every item of a batch, the one conversation otherwise
  // (a fork's source and target both).
  std::vector<std::string> ConversationsActedOn() const;

  // The parameter string shown in reports and usable to find the step again:
  // "prefill(main,n=5,chunks=3+2)", "decode(main,n=10)", "fork(main->side)",
  // "batch(a:3,b:decode,c:5/last)", "shift(main,keep=4,discard=8)".
  std::string ParamString() const;
};

// A llama2.c checkpoint (e.g. stories260K.bin) converted to HF weights in memory when loaded, so a
// scenario can name the published files directly with no conversion step and nothing written.
struct Llama2cSpec {
  std::filesystem::path checkpoint;                // resolved against the file's folder
  std::optional<std::filesystem::path> tokenizer;  // tokenizer.bin; needed for "text" prompts
};

// Exactly one of preset, path, llama2c and config is set.
struct ModelSpec {
  std::optional<std::string> preset;          // {"preset": "tiny", "seed": 3}
  uint64_t seed = 0;                          // the random weights' seed (preset and config)
  std::optional<std::filesystem::path> path;  // {"path": "DIR"}, resolved against the file's folder
  // {"llama2c": {"checkpoint": "FILE.bin", "tokenizer": "FILE.bin"}}, the tokenizer optional
  std::optional<Llama2cSpec> llama2c;
  // {"config": {...config.json's fields...}, "seed": 3}: random weights for a config written in
  // the file itself (check --shapes random records each case's shape so).
  std::optional<format::LlamaConfig> config;
  // preset and config: the random weights pushed beyond the defaults (format::RandomModelScale):
  // {"preset": "tiny", "seed": 3, "scale": "demanding"}, or "scores=25,logits=300", or an object
  // {"scores": 25, "activations": 1e19, "logits": 300}. Absent: the default model.
  format::RandomModelScale scale;
  // "preset tiny, seed 3" ("preset tiny, seed 3, scale demanding"), "path /abs/dir",
  // "llama2c /abs/ck.bin, tokenizer /abs/tok.bin" or "config(layers=2, heads=8/2kv, ...), seed 3"
  // (harness/scenario/shape_params.h's ShapeParams)
  std::string Describe() const;
  // The "model" object of a scenario file; ParseScenario reads it back to the same spec.
  nlohmann::json ToJson() const;
};

struct Scenario {
  std::string name;  // file stem, or "case-<k>" for generated ones
  std::string description;
  ModelSpec model;
  // The file's {"tolerance": {"abs": 1e-4, "rel": 2e-6}} (rel: also within when max |a-b| <= rel
  // * max |logit| of the row; 0 or absent: the absolute gate alone; the campaign's demanding cases
  // set it). The rope-f32 allowance is not in the file: whoever runs the scenario resolves it for
  // the backends it runs (ResolveGate).
  Gate gate;
  std::vector<std::string> backends;  // empty: the default for this build
  DriverKind driver = DriverKind::kSession;
  std::vector<Step> steps;

  // The scenario as a file `kvdiff run` reads back (text steps keep their text).
  nlohmann::json ToJson() const;
  // ToJson() as a readable file: one line per top-level field and per step.
  std::string ToText() const;
};

// The most steps a scenario may have: each step is replayed on every backend and compared, so a
// file of millions of steps (7 M resets took 6.5 GB) is refused before any is parsed.
inline constexpr int64_t kMaxScenarioSteps = 100'000;

// Parses scenario JSON text. base_dir resolves a relative model path. Throws InputError naming the
// step index and field ("steps[2].chunks: sizes sum to 4 but tokens has 5"); unknown ops and
// unknown fields are refused.
Scenario ParseScenario(const std::string& json_text, const std::filesystem::path& base_dir = {});
Scenario LoadScenario(const std::filesystem::path& file);

// Replays the steps on conversation lengths alone and refuses what cannot be run on any correct
// backend: a step on a conversation that does not exist, a decode with no previous row (at the
// start, or after truncate/reset), truncating beyond the length, a history longer than
// max_position_embeddings, a token id outside the vocabulary. Text prompts must have been
// tokenized before (tokens filled).
void ValidateScenario(const Scenario& scenario, const format::LlamaConfig& config);

// The KV cache of the conversations alive at each step against this machine's memory, each cached
// K or V value taking `value_bytes` (ValidateScenario: 4, one float32 backend; RunScenario: its
// backends' together, 8 for a float64 one): InputError naming the step, before anything runs.
// The scenario must be valid (ValidateScenario).
void ValidateCacheFits(const Scenario& scenario, const format::LlamaConfig& config,
                       int64_t value_bytes);

// The scenario against what one backend holds (BackendInfo's max_length, max_sessions and
// max_batch_tokens; 0: no limit): a conversation past its positions, more conversations alive at
// once than its sessions, a call (a prefill chunk, a batch's items together) past its tokens per
// call. InputError naming the step, the backend and both numbers, before anything runs.
void ValidateScenarioFor(const Scenario& scenario, const BackendInfo& backend);

// Splits "impl,ref" into names; refuses empty names, duplicates and names the backend registry
// does not know.
std::vector<std::string> ParseBackendList(const std::string& list);

}  // namespace kvdiff::harness
