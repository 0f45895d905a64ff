// Property 6: stateful testing with rc::state (emil-e/rapidcheck doc/state.md).
// The model is each conversation's token history; the system is one backend session per
// conversation. Every command's arguments are drawn from the model, every precondition (the
// capacity included) is asserted in checkPreconditions, so shrinking only ever tries valid
// sequences, and show() prints each command so a shrunk counterexample reads as a script.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <rapidcheck/state.h>

#include <map>
#include <numeric>

#include "tests/props/properties.h"

namespace kvdiff::props {
namespace {

constexpr size_t kMaxConversations = 4;
constexpr int64_t kMaxDecodeSteps = 4;

// ForwardFull of the oracle, memoised: apply() of Decode needs the oracle's greedy tokens and is
// called again and again while RapidCheck generates and shrinks sequences. The model owns it
// (shared_ptr): RapidCheck keeps a copy of the initial model and calls apply() on it while
// shrinking, after the property function that made it has returned.
class Oracle {
 public:
  explicit Oracle(std::shared_ptr<const harness::Backend> backend) : backend_(std::move(backend)) {}
  const Logits& Full(const Tokens& history) const {
    auto it = memo_.find(history);
    if (it == memo_.end()) it = memo_.emplace(history, backend_->ForwardFull(history)).first;
    return it->second;
  }

 private:
  std::shared_ptr<const harness::Backend> backend_;
  mutable std::map<Tokens, Logits> memo_;
};

struct Conversations {  // the model
  std::vector<Tokens> histories;
  int64_t capacity = 0;
  int64_t vocab = 0;
  std::shared_ptr<const Oracle> oracle;
};

struct Sessions {  // the system under test
  const harness::Backend* backend = nullptr;
  std::vector<std::unique_ptr<harness::BackendSession>> sessions;
  harness::Tolerance tolerance = kTolerance;
};

using Command = rc::state::Command<Conversations, Sessions>;

// Every command that names a conversation draws it from those that exist.
int64_t DrawConversation(const Conversations& m) {
  return *GenUniform(0, std::max<int64_t>(1, static_cast<int64_t>(m.histories.size())));
}

void CountCommand() { LastCaseSize().commands += 1; }

struct NewConversation : Command {
  void checkPreconditions(const Conversations& m) const override {
    RC_PRE(m.histories.size() < kMaxConversations);
  }
  void apply(Conversations& m) const override { m.histories.emplace_back(); }
  void run(const Conversations& m, Sessions& sut) const override {
    CountCommand();
    sut.sessions.push_back(sut.backend->NewSession());
    RC_ASSERT(sut.sessions.back()->Length() == 0);
  }
  void show(std::ostream& os) const override { os << "NewConversation()"; }
};

struct Prefill : Command {
  int64_t conv;
  Tokens tokens;
  std::vector<int64_t> chunks;

  explicit Prefill(const Conversations& m) : conv(DrawConversation(m)) {
    const int64_t used = conv < static_cast<int64_t>(m.histories.size())
                             ? static_cast<int64_t>(m.histories[conv].size())
                             : 0;
    tokens = *GenPrompt(m.vocab, std::max<int64_t>(1, m.capacity - used));
    chunks = *GenChunks(static_cast<int64_t>(tokens.size()));
  }
  void checkPreconditions(const Conversations& m) const override {
    RC_PRE(conv < static_cast<int64_t>(m.histories.size()));
    RC_PRE(!tokens.empty());
    RC_PRE(static_cast<int64_t>(m.histories[conv].size() + tokens.size()) <= m.capacity);
    RC_PRE(std::accumulate(chunks.begin(), chunks.end(), int64_t{0}) ==
           static_cast<int64_t>(tokens.size()));
    for (Token t : tokens) RC_PRE(t >= 0 && t < m.vocab);
  }
  void apply(Conversations& m) const override {
    m.histories[conv].insert(m.histories[conv].end(), tokens.begin(), tokens.end());
  }
  void run(const Conversations& m, Sessions& sut) const override {
    CountCommand();
    Tokens history = m.histories[conv];
    const int64_t before = static_cast<int64_t>(history.size());
    history.insert(history.end(), tokens.begin(), tokens.end());
    const Logits& want = m.oracle->Full(history);
    LastCaseSize().tokens += static_cast<int64_t>(tokens.size());
    int64_t position = before;
    for (const Tokens& piece : SplitTokens(tokens, chunks)) {
      const Logits got = sut.sessions[conv]->Append(piece);
      RC_ASSERT(got.rows() == static_cast<Eigen::Index>(piece.size()));
      AssertRowsClose(got, 0, want, position, static_cast<int64_t>(piece.size()), sut.tolerance,
                      fmt::format("conversation {}: prefill chunk at {}", conv, position));
      position += static_cast<int64_t>(piece.size());
    }
    RC_ASSERT(sut.sessions[conv]->Length() == static_cast<int64_t>(history.size()));
  }
  void show(std::ostream& os) const override {
    os << fmt::format("Prefill(conv={}, tokens=[{}], chunks={})", conv, fmt::join(tokens, ","),
                      fmt::join(chunks, "+"));
  }
};

struct Decode : Command {
  int64_t conv;
  int64_t steps;

