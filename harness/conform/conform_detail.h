// What the checks of `kvdiff conform` share (conform.cc, conform_batch.cc; the Probe's code is in
// conform_probe.cc): the engine under test and its oracle, sessions whose history is tracked,
// appends and batched calls held to the oracle's uncached forward, expected refusals. A check is a
// function of a Probe that returns its figures, throws Nonconformance when the engine does not do
// what it asks and NotApplicable when it does not apply to the model. Not for use outside conform.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "harness/backend/backend.h"
#include "harness/compare/gate.h"

namespace kvdiff::harness::conform_detail {

// What a check throws when the engine does not do what it asks; the message is the report's.
class Nonconformance : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// What a check throws when it does not apply to this model (it is reported as skipped, and why).
class NotApplicable : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Probe {
 public:
  Probe(const Backend& engine, const Backend& oracle, const Gate& gate, uint64_t seed);

  struct Conversation {
    std::unique_ptr<BackendSession> session;
    Tokens history;  // what the session must hold: the oracle's input
  };

  // A new session, which must say it holds nothing.
  Conversation New() const;
  // A fork of `c`, which must say it holds c's history (and c must still say so).
  Conversation Fork(const Conversation& c, const std::string& what) const;
  int64_t vocab() const { return engine_.config().vocab_size; }
  int64_t max_positions() const { return engine_.config().max_position_embeddings; }

  // n tokens drawn from the whole vocabulary (the same for a given seed on every platform).
  Tokens RandomTokens(int64_t n);

  // Appends `tokens` and holds the n new rows to the oracle's uncached rows of the whole history;
  // checks the shape, the NaN/inf policy and the length the session reports. Returns the rows.
  Logits Append(Conversation& c, const Tokens& tokens, const std::string& what);

  // One item of a batched call: the conversation, the tokens it appends, the rows that come back.
  struct BatchPart {
    Conversation* conversation = nullptr;
    Tokens tokens;
    std::vector<bool> output;  // one flag per token; empty: every row
  };
  // ONE Backend::AppendBatch call of every part, as a serving engine runs them. Holds each part's
  // returned rows (their shape, NaN/inf, values) to the oracle's uncached rows of its new history,
  // and every session's Length() to its history. Returns each part's rows.
  std::vector<Logits> AppendBatch(const std::vector<BatchPart>& parts, const std::string& what);

  // Holds `got` to `want`, two ways the engine computed the same rows (a batch and the items
  // alone, twins in one call), row by row within the run's tolerance: the rows are at `positions`
  // of their conversation. The worst difference is kept for SameRowsFigure().
  void ExpectSameRows(const Logits& got, const Logits& want, const std::vector<int64_t>& positions,
                      const std::string& what);

  void ExpectLength(const Conversation& c, const std::string& what) const;

  // The call must be refused as bad input (an InputError: KVDIFF_INVALID_INPUT for a plugin) and
  // leave every conversation in `unchanged` as it was: same length, and the next append still
  // right.
  void ExpectRefused(const std::vector<Conversation*>& unchanged, const std::string& what,
                     const std::function<void()>& call);
  void ExpectRefused(Conversation& c, const std::string& what, const std::function<void()>& call) {
    ExpectRefused(std::vector<Conversation*>{&c}, what, call);
  }

  template <typename... Args>
  [[noreturn]] static void Fail(fmt::format_string<Args...> format, Args&&... args) {
    throw Nonconformance(fmt::format(format, std::forward<Args>(args)...));
  }

  // "N rows, max |a-b| D" for the rows compared with the oracle since the last call.
  std::string Figures();
  // "max |a-b| D over N rows" for the rows ExpectSameRows compared since the last call.
  std::string SameRowsFigure();
  std::string LastRefusal() const { return refusals_.empty() ? "" : refusals_.back(); }
  int64_t Refusals() const { return static_cast<int64_t>(refusals_.size()); }
  const Backend& engine() const { return engine_; }

 private:
  // Holds got's rows, at `positions` of `history`, to the oracle's uncached rows of `history`.
  void ExpectOracleRows(const Tokens& history, const Logits& got,
                        const std::vector<int64_t>& positions, const std::string& what);

  const Backend& engine_;
  const Backend& oracle_;
  Gate gate_;
  uint64_t rng_;
  int64_t rows_ = 0, same_rows_ = 0;
  double worst_ = 0, same_worst_ = 0;
  std::vector<std::string> refusals_;
};

// The last refusal's message, shortened for the table.
std::string Refused(const Probe& p);

struct CheckDef {
  const char* name;
  const char* what;
  std::function<std::string(Probe&)> run;
};

// The checks of batched calls (Backend::AppendBatch): conform_batch.cc.
std::vector<CheckDef> BatchChecks();

}  // namespace kvdiff::harness::conform_detail
