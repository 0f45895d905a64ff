// A scenario's steps: their names, constructors and the one-line form reports print.
#include <fmt/format.h>

#include <string>
#include <utility>
#include <vector>

#include "harness/scenario/scenario.h"

namespace kvdiff::harness {

std::string OpName(Op op) {
  switch (op) {
    case Op::kNewConversation:
      return "new_conversation";
    case Op::kPrefill:
      return "prefill";
    case Op::kDecode:
      return "decode";
    case Op::kTruncate:
      return "truncate";
    case Op::kFork:
      return "fork";
    case Op::kReset:
      return "reset";
    case Op::kEnd:
      return "end";
    case Op::kBatch:
      return "batch";
    case Op::kShift:
      return "shift";
  }
  return "?";
}

std::string BatchLogitsName(BatchLogits logits) {
  switch (logits) {
    case BatchLogits::kAll:
      return "all";
    case BatchLogits::kLast:
      return "last";
    case BatchLogits::kNone:
      return "none";
  }
  return "?";
}

std::vector<bool> BatchEntry::OutputFlags() const {
  std::vector<bool> flags(Size(), logits == BatchLogits::kAll);
  if (logits == BatchLogits::kLast && !flags.empty()) flags.back() = true;
  return flags;
}

std::string BatchEntry::ParamString() const {
  std::string s = conversation + ":" + (decode ? "decode" : std::to_string(tokens.size()));
  if (logits != BatchLogits::kAll) s += "/" + BatchLogitsName(logits);
  return s;
}

Step Step::NewConversation(const std::string& name) {
  Step s;
  s.op = Op::kNewConversation;
  s.name = s.conversation = name;
  return s;
}

Step Step::Prefill(const std::string& conversation, Tokens tokens, std::vector<int64_t> chunks) {
  Step s;
  s.op = Op::kPrefill;
  s.conversation = conversation;
  s.tokens = std::move(tokens);
  s.chunks = std::move(chunks);
  return s;
}

Step Step::PrefillText(const std::string& conversation, std::string text,
                       std::vector<int64_t> chunks) {
  Step s = Prefill(conversation, {}, std::move(chunks));
  s.text = std::move(text);
  return s;
}

Step Step::PrefillChat(const std::string& conversation, std::vector<format::ChatMessage> messages,
                       std::vector<int64_t> chunks) {
  Step s = Prefill(conversation, {}, std::move(chunks));
  s.messages = std::move(messages);
  return s;
}

Step Step::Decode(const std::string& conversation, int64_t n) {
  Step s;
  s.op = Op::kDecode;
  s.conversation = conversation;
  s.n = n;
  return s;
}

Step Step::Truncate(const std::string& conversation, int64_t length) {
  Step s;
  s.op = Op::kTruncate;
  s.conversation = conversation;
  s.length = length;
  return s;
}

Step Step::Fork(const std::string& from, const std::string& to) {
  Step s;
  s.op = Op::kFork;
  s.from = from;
  s.to = s.conversation = to;
  return s;
}

Step Step::Reset(const std::string& conversation) {
  Step s;
  s.op = Op::kReset;
  s.conversation = conversation;
  return s;
}

Step Step::End(const std::string& conversation) {
  Step s;
  s.op = Op::kEnd;
  s.conversation = conversation;
  return s;
}

Step Step::Batch(std::vector<BatchEntry> items) {
  Step s;
  s.op = Op::kBatch;
  s.items = std::move(items);
  s.conversation = s.items.empty() ? std::string("main") : s.items.front().conversation;
  return s;
}

Step Step::Shift(const std::string& conversation, int64_t keep, int64_t discard) {
  Step s;
  s.op = Op::kShift;
  s.conversation = conversation;
  s.keep = keep;
  s.discard = discard;
  return s;
}

std::vector<std::string> Step::ConversationsActedOn() const {
  if (op == Op::kFork) return {from, to};
  if (op != Op::kBatch) return {conversation};
  std::vector<std::string> names;
  for (const BatchEntry& item : items) names.push_back(item.conversation);
  return names;
}

std::string Step::ParamString() const {
  switch (op) {
    case Op::kNewConversation:
      return fmt::format("new_conversation({})", name);
    case Op::kPrefill: {
      std::string s = fmt::format("prefill({},n={}", conversation, tokens.size());
      if (text && tokens.empty()) s = fmt::format("prefill({},text", conversation);
      if (messages && tokens.empty()) s = fmt::format("prefill({},messages", conversation);
      if (chunks.size() > 1) {
        s += ",chunks=";
        for (size_t i = 0; i < chunks.size(); ++i) s += (i ? "+" : "") + std::to_string(chunks[i]);
      }
      return s + ")";
    }
    case Op::kDecode:
      return fmt::format("decode({},n={})", conversation, n);
    case Op::kTruncate:
      return fmt::format("truncate({},length={})", conversation, length);
    case Op::kFork:
      return fmt::format("fork({}->{})", from, to);
    case Op::kReset:
      return fmt::format("reset({})", conversation);
    case Op::kEnd:
      return fmt::format("end({})", conversation);
    case Op::kBatch: {
      std::string s = "batch(";
      for (size_t i = 0; i < items.size(); ++i) s += (i ? "," : "") + items[i].ParamString();
      return s + ")";
    }
    case Op::kShift:
      return fmt::format("shift({},keep={},discard={})", conversation, keep, discard);
  }
  return "?";
}

}  // namespace kvdiff::harness
