// The checks of `kvdiff conform` for work an engine defers or sizes, each found in real engines
// and, before these checks, passed by a mutant that `check` and the other checks missed: a call
// right after a reset that is not an append (a cleared cache applied lazily, at the next append
// only), a truncate by exactly one position, more conversations alive than a fixed table of eight
// slots, and forks, truncates, resets and batches on a history of hundreds of positions (a
// boundary of pages, blocks or tables past 256). Every row is held to the oracle's uncached
// forward, like every row conform sees.
#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <vector>

#include "harness/conform/conform_detail.h"

namespace kvdiff::harness::conform_detail {
namespace {

std::string CheckTruncateByOne(Script& s) {
  s.Append("main", s.RandomTokens(9), "prefill of 9");
  s.Add(Step::Truncate("main", 8), "truncate to 8 (by one)");
  s.Append("main", s.RandomTokens(1), "append of 1 after truncate by one");
  s.Add(Step::Truncate("main", 8), "truncate to 8 again (by one)");
  s.Append("main", s.RandomTokens(3), "append of 3 after the second truncate by one");
  return s.Play().Figures() + "; 9 -> 8 -> +1 -> 8 -> +3";
}

// Each reset is followed at once by another call than a plain append: a fork, a batch, then a
// one-token prompt (the source document's third bug: a cache reused for a one-token prompt kept
// talking about the previous conversation).
std::string CheckAfterReset(Script& s) {
  s.Append("main", s.RandomTokens(10), "prefill of 10");
  s.Add(Step::Reset("main"), "reset");
  s.Add(Step::Fork("main", "child"), "a fork right after the reset");
  s.Append("child", s.RandomTokens(3), "the fork +3");
  s.Add(Step::End("child"), "the fork freed");  // two sessions at most
  s.Append("main", s.RandomTokens(6), "prefill of 6 after the reset");
  s.Add(Step::NewConversation("other"), "a new session");
  s.Append("other", s.RandomTokens(3), "other: prefill of 3");
  s.Add(Step::Reset("main"), "reset");
  const Tokens to_main = s.RandomTokens(4), to_other = s.RandomTokens(2);
  s.Add(Step::Batch({Item("main", to_main), Item("other", to_other)}),
        "a batch right after the reset (main:4, other:2)");
  s.Add(Step::End("other"), "other freed");
  s.Add(Step::Reset("main"), "reset");
  s.Append("main", s.RandomTokens(1), "a one-token prompt right after the reset");
  s.Append("main", s.RandomTokens(1), "one more token");
  return s.Play().Figures() + "; a fork, a batch and a one-token prompt right after a reset";
}

// More conversations alive at once than a table of eight slots holds, all in one batched call,
// then each alone.
std::string CheckManySessions(Script& s) {
  constexpr int64_t kWanted = 12, kNeeded = 9;
  const int64_t declared = s.engine().Info().max_sessions;
  const int64_t n = declared > 0 ? std::min(kWanted, declared) : kWanted;
  if (n < kNeeded) {
    throw NotApplicable(fmt::format(
        "{} sessions alive at once are needed (more than a table of eight); the engine holds {} "
        "(max_sessions)",
        kNeeded, declared));
  }
  std::vector<BatchEntry> decode;
  for (int64_t i = 0; i < n; ++i) {
    const std::string name = i == 0 ? "main" : fmt::format("s{}", i);
    if (i > 0) s.Add(Step::NewConversation(name), fmt::format("session {}", i));
    s.Append(name, s.RandomTokens(2 + i % 4), fmt::format("session {}: its prompt", i));
    decode.push_back(Item(name, s.RandomTokens(1)));
  }
  s.Add(Step::Batch(decode), fmt::format("a batch of {} conversations, one token each", n));
  for (int64_t i = 0; i < n; ++i) {
    const std::string name = i == 0 ? "main" : fmt::format("s{}", i);
    s.Append(name, s.RandomTokens(1), fmt::format("session {}: one more token alone", i));
  }
  return s.Play().Figures() + fmt::format("; {} sessions alive, one batch of all of them", n);
}

// A history of hundreds of positions (up to 496, or 16 short of what a session holds), then at
// that depth a fork that goes on, a batch beside a new conversation, a truncate to a quarter, and
// a reset.
std::string CheckLongHistory(Script& s) {
  const int64_t depth = std::min<int64_t>(512, s.max_positions()) - 16;
  if (depth < 300) {
    throw NotApplicable(fmt::format("a history of 300 positions is needed; the engine holds {}",
                                    s.max_positions_name()));
  }
  s.Append("main", s.RandomTokens(depth), fmt::format("prefill of {}", depth));
  s.Add(Step::Fork("main", "child"), fmt::format("a fork at {}", depth));
  s.Append("child", s.RandomTokens(3), "the fork +3");
  s.Add(Step::End("child"), "the fork freed");
  s.Add(Step::NewConversation("new"), "a new session");
  const Tokens deep = s.RandomTokens(2), fresh = s.RandomTokens(3);
  s.Add(Step::Batch({Item("main", deep), Item("new", fresh)}),
        fmt::format("a batch of main at {} and a new session", depth));
  s.Add(Step::End("new"), "the new session freed");
  const int64_t quarter = depth / 4;
  s.Add(Step::Truncate("main", quarter), fmt::format("truncate from {} to {}", depth + 2, quarter));
  s.Append("main", s.RandomTokens(3), fmt::format("append of 3 after truncate to {}", quarter));
  s.Append("main", s.RandomTokens(depth - quarter - 3), fmt::format("back to {}", depth));
  s.Add(Step::Reset("main"), fmt::format("reset at {}", depth));
  s.Append("main", s.RandomTokens(2), "prefill of 2 after the reset");
  return s.Play().Figures() +
         fmt::format("; at {}: a fork, a batch, a truncate to {}, a reset", depth, quarter);
}

}  // namespace

std::vector<CheckDef> EdgeChecks() {
  return {
      {"truncate-by-one", "a truncate by exactly one position, twice: appends after it are right",
       CheckTruncateByOne},
      {"after-reset",
       "a fork, a batch and a one-token prompt right after a reset see nothing of before",
       CheckAfterReset},
      {"many-sessions",
       "more than eight sessions alive at once, all in one batched call: every row right",
       CheckManySessions},
      {"long-history",
       "at a depth of hundreds of positions a fork, a batch, a truncate and a reset are right",
       CheckLongHistory},
  };
}

}  // namespace kvdiff::harness::conform_detail
