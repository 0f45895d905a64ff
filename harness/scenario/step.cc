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
  }
  return "?";
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
  }
  return "?";
}

}  // namespace kvdiff::harness
