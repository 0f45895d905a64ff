#include "harness/replay/replay.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <memory>

#include "format/error.h"
#include "harness/replay/drivers.h"
#include "harness/scenario/conversations.h"

namespace kvdiff::harness {
namespace {

// What the replay keeps of a conversation beside its length (Conversations): where its history
// lives, the row a decode chooses from, and whether it has stopped.
struct ReplayedConversation {
  int64_t history = -1;   // into Recording::histories; -1 before its first token
  int64_t last_row = -1;  // into Recording::rows: the row of its last position, when it has one
  std::string stopped;    // why the conversation stopped; empty while it runs
  bool shifted = false;   // a shift moved its positions: later rows have no uncached oracle
  // While shifted: the positions below it hold the tokens they held before the first shift,
  // cached as an uncached forward of them would be (a shift leaves [0, keep) alone, and each of
  // those positions saw only the ones before it). A truncate to it or less ends `shifted`.
  int64_t unshifted_prefix = 0;
  // While shifted: how far the angles of its cached keys have turned, in positions: a moved key
  // was rotated at its first position, then back by each discard, so a float32-angle backend's
  // error in it is that of a key at the sum (RecordedRow::rope_reach). 0 while not shifted.
  int64_t key_rope_reach = 0;
};

class Replayer {
 public:
  Replayer(const Scenario& sc, const Backend& backend, TraceRequest* trace,
           const AfterStep& after_step)
      : sc_(sc),
        backend_(backend),
        trace_(trace),
        after_step_(after_step),
        vocab_(backend.config().vocab_size) {
    rec_.backend = backend.Name();
    replayed_["main"] = ReplayedConversation{};
    // The driver opens the main conversation: an engine that fails there (its process died and
    // a new one cannot start, or it hung before) fails the first step, like any engine error.
    try {
      driver_ = MakeDriver(sc.driver, backend);
    } catch (const EngineError& e) {
      start_error_ = e.what();
      if (dynamic_cast<const EngineHungError*>(&e) != nullptr) rec_.hung_at = 0;
    }
  }

  Recording Run() {
    for (size_t i = 0; i < sc_.steps.size(); ++i) RunStep(static_cast<int64_t>(i));
    return std::move(rec_);
  }

 private:
  void RunStep(int64_t i) {
    const Step& step = sc_.steps[i];
    StepRecord sr;
    sr.rows_begin = step_begin_ = rec_.rows.size();
    const std::string stopped = StoppedSource(step);
    if (!driver_) {
      sr.status = i == 0 ? StepStatus::kError : StepStatus::kSkipped;
      sr.message = i == 0 ? start_error_
                          : fmt::format("not run: {} could not start the scenario", rec_.backend);
    } else if (rec_.hung_at) {
      sr.status = StepStatus::kSkipped;
      sr.message =
          fmt::format("not run: {} stopped answering at step {}", rec_.backend, *rec_.hung_at);
    } else if (!stopped.empty()) {
      sr.status = StepStatus::kSkipped;
      sr.message = stopped;
      // What the step would have made of its conversations did not happen: they stop too.
      for (const std::string& name : step.ConversationsActedOn()) replayed_[name].stopped = stopped;
    } else {
      try {
        Apply(i, step);
      } catch (const std::exception& e) {
        sr.status = StepStatus::kError;
        sr.message = e.what();
        if (dynamic_cast<const EngineHungError*>(&e) != nullptr)
          rec_.hung_at = static_cast<size_t>(i);
        const std::string why = fmt::format("conversation \"{}\" failed at step {} ({})",
                                            step.conversation, i, step.ParamString());
        for (const std::string& name : step.ConversationsActedOn()) {
          if (step.op == Op::kFork && name == step.from)
            continue;  // a failed fork spares its source
          replayed_[name].stopped = why;
        }
      }
    }
    sr.rows_end = rec_.rows.size();
    rec_.steps.push_back(std::move(sr));
    if (after_step_) after_step_(rec_, static_cast<size_t>(i));
  }

  // Why the step cannot run: a conversation it reads from stopped at an earlier error (a fork's
  // source, a batch's items; a new conversation reads from none). Empty when it can.
  std::string StoppedSource(const Step& step) {
    if (step.op == Op::kNewConversation) return {};
    if (step.op == Op::kFork) return replayed_[step.from].stopped;
    for (const std::string& name : step.ConversationsActedOn())
      if (!replayed_[name].stopped.empty()) return replayed_[name].stopped;
    return {};
  }