  explicit Decode(const Conversations& m)
      : conv(DrawConversation(m)), steps(*rc::gen::inRange<int64_t>(1, kMaxDecodeSteps + 1)) {}
  void checkPreconditions(const Conversations& m) const override {
    RC_PRE(conv < static_cast<int64_t>(m.histories.size()));
    RC_PRE(!m.histories[conv].empty());  // greedy decoding continues from a last row
    RC_PRE(static_cast<int64_t>(m.histories[conv].size()) + steps <= m.capacity);
  }
  // The greedy continuation, from the oracle (the uncached greedy loop).
  Tokens Greedy(const Conversations& m) const {
    Tokens history = m.histories[conv];
    for (int64_t i = 0; i < steps; ++i) {
      const Logits& full = m.oracle->Full(history);
      history.push_back(Argmax(full, full.rows() - 1));
    }
    return history;
  }
  void apply(Conversations& m) const override { m.histories[conv] = Greedy(m); }
  void run(const Conversations& m, Sessions& sut) const override {
    CountCommand();
    const Tokens history = Greedy(m);
    const Logits& want = m.oracle->Full(history);
    LastCaseSize().tokens += steps;
    for (size_t p = m.histories[conv].size(); p < history.size(); ++p) {
      const Logits got = sut.sessions[conv]->Append({history[p]});
      AssertRowsClose(
          got, 0, want, static_cast<int64_t>(p), 1, sut.tolerance,
          fmt::format("conversation {}: decode of token {} at {}", conv, history[p], p));
    }
    RC_ASSERT(sut.sessions[conv]->Length() == static_cast<int64_t>(history.size()));
  }
  void show(std::ostream& os) const override {
    os << fmt::format("Decode(conv={}, steps={})", conv, steps);
  }
};

struct Truncate : Command {
  int64_t conv;
  int64_t length;

  explicit Truncate(const Conversations& m) : conv(DrawConversation(m)) {
    const int64_t size = conv < static_cast<int64_t>(m.histories.size())
                             ? static_cast<int64_t>(m.histories[conv].size())
                             : 0;
    length = *rc::gen::inRange<int64_t>(0, size + 1);
  }
  void checkPreconditions(const Conversations& m) const override {
    RC_PRE(conv < static_cast<int64_t>(m.histories.size()));
    RC_PRE(length >= 0 && length <= static_cast<int64_t>(m.histories[conv].size()));
  }
  void apply(Conversations& m) const override { m.histories[conv].resize(length); }
  void run(const Conversations& m, Sessions& sut) const override {
    CountCommand();
    sut.sessions[conv]->Truncate(length);
    RC_ASSERT(sut.sessions[conv]->Length() == length);
  }
  void show(std::ostream& os) const override {
    os << fmt::format("Truncate(conv={}, length={})", conv, length);
  }
};

struct Fork : Command {
  int64_t conv;

  explicit Fork(const Conversations& m) : conv(DrawConversation(m)) {}
  void checkPreconditions(const Conversations& m) const override {
    RC_PRE(conv < static_cast<int64_t>(m.histories.size()));
    RC_PRE(m.histories.size() < kMaxConversations);
  }
  void apply(Conversations& m) const override { m.histories.push_back(m.histories[conv]); }
  void run(const Conversations& m, Sessions& sut) const override {
    CountCommand();
    sut.sessions.push_back(sut.sessions[conv]->Fork());
    RC_ASSERT(sut.sessions.back()->Length() == static_cast<int64_t>(m.histories[conv].size()));
  }
  void show(std::ostream& os) const override {
    os << fmt::format("Fork(conv={})", conv);  // the fork is the next conversation number
  }
};

struct Reset : Command {
  int64_t conv;

  explicit Reset(const Conversations& m) : conv(DrawConversation(m)) {}
  void checkPreconditions(const Conversations& m) const override {
    RC_PRE(conv < static_cast<int64_t>(m.histories.size()));
  }
  void apply(Conversations& m) const override { m.histories[conv].clear(); }
  void run(const Conversations& m, Sessions& sut) const override {
    CountCommand();
    sut.sessions[conv]->Reset();
    RC_ASSERT(sut.sessions[conv]->Length() == 0);
  }
  void show(std::ostream& os) const override { os << fmt::format("Reset(conv={})", conv); }
};

}  // namespace

void StatefulProperty(const Target& target) {
  const ModelCase model = *target.models;
  auto weights = model.MakeWeights();
  std::shared_ptr<const harness::Backend> system = target.system(weights);
  std::shared_ptr<const harness::Backend> oracle_backend =
      target.oracle ? target.oracle(weights) : system;
  LastCaseSize() = CaseSize{};
  LastCaseSize().layers = model.config.num_hidden_layers;

  Conversations initial;
  initial.histories.emplace_back();  // conversation 0 exists from the start
  initial.capacity = target.Capacity(model);
  initial.vocab = model.config.vocab_size;
  initial.oracle = std::make_shared<const Oracle>(oracle_backend);
  Sessions sut;
  sut.backend = system.get();
  sut.sessions.push_back(system->NewSession());
  sut.tolerance = target.tolerance;
  rc::state::check(initial, sut, [](const Conversations& m) {
    return rc::state::gen::execOneOfWithArgs<NewConversation, Prefill, Decode, Truncate, Fork,
                                             Reset>()(m);
  });
}

}  // namespace kvdiff::props
