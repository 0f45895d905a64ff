// ValidateScenario: a scenario's steps checked against its model before anything runs, each refusal
// naming the step and field.
#include <fmt/format.h>

#include <string>

#include "format/error.h"
#include "harness/scenario/conversations.h"
#include "harness/scenario/scenario.h"

namespace kvdiff::harness {

void ValidateScenario(const Scenario& scenario, const format::LlamaConfig& config) {
  Conversations convs;
  const int64_t max_len = config.max_position_embeddings;
  auto find = [&](const std::string& name, size_t i, const char* field) -> ConversationState {
    KVDIFF_CHECK(convs.Exists(name),
                 "steps[{}].{}: no conversation named \"{}\" (create it first with "
                 "new_conversation or fork)",
                 i, field, name);
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
        const ConversationState c = find(s.conversation, i, "conversation");
        KVDIFF_CHECK(!s.tokens.empty(), "steps[{}].text: the text was not tokenized", i);
        if (!s.chunks.empty()) {
          int64_t sum = 0;
          for (int64_t k : s.chunks) sum += k;
          KVDIFF_CHECK(sum == static_cast<int64_t>(s.tokens.size()),
                       "steps[{}].chunks: sizes sum to {} but the text has {} tokens", i, sum,
                       s.tokens.size());
        }
        for (size_t t = 0; t < s.tokens.size(); ++t) {
          KVDIFF_CHECK(s.tokens[t] >= 0 && s.tokens[t] < config.vocab_size,
                       "steps[{}].tokens[{}]: token id {} is outside the vocabulary [0, {})", i, t,
                       s.tokens[t], config.vocab_size);
        }
        const int64_t reached = c.length + static_cast<int64_t>(s.tokens.size());
        KVDIFF_CHECK(reached <= max_len,
                     "steps[{}]: conversation \"{}\" would reach {} positions, beyond the model's "
                     "max_position_embeddings {}",
                     i, s.conversation, reached, max_len);
        break;
      }
      case Op::kDecode: {
        const ConversationState c = find(s.conversation, i, "conversation");
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
        const ConversationState c = find(s.conversation, i, "conversation");
        KVDIFF_CHECK(s.length <= c.length,
                     "steps[{}].length: cannot truncate conversation \"{}\" to {}: it has {} "
                     "positions",
                     i, s.conversation, s.length, c.length);
        break;
      }
      case Op::kFork:
        find(s.from, i, "from");
        KVDIFF_CHECK(!convs.Exists(s.to), "steps[{}].to: conversation \"{}\" already exists", i,
                     s.to);
        break;
      case Op::kReset:
        find(s.conversation, i, "conversation");
        break;
    }
    convs.Apply(s);
  }
}

}  // namespace kvdiff::harness
