// Property 6: stateful testing with rc::state (emil-e/rapidcheck doc/state.md).
// The model is each conversation's token history; the system is one backend session per
// conversation. Every command's arguments are drawn from the model, every precondition (the
// capacity included) is asserted in checkPreconditions, so shrinking only ever tries valid
// sequences, and show() prints each command so a shrunk counterexample reads as a script.
// Besides one conversation at a time, a Batch command advances several in ONE
// Backend::AppendBatch call, as a serving engine does, and End frees a conversation's session.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <rapidcheck/state.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <vector>

#include "harness/scenario/scenario.h"
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
  // By conversation number. An ended conversation keeps its number (so the commands after an End
  // still name the same conversations when RapidCheck shrinks the End away) and is never named
  // again; it still counts towards kMaxConversations, which keeps every number small, so a shrunk
  // counterexample needs few commands to create the conversations it names.
  std::vector<Tokens> histories;
  std::vector<bool> ended;
  int64_t capacity = 0;
  int64_t vocab = 0;
  std::shared_ptr<const Oracle> oracle;

  bool Live(int64_t conv) const {
    return conv >= 0 && conv < static_cast<int64_t>(histories.size()) && !ended[conv];
  }
  std::vector<int64_t> LiveConversations() const {
    std::vector<int64_t> live;
    for (int64_t c = 0; c < static_cast<int64_t>(histories.size()); ++c)
      if (!ended[c]) live.push_back(c);
    return live;
  }
  void Add(Tokens history) {
    histories.push_back(std::move(history));
    ended.push_back(false);
  }
};

struct Sessions {  // the system under test
  const harness::Backend* backend = nullptr;
  std::vector<std::unique_ptr<harness::BackendSession>> sessions;  // null once ended
  harness::Tolerance tolerance = kTolerance;
};

using Command = rc::state::Command<Conversations, Sessions>;

// Every command that names a conversation draws it from the live ones (0 when there is none: the
// preconditions then refuse the command and RapidCheck draws another).
int64_t DrawConversation(const Conversations& m) {
  const std::vector<int64_t> live = m.LiveConversations();
  if (live.empty()) return 0;
  return live[*GenUniform(0, static_cast<int64_t>(live.size()))];
}

void CountCommand() { LastCaseSize().commands += 1; }

struct NewConversation : Command {
  void checkPreconditions(const Conversations& m) const override {
    RC_PRE(m.histories.size() < kMaxConversations);
  }
  void apply(Conversations& m) const override { m.Add({}); }
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
    RC_PRE(m.Live(conv));
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
    RC_PRE(m.Live(conv));
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
    RC_PRE(m.Live(conv));
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
    RC_PRE(m.Live(conv));
    RC_PRE(m.histories.size() < kMaxConversations);
  }
  void apply(Conversations& m) const override { m.Add(m.histories[conv]); }
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
  void checkPreconditions(const Conversations& m) const override { RC_PRE(m.Live(conv)); }
  void apply(Conversations& m) const override { m.histories[conv].clear(); }
  void run(const Conversations& m, Sessions& sut) const override {
    CountCommand();
    sut.sessions[conv]->Reset();
    RC_ASSERT(sut.sessions[conv]->Length() == 0);
  }
  void show(std::ostream& os) const override { os << fmt::format("Reset(conv={})", conv); }
};

// A serving engine's request that finished: its session is freed. The other conversations must not
// notice (an engine that reuses the freed cells must have cleared them), which the commands after
// it check.
struct End : Command {
  int64_t conv;

  explicit End(const Conversations& m) : conv(DrawConversation(m)) {}
  void checkPreconditions(const Conversations& m) const override { RC_PRE(m.Live(conv)); }
  void apply(Conversations& m) const override { m.ended[conv] = true; }
  void run(const Conversations& /*m*/, Sessions& sut) const override {
    CountCommand();
    sut.sessions[conv].reset();
  }
  void show(std::ostream& os) const override { os << fmt::format("End(conv={})", conv); }
};

// One conversation's part of a Batch: a prompt chunk, or one greedy token (`decode`: the oracle's
// argmax of the history's last row, as Decode feeds), and which of its rows come back.
struct BatchPart {
  int64_t conv = 0;
  harness::BatchEntry entry;  // tokens (empty for a decode item), decode, logits (all/last/none)

  // The tokens this part feeds, given the model before the batch.
  Tokens Fed(const Conversations& m) const {
    if (!entry.decode) return entry.tokens;
    const Logits& full = m.oracle->Full(m.histories[conv]);
    return {Argmax(full, full.rows() - 1)};
  }
};

// Several live conversations advance in ONE Backend::AppendBatch call, in a drawn order: prompt
// chunks and decode tokens mixed, each with its own output flags. A conversation whose history
// equals an earlier item's (a fork's twin) may be given the same tokens, so twins meet in one call.
// Every returned row is held to the oracle's ForwardFull of its history, then every length.
struct Batch : Command {
  std::vector<BatchPart> parts;