  // The step through the driver; the lengths move on (convs_.Apply) once its calls are made, and
  // each call's and op's length is held to what the session says.
  void Apply(int64_t i, const Step& step) {
    ReplayedConversation& conv = replayed_[step.conversation];
    const std::vector<ForwardCall> calls = convs_.CallsOf(step);
    call_ = 0;
    switch (step.op) {
      case Op::kNewConversation:
        driver_->NewConversation(step.name);
        conv = ReplayedConversation{};
        break;
      case Op::kPrefill: {
        auto begin = step.tokens.begin();
        for (const ForwardCall& call : calls) {
          Append(i, call, conv, Tokens(begin, begin + call.size), -1);
          begin += call.size;
        }
        break;
      }
      case Op::kDecode:
        KVDIFF_CHECK(convs_.At(step.conversation).has_last_row,
                     "decode: no previous row to take the argmax of");
        Greedy(rec_.rows[conv.last_row].logits.data(), vocab_, step.n, [&](Token next) {
          Append(i, calls[call_], conv, {next}, conv.last_row);
          return rec_.rows[conv.last_row].logits.data();
        });
        break;
      case Op::kTruncate:
        driver_->Truncate(step.conversation, step.length);
        if (step.length <= conv.unshifted_prefix) conv = Unshifted(conv);
        break;
      case Op::kFork:
        driver_->Fork(step.from, step.to);
        replayed_[step.to] = replayed_[step.from];
        break;
      case Op::kReset:
        driver_->Reset(step.conversation);
        conv = ReplayedConversation{};
        break;
      case Op::kEnd:
        driver_->End(step.conversation);
        replayed_.erase(step.conversation);
        break;
      case Op::kBatch:
        AppendBatch(i, step, calls);
        break;
      case Op::kShift:
        driver_->Shift(step.conversation, step.keep, step.discard);
        ShiftHistory(conv, convs_.At(step.conversation).length, step.keep, step.discard);
        break;
    }
    convs_.Apply(step);
    switch (step.op) {
      case Op::kNewConversation:
        CheckLength(step.conversation, "a new conversation");
        break;
      case Op::kTruncate:
        CheckLength(step.conversation, fmt::format("truncate to {}", step.length));
        break;
      case Op::kFork:
        CheckLength(step.from, fmt::format("a fork to \"{}\"", step.to));
        CheckLength(step.to, fmt::format("a fork from \"{}\"", step.from));
        break;
      case Op::kReset:
        CheckLength(step.conversation, "reset");
        break;
      case Op::kShift:
        CheckLength(step.conversation,
                    fmt::format("shift(keep={}, discard={})", step.keep, step.discard));
        break;
      case Op::kPrefill:
      case Op::kDecode:
      case Op::kBatch:
        break;  // Append and AppendBatch checked the lengths after each call
      case Op::kEnd:
        break;  // nothing left to ask
    }
  }

  // One forward call through the driver; records one row per token.
  void Append(int64_t i, const ForwardCall& call, ReplayedConversation& conv, const Tokens& tokens,
              int64_t chosen_by) {
    ForwardTrace trace;
    const bool traced = trace_ && trace_->step == i;
    const Logits logits = driver_->Append(call.conversation, tokens, traced ? &trace : nullptr);
    const auto n = static_cast<int64_t>(tokens.size());
    KVDIFF_CHECK(logits.rows() == n && logits.cols() == vocab_,
                 "backend {} returned logits [{}, {}] for {} tokens; expected [{}, {}]",
                 backend_.Name(), logits.rows(), logits.cols(), n, n, vocab_);
    for (int64_t r = 0; r < n; ++r) {
      const std::string bad = DescribeNonFinite(logits.row(r).data(), vocab_);
      KVDIFF_CHECK(bad.empty(), "non-finite logits: backend {}, step {}, row {}, {}",
                   backend_.Name(), i, rec_.rows.size() - step_begin_ + r, bad);
    }
    Record(i, call_, call, conv, tokens, {}, logits, chosen_by, 0);
    CheckLength(call.conversation, call.first_position + n,
                fmt::format("an append of {} token{}", n, n == 1 ? "" : "s"));
    if (traced) trace_->traces[call_] = std::move(trace);
    ++call_;
  }

