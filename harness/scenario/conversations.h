// The conversations of a scenario as its steps leave them: each one's length and whether the
// logits of its last position exist. The one walk over the steps that the validation, the
// prompt tokenizing, the replay, the coverage count and the case generator all make; each keeps
// only what is its own (messages, driver calls, recorded rows, random choices) beside it.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "harness/scenario/scenario.h"

namespace kvdiff::harness {

struct ConversationState {
  int64_t length = 0;         // positions 0..length-1 have been fed
  bool has_last_row = false;  // position length-1 has logits: a decode chooses from them
  int64_t furthest = 0;       // the longest it has been since it started (a fork's: its source's)
};

// The shortest length a truncate of `c` may go to under a sliding window of `window` positions
// (0: none): 0 while its window has dropped nothing (it never held more than `window`
// positions), else its furthest length minus one. A ring of W positions (impl's KvCache) holds
// furthest-W..; the query at L needs L-W+1..L-1, held only for L >= furthest - 1.
int64_t ShortestTruncate(const ConversationState& c, int64_t window);

// One forward call of a step: `size` tokens fed to `conversation` from `first_position` on.
struct ForwardCall {
  std::string conversation;
  int64_t first_position = 0;
  int64_t size = 0;
};

class Conversations {
 public:
  Conversations();  // "main" exists from the start, empty

  bool Exists(const std::string& name) const;
  // The state of an existing conversation (an internal error otherwise: ask Exists first).
  const ConversationState& At(const std::string& name) const;
  // Every conversation, in the order the steps created them ("main" first).
  const std::vector<std::string>& Names() const { return names_; }

  // The forward calls `step` makes from the state before it: a prefill's chunks (its tokens in
  // one call without chunks), a decode's n calls of one token, a batch's items (all in ONE engine
  // call, one entry per item); none for the other ops.
  std::vector<ForwardCall> CallsOf(const Step& step) const;

  // The state after `step`. Checks nothing (the validation does, with the step's index in its
  // messages): a conversation the step names and that does not exist is created, empty, first,
  // so a walk over a scenario not yet validated does not throw.
  void Apply(const Step& step);

 private:
  ConversationState& Get(const std::string& name);  // created empty when missing

  std::map<std::string, ConversationState> states_;
  std::vector<std::string> names_;  // the keys of states_, in creation order
};

}  // namespace kvdiff::harness
