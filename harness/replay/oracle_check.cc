#include "harness/replay/oracle_check.h"

#include <fmt/format.h>

#include <algorithm>

#include "format/error.h"

namespace kvdiff::harness {

std::optional<std::string> OracleCheck::StepError(const Recording& recording, size_t i) const {
  if (recording.steps[i].status == StepStatus::kError) return recording.steps[i].message;
  if (!failures[i].empty()) return failures[i];
  return std::nullopt;
}

std::optional<size_t> OracleCheck::FirstError(const Recording& recording) const {
  for (size_t i = 0; i < recording.steps.size(); ++i)
    if (StepError(recording, i)) return i;
  return std::nullopt;
}

OracleCheck CheckAgainstOracle(const Recording& recording, const Backend& oracle,
                               const Tolerance& tolerance) {
  return CheckAgainstOracle(recording, oracle, [&](int64_t) { return tolerance; });
}

namespace {

// The rows of one history (`rows`, indices into rec.rows, positions up to `last`) against one
// ForwardFull over it, into check.rows; "" when it ran, else why it failed.
std::string CheckHistory(const Recording& rec, const Backend& oracle, const GateAt& gate,
                         size_t history, const std::vector<size_t>& rows, OracleCheck& check) {
  const int64_t vocab = oracle.config().vocab_size;
  int64_t last = 0;
  for (size_t k : rows) last = std::max(last, rec.rows[k].position);
  try {
    const Tokens prefix(rec.histories[history].begin(), rec.histories[history].begin() + last + 1);
    const Logits full = oracle.ForwardFull(prefix);  // (last + 1, vocab)
    KVDIFF_CHECK(full.rows() == last + 1 && full.cols() == vocab,
                 "backend {} ForwardFull returned [{}, {}]; expected [{}, {}]", oracle.Name(),
                 full.rows(), full.cols(), last + 1, vocab);
    for (size_t k : rows) {
      const RecordedRow& row = rec.rows[k];
      const float* want = full.row(row.position).data();
      const std::string bad = DescribeNonFinite(want, vocab);
      KVDIFF_CHECK(bad.empty(), "non-finite logits: backend {} ForwardFull, position {}, {}",
                   oracle.Name(), row.position, bad);
      check.rows[k] = CompareRows(row.logits.data(), want, vocab, gate(row.position));
    }
  } catch (const std::exception& e) {
    check.hung = dynamic_cast<const EngineHungError*>(&e) != nullptr;
    return fmt::format("the oracle ForwardFull failed: {}", e.what());
  }
  return "";
}

}  // namespace

OracleCheck CheckAgainstOracle(const Recording& rec, const Backend& oracle, const GateAt& gate) {
  OracleCheck check;
  check.rows.resize(rec.rows.size());
  check.failures.resize(rec.steps.size());
  if (rec.hung_at && oracle.Name() == rec.backend) {
    check.not_run =
        fmt::format("not checked against {} ForwardFull: it stopped answering at step {}",
                    oracle.Name(), *rec.hung_at);
    return check;
  }
  check.beyond_call.assign(rec.rows.size(), false);
  const int64_t max_call = oracle.Info().max_batch_tokens;
  std::vector<std::vector<size_t>> rows_of(rec.histories.size());
  for (size_t k = 0; k < rec.rows.size(); ++k) {
    if (rec.rows[k].after_shift) continue;
    // ForwardFull is one call of position + 1 tokens: an engine that takes fewer refuses it.
    if (max_call > 0 && rec.rows[k].position + 1 > max_call) {
      check.beyond_call[k] = true;
      check.max_call_tokens = max_call;
      continue;
    }
    rows_of[rec.rows[k].history].push_back(k);
  }
  std::string hung_failure;  // once the oracle hung: its failure, given to the later histories
  for (size_t h = 0; h < rows_of.size(); ++h) {
    if (rows_of[h].empty()) continue;
    const std::string failure =
        check.hung ? hung_failure : CheckHistory(rec, oracle, gate, h, rows_of[h], check);
    if (check.hung) hung_failure = failure;
    if (failure.empty()) continue;
    // No row of a history is judged when its oracle failed, and each step that ran is failed by
    // the first history that let it down.
    for (size_t k : rows_of[h]) {
      check.rows[k].reset();
      const size_t step = static_cast<size_t>(rec.rows[k].step);
      if (rec.steps[step].status == StepStatus::kDone && check.failures[step].empty()) {
        check.failures[step] = failure;
      }
    }
  }
  return check;
}

}  // namespace kvdiff::harness