  // A batch step: one call for every item (decode items choose their token from their
  // conversation's last row first); the rows each item asked for are recorded, item by item.
  void AppendBatch(int64_t i, const Step& step, const std::vector<ForwardCall>& calls) {
    std::vector<DriverBatchItem> items;
    std::vector<int64_t> chosen_by;
    for (const BatchEntry& entry : step.items) {
      const ReplayedConversation& conv = replayed_[entry.conversation];
      Tokens tokens = entry.tokens;
      chosen_by.push_back(entry.decode ? conv.last_row : -1);
      if (entry.decode) {
        KVDIFF_CHECK(conv.last_row >= 0, "decode item on \"{}\": no previous row",
                     entry.conversation);
        tokens = {GreedyNext(rec_.rows[conv.last_row].logits.data(), vocab_)};
      }
      items.push_back({entry.conversation, std::move(tokens), entry.OutputFlags()});
    }
    const std::vector<Logits> out = driver_->AppendBatch(items);
    KVDIFF_CHECK(out.size() == items.size(),
                 "backend {} returned {} logits blocks for {} batch items", backend_.Name(),
                 out.size(), items.size());
    for (size_t k = 0; k < items.size(); ++k) {
      const DriverBatchItem& item = items[k];
      const auto n = static_cast<int64_t>(item.tokens.size());
      const auto rows =
          static_cast<int64_t>(std::count(item.output.begin(), item.output.end(), true));
      KVDIFF_CHECK(out[k].rows() == rows && out[k].cols() == vocab_,
                   "backend {} returned logits [{}, {}] for batch item {} (conversation \"{}\", "
                   "{} of its {} rows asked for); expected [{}, {}]",
                   backend_.Name(), out[k].rows(), out[k].cols(), k, item.conversation, rows, n,
                   rows, vocab_);
      for (int64_t r = 0; r < rows; ++r) {
        const std::string bad = DescribeNonFinite(out[k].row(r).data(), vocab_);
        KVDIFF_CHECK(bad.empty(),
                     "non-finite logits: backend {}, step {}, batch item {} (conversation \"{}\"), "
                     "{}",
                     backend_.Name(), i, k, item.conversation, bad);
      }
    }
    int64_t row_in_call = 0;  // the item's first token among every item's tokens
    for (size_t k = 0; k < items.size(); ++k) {
      const DriverBatchItem& item = items[k];
      Record(i, 0, calls[k], replayed_[item.conversation], item.tokens, item.output, out[k],
             chosen_by[k], row_in_call);
      row_in_call += static_cast<int64_t>(item.tokens.size());
      const auto n = static_cast<int64_t>(item.tokens.size());
      CheckLength(item.conversation, calls[k].first_position + n,
                  fmt::format("a batch item of {} token{}", n, n == 1 ? "" : "s"));
    }
  }

  // Feeds `tokens` to the conversation's history at call.first_position and records a row for each
  // token whose output flag is set (every token when `output` is empty): `logits` holds those rows
  // in order. Its last row, when recorded, is what a decode chooses from next.
  void Record(int64_t i, int64_t call_index, const ForwardCall& call, ReplayedConversation& conv,
              const Tokens& tokens, const std::vector<bool>& output, const Logits& logits,
              int64_t chosen_by, int64_t first_row_in_call) {
    Tokens& history = HistoryFor(conv, call.first_position);
    conv.last_row = -1;
    for (size_t t = 0, r = 0; t < tokens.size(); ++t) {
      history.push_back(tokens[t]);
      if (!output.empty() && !output[t]) continue;
      RecordedRow row;
      row.step = i;
      row.row = static_cast<int64_t>(rec_.rows.size() - step_begin_);
      row.call = call_index;
      row.row_in_call = first_row_in_call + static_cast<int64_t>(t);
      row.conversation = call.conversation;
      row.position = call.first_position + static_cast<int64_t>(t);
      row.token = tokens[t];
      row.chosen_by = t == 0 ? chosen_by : -1;
      row.history = conv.history;
      row.after_shift = conv.shifted;
      row.rope_reach = std::max(row.position, conv.key_rope_reach);
      row.logits.assign(logits.row(r).data(), logits.row(r).data() + vocab_);
      ++r;
      rec_.rows.push_back(std::move(row));
      if (t + 1 == tokens.size()) conv.last_row = static_cast<int64_t>(rec_.rows.size()) - 1;
    }
  }

  // The session's own account of its length must be what it was fed: a session that miscounts
  // its positions (the bug this tool exists to catch) is wrong even when its logits happen to be
  // right, and later calls it makes from that count would be.
  void CheckLength(const std::string& name, int64_t fed, const std::string& after) {
    const std::optional<int64_t> said = driver_->Length(name);
    KVDIFF_CHECK(!said || *said == fed,
                 "backend {}, conversation \"{}\": Length() is {} after {}, but kvdiff fed it {} "
                 "positions",
                 backend_.Name(), name, *said, after, fed);
  }
  void CheckLength(const std::string& name, const std::string& after) {
    CheckLength(name, convs_.At(name).length, after);
  }

