#include "tests/props/properties.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "harness/backend/registry.h"

namespace kvdiff::props {

CaseSetup Setup(const Target& target) {
  CaseSetup setup;
  setup.model = *target.models;
  auto weights = setup.model.MakeWeights();
  setup.system = target.system(weights);
  if (target.oracle) setup.oracle_owned = target.oracle(weights);
  setup.oracle = setup.oracle_owned ? setup.oracle_owned.get() : setup.system.get();
  setup.vocab = setup.model.config.vocab_size;
  setup.capacity = target.Capacity(setup.model);
  LastCaseSize() = CaseSize{};
  LastCaseSize().layers = setup.model.config.num_hidden_layers;
  std::ostringstream printed;
  printed << setup.model;
  LastCaseSize().model = printed.str();
  return setup;
}

namespace {

Tokens Concat(Tokens a, const Tokens& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Appends the pieces of tokens (split by chunks) and checks every returned row against
// want (ForwardFull of the whole history); history_before is the session's length beforehand.
// Returns the logits of the last piece.
Logits AppendChecked(harness::BackendSession& session, const Tokens& tokens,
                     const std::vector<int64_t>& chunks, const Logits& want, int64_t history_before,
                     const harness::Tolerance& tolerance, const std::string& what) {
  int64_t position = history_before;
  Logits got;
  for (const Tokens& piece : SplitTokens(tokens, chunks)) {
    got = session.Append(piece);
    RC_ASSERT(got.rows() == static_cast<Eigen::Index>(piece.size()));
    AssertRowsClose(got, 0, want, position, static_cast<int64_t>(piece.size()), tolerance,
                    fmt::format("{} (chunk of {} at position {})", what, piece.size(), position));
    position += static_cast<int64_t>(piece.size());
  }
  return got;
}

}  // namespace

BackendFactory ImplFactory() {
  return [](std::shared_ptr<const format::ModelWeights> weights) {
    return harness::MakeBackend("impl", std::move(weights), /*threads=*/1);
  };
}

BackendFactory RefFactory() {
  return [](std::shared_ptr<const format::ModelWeights> weights) {
    return harness::MakeBackend("ref", std::move(weights), /*threads=*/1);
  };
}

CaseSize& LastCaseSize() {
  static CaseSize size;
  return size;
}

Token Argmax(const Logits& logits, int64_t row) {
  Eigen::Index index = 0;
  logits.row(row).maxCoeff(&index);
  return static_cast<Token>(index);
}

double RowGate(const harness::Tolerance& tolerance, const Logits& want, int64_t row) {
  return tolerance.GateFor(static_cast<double>(want.row(row).cwiseAbs().maxCoeff()));
}

void AssertRowsClose(const Logits& got, int64_t got_row0, const Logits& want, int64_t want_row0,
                     int64_t rows, const harness::Tolerance& tolerance, const std::string& what) {
  RC_ASSERT(got.cols() == want.cols());
  for (int64_t r = 0; r < rows; ++r) {
    // Logits are row-major, so a row is contiguous: the reports' own comparison, row by row.
    const harness::RowComparison c = harness::CompareRows(
        got.row(got_row0 + r).data(), want.row(want_row0 + r).data(), got.cols(), tolerance);
    if (c.nonfinite) {
      const std::string message =
          fmt::format("{}: position {}: non-finite logit at index {}: {} vs {}", what,
                      want_row0 + r, c.nonfinite_index, c.nonfinite_a, c.nonfinite_b);
      RC_FAIL(message);
    }
    if (!c.within_tolerance) {
      const std::string message =
          fmt::format("{}: position {}: max |a-b| = {:.3g} > {:g} (argmax {} vs {})", what,
                      want_row0 + r, c.max_abs_diff, c.gate, c.argmax_a, c.argmax_b);
      RC_FAIL(message);
    }
  }
}

void ChunkingProperty(const Target& target) {
  CaseSetup s = Setup(target);
  const Tokens prompt = *GenPrompt(s.vocab, s.capacity);
  const auto chunks = *GenChunks(static_cast<int64_t>(prompt.size()));
  LastCaseSize().tokens = static_cast<int64_t>(prompt.size());
  const Logits want = s.oracle->ForwardFull(prompt);
  auto session = s.system->NewSession();
  AppendChecked(*session, prompt, chunks, want, 0, target.tolerance, "chunked prefill");
  RC_ASSERT(session->Length() == static_cast<int64_t>(prompt.size()));
}

void DecodeProperty(const Target& target) {
  CaseSetup s = Setup(target);
  const Tokens prompt = *GenPrompt(s.vocab, s.capacity - 1);  // room for at least one step
  const int64_t room = s.capacity - static_cast<int64_t>(prompt.size());
  const int64_t steps = *rc::gen::inRange<int64_t>(1, std::min<int64_t>(room, 8) + 1);
  const auto chunks = *GenChunks(static_cast<int64_t>(prompt.size()));
  LastCaseSize().tokens = static_cast<int64_t>(prompt.size()) + steps;

  const Logits prefill_want = s.oracle->ForwardFull(prompt);
  auto session = s.system->NewSession();
  // The cached greedy loop: each step feeds the argmax of the session's previous last row.
  Logits last =
      AppendChecked(*session, prompt, chunks, prefill_want, 0, target.tolerance, "prefill")
          .bottomRows(1);
  Tokens history = prompt;
  for (int64_t step = 0;; ++step) {
    // The uncached greedy loop: ForwardFull of the whole history at every step.
    const Logits want = step == 0 ? prefill_want : s.oracle->ForwardFull(history);
    const int64_t p = static_cast<int64_t>(history.size()) - 1;
    AssertRowsClose(last, 0, want, p, 1, target.tolerance,
                    fmt::format("decode step {} (token {} at position {})", step, history[p], p));
    if (step == steps) break;
    const Token cached = Argmax(last, 0);
    const Token uncached = Argmax(want, p);
    if (cached != uncached) {
      // Only an exact tie (within the tolerance) may pick another token; then the two greedy
      // loops legitimately part and there is nothing more to compare.
      const double margin = want(p, uncached) - want(p, cached);
      RC_ASSERT(margin <= 2 * RowGate(target.tolerance, want, p));
      return;
    }
    history.push_back(cached);
    last = session->Append({cached});
    RC_ASSERT(last.rows() == 1);
  }
  RC_ASSERT(session->Length() == static_cast<int64_t>(history.size()));
}

void ReuseProperty(const Target& target, const ReuseOptions& options) {
  CaseSetup s = Setup(target);
  const int64_t max_second =
      options.max_second_prompt > 0 ? std::min(options.max_second_prompt, s.capacity) : s.capacity;
  RC_PRE(options.min_second_prompt <= max_second);
  const Tokens first = *GenPrompt(s.vocab, s.capacity);
  const auto first_chunks = *GenChunks(static_cast<int64_t>(first.size()));
  const int64_t second_length =
      *rc::gen::inRange<int64_t>(options.min_second_prompt, max_second + 1);
  const Tokens second = *GenTokens(s.vocab, second_length);
  const auto second_chunks = *GenChunks(second_length);
  const bool new_session = *rc::gen::arbitrary<bool>();  // else Reset() the same session
  LastCaseSize().tokens = static_cast<int64_t>(first.size()) + second_length;

  // A fresh process: a new backend that has never seen the first conversation.
  auto fresh_backend = target.system(s.model.MakeWeights());
  auto fresh = fresh_backend->NewSession();
  Logits fresh_rows(second_length, s.vocab);
  int64_t row = 0;
  for (const Tokens& piece : SplitTokens(second, second_chunks)) {
    fresh_rows.middleRows(row, piece.size()) = fresh->Append(piece);
    row += static_cast<int64_t>(piece.size());
  }

  auto session = s.system->NewSession();
  for (const Tokens& piece : SplitTokens(first, first_chunks)) session->Append(piece);
  std::unique_ptr<harness::BackendSession> other;
  harness::BackendSession* second_session = session.get();
  if (new_session) {
    other = s.system->NewSession();  // the first session stays alive beside it
    second_session = other.get();
  } else {
    session->Reset();
  }
  AppendChecked(*second_session, second, second_chunks, fresh_rows, 0, target.tolerance,
                new_session ? "second conversation in a new session vs a fresh process"
                            : "second conversation after Reset() vs a fresh process");
  AssertRowsClose(fresh_rows, 0, s.oracle->ForwardFull(second), 0, second_length, target.tolerance,
                  "fresh process vs ForwardFull");
  RC_ASSERT(second_session->Length() == second_length);
}

void TruncateProperty(const Target& target) {
  CaseSetup s = Setup(target);
  const Tokens history = *GenPrompt(s.vocab, s.capacity);
  const auto history_chunks = *GenChunks(static_cast<int64_t>(history.size()));
  const int64_t keep = *rc::gen::inRange<int64_t>(0, static_cast<int64_t>(history.size()) + 1);
  const Tokens continuation = *GenPrompt(s.vocab, s.capacity - keep);
  const auto chunks = *GenChunks(static_cast<int64_t>(continuation.size()));
  LastCaseSize().tokens = static_cast<int64_t>(history.size() + continuation.size());

  auto session = s.system->NewSession();
  for (const Tokens& piece : SplitTokens(history, history_chunks)) session->Append(piece);
  session->Truncate(keep);
  const Tokens kept(history.begin(), history.begin() + keep);
  const Tokens expected_history = Concat(kept, continuation);
  AppendChecked(*session, continuation, chunks, s.oracle->ForwardFull(expected_history), keep,
                target.tolerance, fmt::format("append after Truncate({})", keep));
  RC_ASSERT(session->Length() == static_cast<int64_t>(expected_history.size()));
}

void ForkProperty(const Target& target) {
  CaseSetup s = Setup(target);
  const int64_t prefix_length = *rc::gen::inRange<int64_t>(0, s.capacity - 1);
  const Tokens prefix = *GenTokens(s.vocab, prefix_length);
  const int64_t room = s.capacity - prefix_length;  // >= 2
  const Tokens parent_more = *GenPrompt(s.vocab, room);
  const Tokens fork_more = *GenPrompt(s.vocab, room - 1);
  const Tokens fork_more2 = *GenPrompt(s.vocab, room - static_cast<int64_t>(fork_more.size()));
  LastCaseSize().tokens =
      prefix_length +
      static_cast<int64_t>(parent_more.size() + fork_more.size() + fork_more2.size());

  auto parent = s.system->NewSession();
  if (!prefix.empty()) parent->Append(prefix);
  auto fork = parent->Fork();
  RC_ASSERT(fork->Length() == prefix_length);
  const Tokens fork_history = Concat(prefix, fork_more);
  const Tokens parent_history = Concat(prefix, parent_more);
  const Tokens fork_history2 = Concat(fork_history, fork_more2);
  // Interleaved on purpose: fork, parent, fork again; each must see only its own history.
  const int64_t n_fork = static_cast<int64_t>(fork_more.size());
  AppendChecked(*fork, fork_more, {n_fork}, s.oracle->ForwardFull(fork_history), prefix_length,
                target.tolerance, "fork");
  AppendChecked(*parent, parent_more, {static_cast<int64_t>(parent_more.size())},
                s.oracle->ForwardFull(parent_history), prefix_length, target.tolerance,
                "parent after its fork appended");
  AppendChecked(*fork, fork_more2, {static_cast<int64_t>(fork_more2.size())},
                s.oracle->ForwardFull(fork_history2), prefix_length + n_fork, target.tolerance,
                "fork after its parent appended");
  RC_ASSERT(parent->Length() == static_cast<int64_t>(parent_history.size()));
  RC_ASSERT(fork->Length() == static_cast<int64_t>(fork_history2.size()));
}

}  // namespace kvdiff::props