  explicit Batch(const Conversations& m) {
    std::vector<int64_t> candidates;  // live, with room for at least one token
    for (int64_t c : m.LiveConversations())
      if (static_cast<int64_t>(m.histories[c].size()) < m.capacity) candidates.push_back(c);
    if (candidates.empty()) return;  // refused by checkPreconditions
    const int64_t n = *GenUniform(1, static_cast<int64_t>(candidates.size()) + 1);
    for (int64_t k = 0; k < n; ++k) {
      const int64_t pick = *GenUniform(0, static_cast<int64_t>(candidates.size()));
      BatchPart part;
      part.conv = candidates[pick];
      candidates.erase(candidates.begin() + pick);
      part.entry.conversation = std::to_string(part.conv);
      const Tokens& history = m.histories[part.conv];
      // Every choice is drawn whether or not it is used, so the draws keep their places when the
      // shrinker changes one of them (RapidCheck replays a command's draws in order).
      const bool same_as_twin = *rc::gen::arbitrary<bool>();
      const bool decode = *GenUniform(0, 3) == 2;
      // From a range that does not move with the history (then cut to the room), for the same
      // reason.
      part.entry.tokens = *GenPrompt(m.vocab, m.capacity);
      part.entry.tokens.resize(
          std::min(part.entry.tokens.size(), static_cast<size_t>(m.capacity) - history.size()));
      part.entry.logits = static_cast<harness::BatchLogits>(*GenUniform(0, 3));
      const auto twin = std::find_if(parts.begin(), parts.end(), [&](const BatchPart& p) {
        return m.histories[p.conv] == history;
      });
      if (same_as_twin && twin != parts.end()) {
        part.entry.tokens = twin->entry.tokens;
        part.entry.decode = twin->entry.decode;
      } else if (decode && !history.empty()) {
        part.entry.tokens.clear();
        part.entry.decode = true;
      }
      parts.push_back(std::move(part));
    }
  }
  void checkPreconditions(const Conversations& m) const override {
    RC_PRE(!parts.empty());
    for (size_t k = 0; k < parts.size(); ++k) {
      const BatchPart& p = parts[k];
      RC_PRE(m.Live(p.conv));
      for (size_t j = 0; j < k; ++j) RC_PRE(parts[j].conv != p.conv);  // a session once per call
      const int64_t length = static_cast<int64_t>(m.histories[p.conv].size());
      if (p.entry.decode) {
        RC_PRE(length > 0 && p.entry.tokens.empty());  // greedy decoding continues from a last row
      } else {
        RC_PRE(!p.entry.tokens.empty());
        for (Token t : p.entry.tokens) RC_PRE(t >= 0 && t < m.vocab);
      }
      RC_PRE(length + p.entry.Size() <= m.capacity);
    }
  }
  void apply(Conversations& m) const override {
    std::vector<Tokens> fed;  // every part's tokens are chosen before the call
    for (const BatchPart& p : parts) fed.push_back(p.Fed(m));
    for (size_t k = 0; k < parts.size(); ++k) {
      Tokens& history = m.histories[parts[k].conv];
      history.insert(history.end(), fed[k].begin(), fed[k].end());
    }
  }
  void run(const Conversations& m, Sessions& sut) const override {
    CountCommand();
    std::vector<harness::BatchItem> items;
    for (const BatchPart& p : parts) {
      items.push_back({sut.sessions[p.conv].get(), p.Fed(m), p.entry.OutputFlags()});
      LastCaseSize().tokens += static_cast<int64_t>(items.back().tokens.size());
    }
    const std::vector<Logits> out = sut.backend->AppendBatch(items);
    RC_ASSERT(out.size() == items.size());
    for (size_t k = 0; k < parts.size(); ++k) {
      const Tokens& before = m.histories[parts[k].conv];
      Tokens history = before;
      history.insert(history.end(), items[k].tokens.begin(), items[k].tokens.end());
      const Logits& want = m.oracle->Full(history);
      RC_ASSERT(out[k].rows() == items[k].OutputRows());
      for (size_t t = 0, row = 0; t < items[k].tokens.size(); ++t) {
        if (!items[k].Outputs(t)) continue;
        const int64_t position = static_cast<int64_t>(before.size() + t);
        AssertRowsClose(out[k], static_cast<int64_t>(row++), want, position, 1, sut.tolerance,
                        fmt::format("conversation {}: batch item {} of {}, token {} at {}",
                                    parts[k].conv, k, parts.size(), items[k].tokens[t], position));
      }
    }
    for (size_t k = 0; k < parts.size(); ++k) {
      RC_ASSERT(sut.sessions[parts[k].conv]->Length() ==
                static_cast<int64_t>(m.histories[parts[k].conv].size() + items[k].tokens.size()));
    }
  }
  void show(std::ostream& os) const override {
    os << "Batch(";
    for (size_t k = 0; k < parts.size(); ++k) {
      const harness::BatchEntry& e = parts[k].entry;
      os << (k ? ", " : "") << "conv=" << parts[k].conv << ":"
         << (e.decode ? "decode" : fmt::format("[{}]", fmt::join(e.tokens, ",")));
      if (e.logits != harness::BatchLogits::kAll) os << "/" << harness::BatchLogitsName(e.logits);
    }
    os << ")";
  }
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
  initial.Add({});  // conversation 0 exists from the start
  initial.capacity = target.Capacity(model);
  initial.vocab = model.config.vocab_size;
  initial.oracle = std::make_shared<const Oracle>(oracle_backend);
  Sessions sut;
  sut.backend = system.get();
  sut.sessions.push_back(system->NewSession());
  sut.tolerance = target.tolerance;
  rc::state::check(initial, sut, [](const Conversations& m) {
    return rc::state::gen::execOneOfWithArgs<NewConversation, Prefill, Decode, Truncate, Fork,
                                             Reset, End, Batch>()(m);
  });
}

}  // namespace kvdiff::props
