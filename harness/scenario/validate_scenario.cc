// ValidateScenario: a scenario's steps checked against its model before anything runs, each refusal
// naming the step and field.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>
#include <set>
#include <string>

#include "format/error.h"
#include "format/machine_memory.h"
#include "harness/backend/registry.h"
#include "harness/scenario/conversations.h"
#include "harness/scenario/scenario.h"

namespace kvdiff::harness {

namespace {

void CheckTokenIds(const Tokens& tokens, const format::LlamaConfig& config,
                   const std::string& where) {
  for (size_t t = 0; t < tokens.size(); ++t) {
    KVDIFF_CHECK(tokens[t] >= 0 && tokens[t] < config.vocab_size,
                 "{}.tokens[{}]: token id {} is outside the vocabulary [0, {})", where, t,
                 tokens[t], config.vocab_size);
  }
}

// One engine call: each item on a live conversation, each conversation at most once (a session
// appears once per call), tokens in the vocabulary, a decode item after a row it can choose from.
template <typename Find>
void ValidateBatch(const Step& s, size_t i, const Find& find, const format::LlamaConfig& config) {
  KVDIFF_CHECK(!s.items.empty(), "steps[{}].items: a batch needs at least one item", i);
  std::map<std::string, size_t> seen;
  for (size_t k = 0; k < s.items.size(); ++k) {
    const BatchEntry& item = s.items[k];
    const std::string where = fmt::format("steps[{}].items[{}]", i, k);
    const ConversationState c = find(item.conversation, where + ".conversation");
    auto [first, fresh] = seen.emplace(item.conversation, k);
    KVDIFF_CHECK(fresh,
                 "{}.conversation: \"{}\" is already items[{}] of this batch (a session takes "
                 "part in a call at most once)",
                 where, item.conversation, first->second);
    KVDIFF_CHECK(item.decode || !item.tokens.empty(),
                 "{}: an empty item (expected tokens, or \"decode\": true)", where);
    CheckTokenIds(item.tokens, config, where);
    KVDIFF_CHECK(!item.decode || c.has_last_row,
                 "{}: decode on conversation \"{}\" has no previous row to take the argmax of "
                 "(it needs a prefill, a decode or a batch item with logits before it)",
                 where, item.conversation);
    KVDIFF_CHECK(item.Size() <= config.max_position_embeddings - c.length,
                 "{}: conversation \"{}\" would reach {} + {} positions, beyond the model's "
                 "max_position_embeddings {}",
                 where, item.conversation, c.length, item.Size(), config.max_position_embeddings);
  }
}

// The positions the named conversations hold (those that exist).
int64_t Held(const Conversations& convs, const std::vector<std::string>& names) {
  int64_t held = 0;
  for (const std::string& name : names) held += convs.Exists(name) ? convs.At(name).length : 0;
  return held;
}

// The conversations a step acts on: what it changes in the positions held alive.
std::vector<std::string> Touched(const Step& s) {
  if (s.op == Op::kFork) return {s.to};
  if (s.op == Op::kNewConversation) return {s.name};
  if (s.op != Op::kBatch) return {s.conversation};
  std::set<std::string> names;  // each once (the validation refuses a repeat, a moment later)
  for (const BatchEntry& item : s.items) names.insert(item.conversation);
  return {names.begin(), names.end()};
}

}  // namespace

void ValidateScenario(const Scenario& scenario, const format::LlamaConfig& config) {
  Conversations convs;
  std::map<std::string, size_t> ended;  // conversation -> the step that ended it
  const int64_t max_len = config.max_position_embeddings;
  auto find = [&](const std::string& name, const std::string& where) -> ConversationState {
    auto end = ended.find(name);
    KVDIFF_CHECK(end == ended.end() || convs.Exists(name),
                 "{}: conversation \"{}\" ended at step {} (its session is freed; create it "
                 "again with new_conversation or fork)",
                 where, name, end == ended.end() ? 0 : end->second);
    KVDIFF_CHECK(convs.Exists(name),
                 "{}: no conversation named \"{}\" (create it first with new_conversation or "
                 "fork)",
                 where, name);
    return convs.At(name);
  };
  for (size_t i = 0; i < scenario.steps.size(); ++i) {
    const Step& s = scenario.steps[i];
    switch (s.op) {
      case Op::kNewConversation:
        KVDIFF_CHECK(!convs.Exists(s.name), "steps[{}].name: conversation \"{}\" already exists", i,
                     s.name);
        break;
      case Op::kPrefill: {
        const ConversationState c = find(s.conversation, fmt::format("steps[{}].conversation", i));
        KVDIFF_CHECK(!s.tokens.empty(), "steps[{}].text: the text was not tokenized", i);
        if (!s.chunks.empty()) {
          int64_t sum = 0;
          for (int64_t k : s.chunks) sum += k;
          KVDIFF_CHECK(sum == static_cast<int64_t>(s.tokens.size()),
                       "steps[{}].chunks: sizes sum to {} but the text has {} tokens", i, sum,
                       s.tokens.size());
        }
        CheckTokenIds(s.tokens, config, fmt::format("steps[{}]", i));
        const int64_t reached = c.length + static_cast<int64_t>(s.tokens.size());
        KVDIFF_CHECK(reached <= max_len,
                     "steps[{}]: conversation \"{}\" would reach {} positions, beyond the model's "
                     "max_position_embeddings {}",
                     i, s.conversation, reached, max_len);
        break;
      }
      case Op::kDecode: {
        const ConversationState c = find(s.conversation, fmt::format("steps[{}].conversation", i));
        KVDIFF_CHECK(c.has_last_row,
                     "steps[{}]: decode on conversation \"{}\" has no previous row to take the "
                     "argmax of (decode must follow a prefill or decode; a truncate, reset or new "
                     "conversation leaves none)",
                     i, s.conversation);
        // Compared before adding: n may be as large as INT64_MAX.
        KVDIFF_CHECK(s.n <= max_len - c.length,
                     "steps[{}].n: conversation \"{}\" would reach {} + {} positions, beyond the "
                     "model's max_position_embeddings {}",
                     i, s.conversation, c.length, s.n, max_len);
        break;
      }
      case Op::kTruncate: {
        const ConversationState c = find(s.conversation, fmt::format("steps[{}].conversation", i));
        KVDIFF_CHECK(s.length <= c.length,
                     "steps[{}].length: cannot truncate conversation \"{}\" to {}: it has {} "
                     "positions",
                     i, s.conversation, s.length, c.length);
        const int64_t shortest = ShortestTruncate(c, config.sliding_window);
        KVDIFF_CHECK(s.length >= shortest,
                     "steps[{}].length: cannot truncate conversation \"{}\" to {}: the model has "
                     "a sliding window of {} positions and the conversation has reached {}, so "
                     "positions 0..{} have left its window, and the query at {} would need "
                     "positions {}..{}; once the window has dropped positions, a truncate goes "
                     "back at most to {} (the furthest length reached minus one)",
                     i, s.conversation, s.length, config.sliding_window, c.furthest,
                     c.furthest - config.sliding_window - 1, s.length,
                     std::max<int64_t>(0, s.length - config.sliding_window + 1), s.length - 1,
                     shortest);
        break;
      }
      case Op::kFork:
        find(s.from, fmt::format("steps[{}].from", i));
        KVDIFF_CHECK(!convs.Exists(s.to), "steps[{}].to: conversation \"{}\" already exists", i,
                     s.to);
        break;
      case Op::kReset:
        find(s.conversation, fmt::format("steps[{}].conversation", i));
        break;
      case Op::kEnd:
        find(s.conversation, fmt::format("steps[{}].conversation", i));
        ended[s.conversation] = i;
        break;
      case Op::kBatch:
        ValidateBatch(s, i, find, config);
        break;
      case Op::kShift: {
        const ConversationState c = find(s.conversation, fmt::format("steps[{}].conversation", i));
        KVDIFF_CHECK(s.keep >= 0, "steps[{}].keep: expected an integer >= 0, got {}", i, s.keep);
        KVDIFF_CHECK(s.discard >= 0, "steps[{}].discard: expected an integer >= 0, got {}", i,
                     s.discard);
        // Compared without adding first: keep and discard may each be as large as INT64_MAX.
        KVDIFF_CHECK(s.keep <= c.length && s.discard <= c.length - s.keep,
                     "steps[{}].discard: keep + discard = {} is beyond conversation {}'s length {}",
                     i, static_cast<uint64_t>(s.keep) + static_cast<uint64_t>(s.discard),
                     s.conversation, c.length);
        KVDIFF_CHECK(!config.Windowed(),
                     "steps[{}]: a shift on a model with a sliding window ({} positions): a "
                     "sliding-window conversation cannot shift its context (its window counts "
                     "positions that a shift would move)",
                     i, config.sliding_window);
        KVDIFF_CHECK(scenario.driver == DriverKind::kSession,
                     "steps[{}]: a shift needs the session driver (driver \"{}\" has no way to "
                     "move cached positions)",
                     i, DriverName(scenario.driver));
        break;
      }
    }
    if (s.op == Op::kNewConversation || s.op == Op::kFork) ended.erase(s.conversation);
    convs.Apply(s);
  }
  ValidateCacheFits(scenario, config, 4);
}

// Every live conversation's cache is held by every backend at once: a few MB of scenario (20,000
// forks of a long conversation) could ask for terabytes. Refused when the K and V of the positions
// alive at one time exceed this machine's memory, before anything runs.
void ValidateCacheFits(const Scenario& scenario, const format::LlamaConfig& config,
                       int64_t value_bytes) {
  const double memory = format::PhysicalMemoryBytes();
  if (memory <= 0) return;
  const double per_position = 2.0 * static_cast<double>(value_bytes) *
                              static_cast<double>(config.num_hidden_layers) *
                              static_cast<double>(config.num_key_value_heads * config.head_dim);
  Conversations convs;
  int64_t held = 0;  // positions held by every conversation alive
  for (size_t i = 0; i < scenario.steps.size(); ++i) {
    const Step& s = scenario.steps[i];
    const std::vector<std::string> touched = Touched(s);
    held -= Held(convs, touched);
    convs.Apply(s);
    held += Held(convs, touched);
    const double bytes = per_position * static_cast<double>(held);
    KVDIFF_CHECK(bytes <= memory,
                 "steps[{}] {}: the conversations alive would hold {} positions, {:.3g} GB of {}, "
                 "more than this machine's memory ({:.3g} GB); an end step frees a conversation",
                 i, s.ParamString(), held, bytes / 1e9,
                 value_bytes == 4 ? std::string("float32 KV cache for each backend")
                                  : fmt::format("KV cache for the backends together ({} bytes a "
                                                "cached value)",
                                                value_bytes),
                 memory / 1e9);
  }
}

void ValidateScenarioFor(const Scenario& scenario, const BackendInfo& b) {
  for (size_t i = 0; i < scenario.steps.size() && !b.shifts; ++i) {
    KVDIFF_CHECK(scenario.steps[i].op != Op::kShift,
                 "steps[{}] {}: backend {} does not shift a conversation's positions, so it "
                 "cannot run shift steps (they run on {}, and on engines that say they shift: a "
                 "plugin of ABI 3 with a shift call, an exec: program whose info says shifts 1; "
                 "leave {} out of the backends)",
                 i, scenario.steps[i].ParamString(), b.name,
                 fmt::join(BackendRegistry::Global().ShiftingBackends(), ", "), b.name);
  }
  if (b.max_length <= 0 && b.max_sessions <= 0 && b.max_batch_tokens <= 0) return;
  Conversations convs;
  for (size_t i = 0; i < scenario.steps.size(); ++i) {
    const Step& s = scenario.steps[i];
    int64_t batch_tokens = 0;
    for (const ForwardCall& call : convs.CallsOf(s)) {
      KVDIFF_CHECK(b.max_length <= 0 || call.first_position + call.size <= b.max_length,
                   "steps[{}] {}: conversation \"{}\" would reach {} positions, more than backend "
                   "{} holds (max_length {})",
                   i, s.ParamString(), call.conversation, call.first_position + call.size, b.name,
                   b.max_length);
      batch_tokens = s.op == Op::kBatch ? batch_tokens + call.size : call.size;
      KVDIFF_CHECK(b.max_batch_tokens <= 0 || batch_tokens <= b.max_batch_tokens,
                   "steps[{}] {}: a call of {} tokens, more than backend {} takes in one call "
                   "(max_batch_tokens {})",
                   i, s.ParamString(), batch_tokens, b.name, b.max_batch_tokens);
    }
    convs.Apply(s);
    const auto alive = static_cast<int64_t>(convs.Names().size());
    KVDIFF_CHECK(b.max_sessions <= 0 || alive <= b.max_sessions,
                 "steps[{}] {}: {} conversations alive at once, more than backend {} holds "
                 "(max_sessions {}; an end step frees one)",
                 i, s.ParamString(), alive, b.name, b.max_sessions);
  }
}

}  // namespace kvdiff::harness