  // After a shift, the conversation appends to a new history: the tokens its cache still holds,
  // [0, keep) then [keep + discard, length), and its rows are no uncached forward's any more
  // (until a truncate to unshifted_prefix or less).
  void ShiftHistory(ReplayedConversation& conv, int64_t length, int64_t keep, int64_t discard) {
    if (discard == 0 || conv.history < 0) return;  // nothing moved
    // The keys that move were rotated at up to length - 1 (or, moved before, up to the reach so
    // far) and are turned back by discard more.
    if (keep + discard < length) {
      conv.key_rope_reach = std::max(conv.key_rope_reach, length - 1) + discard;
    }
    const Tokens& old = rec_.histories[conv.history];
    Tokens kept(old.begin(), old.begin() + keep);
    kept.insert(kept.end(), old.begin() + keep + discard, old.begin() + length);
    rec_.histories.push_back(std::move(kept));
    conv.history = static_cast<int64_t>(rec_.histories.size()) - 1;
    if (keep + discard >= length) {
      // Nothing moved: the tail is dropped as a truncate to keep drops it, and the positions left
      // are what they were (an uncached forward's, unless an earlier shift moved them).
      if (!conv.shifted || keep <= conv.unshifted_prefix) conv = Unshifted(conv);
      return;
    }
    conv.unshifted_prefix = conv.shifted ? std::min(conv.unshifted_prefix, keep) : keep;
    conv.shifted = true;
  }

  // After a truncate to its unshifted prefix or less: the positions left were never moved.
  static ReplayedConversation Unshifted(ReplayedConversation conv) {
    conv.shifted = false;
    conv.key_rope_reach = 0;
    return conv;
  }

  // The history this conversation appends to at `length`: its own in place while it reaches the
  // end, else (after a fork, a truncate or a reset) a new one holding its first `length` tokens.
  Tokens& HistoryFor(ReplayedConversation& conv, int64_t length) {
    if (conv.history < 0 || static_cast<int64_t>(rec_.histories[conv.history].size()) != length) {
      Tokens prefix;
      if (conv.history >= 0) {
        const Tokens& old = rec_.histories[conv.history];
        prefix.assign(old.begin(), old.begin() + length);
      }
      rec_.histories.push_back(std::move(prefix));
      conv.history = static_cast<int64_t>(rec_.histories.size()) - 1;
    }
    return rec_.histories[conv.history];
  }

  const Scenario& sc_;
  const Backend& backend_;
  TraceRequest* trace_;
  const AfterStep& after_step_;
  const int64_t vocab_;
  std::unique_ptr<Driver> driver_;  // null when the backend failed to start the scenario
  std::string start_error_;         // why
  Conversations convs_;             // the lengths, moved on step by step
  std::map<std::string, ReplayedConversation> replayed_;
  Recording rec_;
  size_t step_begin_ = 0;  // the current step's first row
  int64_t call_ = 0;       // the forward call's index within the current step
};

}  // namespace

std::optional<size_t> Recording::FirstError() const {
  for (size_t i = 0; i < steps.size(); ++i)
    if (steps[i].status == StepStatus::kError) return i;
  return std::nullopt;
}

bool Recording::SameHistory(const RecordedRow& x, const Recording& other,
                            const RecordedRow& y) const {
  if (x.position != y.position) return false;
  const Tokens& hx = histories[x.history];
  const Tokens& hy = other.histories[y.history];
  return std::equal(hx.begin(), hx.begin() + x.position + 1, hy.begin());
}

Recording Replay(const Scenario& scenario, const Backend& backend, TraceRequest* trace,
                 const AfterStep& after_step) {
  return Replayer(scenario, backend, trace, after_step).Run();
}

Token GreedyNext(const float* row, int64_t vocab) {
  const std::string bad = DescribeNonFinite(row, vocab);
  KVDIFF_CHECK(bad.empty(), "greedy choice: non-finite logits, {}", bad);
  return static_cast<Token>(Argmax(row, vocab));
}

Tokens Greedy(const float* row, int64_t vocab, int64_t n,
              const std::function<const float*(Token)>& feed) {
  Tokens chosen;
  for (int64_t k = 0; k < n && row != nullptr; ++k) {
    const Token next = GreedyNext(row, vocab);
    chosen.push_back(next);
    row = feed(next);
  }
  return chosen;
}

}  // namespace kvdiff::harness
