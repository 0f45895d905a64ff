#include "harness/scenario/conversations.h"

#include <algorithm>
#include <stdexcept>

namespace kvdiff::harness {

int64_t ShortestTruncate(const ConversationState& c, int64_t window) {
  if (window <= 0 || c.furthest <= window) return 0;
  return c.furthest - 1;
}

Conversations::Conversations() { Get("main"); }

bool Conversations::Exists(const std::string& name) const { return states_.count(name) > 0; }

const ConversationState& Conversations::At(const std::string& name) const {
  auto it = states_.find(name);
  if (it == states_.end()) throw std::logic_error("Conversations::At: no conversation " + name);
  return it->second;
}

std::vector<ForwardCall> Conversations::CallsOf(const Step& step) const {
  std::vector<ForwardCall> calls;
  auto it = states_.find(step.conversation);
  int64_t position = it == states_.end() ? 0 : it->second.length;
  if (step.op == Op::kPrefill) {
    std::vector<int64_t> chunks = step.chunks;
    if (chunks.empty()) chunks = {static_cast<int64_t>(step.tokens.size())};
    for (int64_t size : chunks) {
      calls.push_back({step.conversation, position, size});
      position += size;
    }
  } else if (step.op == Op::kDecode) {
    for (int64_t k = 0; k < step.n; ++k) calls.push_back({step.conversation, position++, 1});
  } else if (step.op == Op::kBatch) {
    // One engine call: an entry per item, each from its own conversation's length.
    for (const BatchEntry& item : step.items) {
      auto state = states_.find(item.conversation);
      calls.push_back(
          {item.conversation, state == states_.end() ? 0 : state->second.length, item.Size()});
    }
  }
  return calls;
}

void Conversations::Apply(const Step& step) {
  switch (step.op) {
    case Op::kNewConversation:
      Get(step.name) = ConversationState{};
      break;
    case Op::kPrefill: {
      ConversationState& c = Get(step.conversation);
      c.length += static_cast<int64_t>(step.tokens.size());
      c.furthest = std::max(c.furthest, c.length);
      c.has_last_row = true;
      break;
    }
    case Op::kDecode: {
      ConversationState& c = Get(step.conversation);
      c.length += step.n;
      c.furthest = std::max(c.furthest, c.length);
      c.has_last_row = c.has_last_row || step.n > 0;
      break;
    }
    case Op::kTruncate: {
      ConversationState& c = Get(step.conversation);
      if (step.length != c.length) c.has_last_row = false;  // the row of length-1 is gone
      c.length = step.length;
      break;
    }
    case Op::kFork: {
      const ConversationState from = Get(step.from);
      Get(step.to) = from;
      break;
    }
    case Op::kReset:
      Get(step.conversation) = ConversationState{};
      break;
    case Op::kEnd:
      if (states_.erase(step.conversation) > 0)
        names_.erase(std::find(names_.begin(), names_.end(), step.conversation));
      break;
    case Op::kShift: {
      ConversationState& c = Get(step.conversation);
      // The last position's row stays what a decode chooses from, unless it was dropped.
      if (step.discard > 0 && step.keep + step.discard >= c.length) c.has_last_row = false;
      c.length -= step.discard;
      break;
    }
    case Op::kBatch:
      for (const BatchEntry& item : step.items) {
        ConversationState& c = Get(item.conversation);
        c.length += item.Size();
        c.furthest = std::max(c.furthest, c.length);
        c.has_last_row = item.logits != BatchLogits::kNone;
      }
      break;
  }
}

ConversationState& Conversations::Get(const std::string& name) {
  auto [it, created] = states_.try_emplace(name);
  if (created) names_.push_back(name);
  return it->second;
}

}  // namespace kvdiff::harness
