// Property 7: a batched call equals the same items run alone. A serving engine advances many
// conversations in ONE forward (Backend::AppendBatch) and may place their keys in shared cells,
// build one mask for every sequence, split the call into micro-batches and map output rows back;
// none of that may change a row. So each item's rows must be the rows its own session gives for
// the same tokens appended alone, from the same history: the batch's own semantic reference,
// independent of any oracle (the other properties tie Append to the uncached forward).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "tests/props/properties.h"

namespace kvdiff::props {
namespace {

constexpr int64_t kMaxSessions = 5;
// An item's tokens: up to 12, so a batch of several items passes impl::kLinearRowsMax (8) rows and
// the micro-batch of 4 of the scalar model's split fault, while one item alone may not.
constexpr int64_t kMaxItemTokens = 12;

struct Conversation {
  std::unique_ptr<harness::BackendSession> session;
  Tokens history;
};

// kMaxSessions conversations at most, each a new session with a prefix or a fork of an earlier one
// (with or without more tokens: a fork given nothing more is its parent's twin). Histories fill at
// most half the capacity, so every conversation has room for an item. Every choice is drawn
// whether or not it is used, so the draws keep their places when the shrinker changes one of them
// (RapidCheck replays a case's draws in order) and the shrinking does not stall.
std::vector<Conversation> DrawConversations(const CaseSetup& s) {
  const int64_t max_history = s.capacity / 2;
  const int64_t n = *GenUniform(1, kMaxSessions + 1);
  std::vector<Conversation> convs;
  for (int64_t i = 0; i < n; ++i) {
    const bool fork = *GenUniform(0, 3) == 2;
    const int64_t parent = *GenUniform(0, std::max<int64_t>(i, 1));
    Tokens more = *GenTokens(s.vocab, *GenUniform(0, max_history + 1));
    Conversation c;
    if (fork && i > 0) {
      c = {convs[parent].session->Fork(), convs[parent].history};
      const auto room = static_cast<size_t>(max_history) - c.history.size();
      more.resize(std::min(more.size(), room));
    } else {
      c = {s.system->NewSession(), {}};
    }
    if (!more.empty()) c.session->Append(more);
    c.history.insert(c.history.end(), more.begin(), more.end());
    LastCaseSize().tokens += static_cast<int64_t>(more.size());
    convs.push_back(std::move(c));
  }
  return convs;
}

// Output flags: every row (empty flags), the last only, none, or each row drawn.
std::vector<bool> DrawOutputFlags(int64_t n) {
  switch (*GenUniform(0, 4)) {
    case 0:
      return {};
    case 1: {
      std::vector<bool> last(n, false);
      last.back() = true;
      return last;
    }
    case 2:
      return std::vector<bool>(n, false);
    default:
      return *rc::gen::container<std::vector<bool>>(n, rc::gen::arbitrary<bool>());
  }
}

double MaxAbs(const float* row, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(static_cast<double>(row[i])));
  return m;
}

}  // namespace

BatchAloneFigures& BatchAloneMeasured() {
  static BatchAloneFigures figures;
  return figures;
}

void BatchEqualsAloneProperty(const Target& target) {
  CaseSetup s = Setup(target);
  std::vector<Conversation> convs = DrawConversations(s);

  // The batch: distinct conversations in a drawn order; a twin of an earlier item's conversation
  // (the same history) may be given the same tokens, so twins meet in one call.
  std::vector<int64_t> candidates(convs.size()), order;
  for (size_t i = 0; i < convs.size(); ++i) candidates[i] = static_cast<int64_t>(i);
  const int64_t n_items = *GenUniform(1, static_cast<int64_t>(convs.size()) + 1);
  std::vector<harness::BatchItem> items;
  for (int64_t k = 0; k < n_items; ++k) {
    const int64_t pick = *GenUniform(0, static_cast<int64_t>(candidates.size()));
    const int64_t conv = candidates[pick];
    candidates.erase(candidates.begin() + pick);
    const Tokens& history = convs[conv].history;
    const bool same_as_twin = *rc::gen::arbitrary<bool>();
    // Drawn from a range that does not depend on the history, then cut to the room: a range
    // that moved with the history would draw other tokens whenever the shrinker shortened one.
    Tokens tokens = *GenPrompt(s.vocab, kMaxItemTokens);
    tokens.resize(std::min(tokens.size(), static_cast<size_t>(s.capacity) - history.size()));
    for (size_t j = 0; j < order.size() && same_as_twin; ++j) {
      if (convs[order[j]].history == history) {
        tokens = items[j].tokens;
        break;
      }
    }
    LastCaseSize().tokens += static_cast<int64_t>(tokens.size());
    std::vector<bool> output = DrawOutputFlags(static_cast<int64_t>(tokens.size()));
    items.push_back({convs[conv].session.get(), std::move(tokens), std::move(output)});
    order.push_back(conv);
  }

  // The reference: forks taken before the call, each given its item's tokens alone.
  std::vector<std::unique_ptr<harness::BackendSession>> alone;
  for (int64_t conv : order) alone.push_back(convs[conv].session->Fork());
  const std::vector<Logits> batched = s.system->AppendBatch(items);
  RC_ASSERT(batched.size() == items.size());

  BatchAloneFigures& figures = BatchAloneMeasured();
  ++figures.cases;
  for (size_t k = 0; k < items.size(); ++k) {
    const harness::BatchItem& item = items[k];
    const int64_t before = static_cast<int64_t>(convs[order[k]].history.size());
    const Logits alone_rows = alone[k]->Append(item.tokens);
    RC_ASSERT(batched[k].rows() == item.OutputRows());
    RC_ASSERT(batched[k].cols() == alone_rows.cols());
    for (size_t t = 0, row = 0; t < item.tokens.size(); ++t) {
      if (!item.Outputs(t)) continue;
      const double diff =
          harness::MaxAbsDiff(batched[k].row(static_cast<int64_t>(row++)).data(),
                              alone_rows.row(static_cast<int64_t>(t)).data(), alone_rows.cols());
      if (!(diff <= kBatchAloneTolerance)) {  // NaN fails too
        const float* row = alone_rows.row(static_cast<int64_t>(t)).data();
        const std::string message = fmt::format(
            "batch item {} of {} (conversation {}, {} token{} at length {}): position {}: max "
            "|batched - alone| = {:.3g} > {:g} (max |logit| {:.3g})",
            k, items.size(), order[k], item.tokens.size(), item.tokens.size() == 1 ? "" : "s",
            before, before + t, diff, kBatchAloneTolerance, MaxAbs(row, alone_rows.cols()));
        RC_FAIL(message);
      }
      figures.worst = std::max(figures.worst, diff);
      ++figures.rows;
    }
    RC_ASSERT(item.session->Length() == before + static_cast<int64_t>(item.tokens.size()));
  }
}

}  // namespace kvdiff::props
