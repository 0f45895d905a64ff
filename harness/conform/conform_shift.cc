// The context-shift checks of `kvdiff conform` (engine.h ABI 3's shift, BackendSession::Shift):
// positions [keep, keep + discard) dropped, the later ones moved down with their cached keys
// re-rotated. No uncached forward is the oracle of a row after a shift (the kept keys were computed
// with the dropped tokens in view), so the Script holds those rows to an arbiter that replays the
// same shifts (ref64 from the command line: exactly, in double); every row before a shift, of a
// parent whose fork shifted, or after a shift that discarded nothing is still held to the uncached
// oracle. Then the refusals: a shift beyond the length, or negative, changes nothing. Both checks
// are skipped, saying why, for an engine that does not shift.
#include <fmt/format.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "harness/conform/conform_detail.h"

namespace kvdiff::harness::conform_detail {
namespace {

void RequireShifts(const Script& s) {
  if (!s.engine().Info().shifts) {
    throw NotApplicable(
        "the engine does not shift (a plugin of ABI 1 or 2, or whose shift is NULL; an engine "
        "program whose info does not list it)");
  }
}

// Rows after a shift are held to an arbiter: without one there is nothing to hold them to.
void RequireShiftsAndArbiter(const Script& s) {
  RequireShifts(s);
  if (!s.arbiter()) {
    throw NotApplicable(
        "nothing to hold rows after a shift to: no arbiter (kvdiff conform makes ref64 when "
        "LibTorch is built) and the oracle does not shift");
  }
}

// A new conversation fed `n` tokens in one call.
void Fed(Script& s, const std::string& conversation, int64_t n) {
  s.Add(Step::NewConversation(conversation), "a new session " + conversation);
  s.Append(conversation, s.RandomTokens(n), fmt::format("{}: prefill of {}", conversation, n));
}

void Shift(Script& s, const std::string& conversation, int64_t keep, int64_t discard,
           int64_t length) {
  s.Add(Step::Shift(conversation, keep, discard),
        fmt::format("{}: shift(keep={}, discard={}) of {}", conversation, keep, discard, length));
}

void Then(Script& s, const std::string& conversation, int64_t n, const std::string& after) {
  s.Append(conversation, s.RandomTokens(n),
           fmt::format("{}: +{} after {}", conversation, n, after));
}

std::string CheckShift(Script& s) {
  RequireShiftsAndArbiter(s);
  // keep 0: the first positions go (no attention sink kept).
  s.Append("main", s.RandomTokens(20), "main: prefill of 20");
  Shift(s, "main", 0, 5, 20);
  Then(s, "main", 3, "shift(0, 5)");
  // Each conversation is freed once done: two sessions at most (a parent and its fork), so an
  // engine that holds two runs the whole check.
  s.Add(Step::End("main"), "main freed");
  // keep 1: one attention sink, as StreamingLLM keeps.
  Fed(s, "sink", 16);
  Shift(s, "sink", 1, 4, 16);
  Then(s, "sink", 2, "shift(1, 4)");
  s.Add(Step::End("sink"), "sink freed");
  // keep k, two shifts before one append: llama.cpp#3825 recorded the second shift's delta over
  // the first's instead of adding it.
  Fed(s, "twice", 24);
  Shift(s, "twice", 4, 3, 24);
  Shift(s, "twice", 4, 6, 21);
  Then(s, "twice", 1, "two shifts");
  Then(s, "twice", 2, "two shifts and an append");
  s.Add(Step::End("twice"), "twice freed");
  // Nothing after keep: keep + discard = length moves nothing and forgets the tail.
  Fed(s, "tail", 10);
  Shift(s, "tail", 3, 7, 10);
  Then(s, "tail", 3, "shift(3, 7), nothing after keep");
  s.Add(Step::End("tail"), "tail freed");
  // A fork shifts on its own: its parent, appended to afterwards, is still its uncached forward.
  Fed(s, "parent", 12);
  s.Add(Step::Fork("parent", "child"), "fork of parent at 12");
  Shift(s, "child", 2, 5, 12);
  Then(s, "parent", 2, "its fork's shift(2, 5)");
  Then(s, "child", 2, "shift(2, 5) of a fork");
  s.Add(Step::End("parent"), "parent freed");
  s.Add(Step::End("child"), "child freed");
  // discard 0 changes nothing: the rows after it are held to the uncached forward.
  Fed(s, "zero", 8);
  Shift(s, "zero", 3, 0, 8);
  Then(s, "zero", 2, "shift(3, 0)");
  const Played played = s.Play();
  return fmt::format(
      "{} rows after a shift against {}, max |a-b| {:.1e}; {} against the oracle; keep 0, 1, 4, "
      "two shifts before an append, nothing after keep, a fork, discard 0",
      played.shifted_rows, s.arbiter()->Name(), played.shifted_worst, played.Figures());
}

// Each shift followed at once by another call than an append on the shifted conversation: a fork,
// a batch, a truncate above keep (an engine that re-rotates lazily, at the next append, loses the
// rotation on every other path: llama.cpp applies its K-shift at the next decode).
std::string CheckAfterShift(Script& s) {
  RequireShiftsAndArbiter(s);
  s.Append("main", s.RandomTokens(20), "main: prefill of 20");
  Shift(s, "main", 2, 6, 20);
  s.Add(Step::Fork("main", "child"), "a fork right after shift(2, 6)");
  Then(s, "child", 2, "shift(2, 6) of its parent");
  Then(s, "main", 2, "shift(2, 6) and a fork");
  s.Add(Step::End("child"), "child freed");
  s.Add(Step::End("main"), "main freed");
  Fed(s, "batched", 18);
  Fed(s, "beside", 3);
  Shift(s, "batched", 3, 5, 18);
  const Tokens shifted = s.RandomTokens(2), other = s.RandomTokens(1);
  s.Add(Step::Batch({Item("batched", shifted), Item("beside", other)}),
        "a batch right after shift(3, 5) (batched:2, beside:1)");
  s.Add(Step::End("beside"), "beside freed");
  s.Add(Step::End("batched"), "batched freed");
  Fed(s, "cut", 30);
  Shift(s, "cut", 4, 10, 30);
  s.Add(Step::Truncate("cut", 15), "cut: truncate to 15 right after shift(4, 10) of 30");
  Then(s, "cut", 3, "shift(4, 10) and truncate to 15");
  const Played played = s.Play();
  return fmt::format(
      "{} rows after a shift against {}, max |a-b| {:.1e}; {} against the oracle; a fork, a "
      "batch and a truncate above keep right after a shift",
      played.shifted_rows, s.arbiter()->Name(), played.shifted_worst, played.Figures());
}

// A bad shift on "main", then an append of 2 that must still be right.
void RefuseShift(Script& s, int64_t keep, int64_t discard, int64_t length) {
  s.Refuse(fmt::format("shift(keep={}, discard={}) of {}", keep, discard, length),
           [keep, discard](const Backend&, const std::vector<BackendSession*>& sessions) {
             sessions.at(0)->Shift(keep, discard);
           });
  s.Append("main", s.RandomTokens(2),
           fmt::format("shift(keep={}, discard={}) refused, then an append", keep, discard));
}

std::string CheckShiftRefused(Script& s) {
  RequireShifts(s);
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  s.Append("main", s.RandomTokens(5), "prefill of 5");
  RefuseShift(s, -1, 1, 5);
  RefuseShift(s, 1, -1, 7);
  RefuseShift(s, 1, kMax, 9);  // keep + discard overflows int64: compared without adding
  RefuseShift(s, kMax, 1, 11);
  RefuseShift(s, 7, 7, 13);
  return s.Play().Refused();
}

}  // namespace

std::vector<CheckDef> ShiftChecks() {
  return {
      {"shift",
       "a context shift drops [keep, keep+discard) and re-rotates the moved keys: rows after it "
       "held to the arbiter",
       CheckShift},
      {"shift-beyond", "a shift beyond the length or negative is refused, changing nothing",
       CheckShiftRefused},
      {"after-shift",
       "a fork, a batch and a truncate above keep right after a shift: rows held to the arbiter",
       CheckAfterShift},
  };
}

}  // namespace kvdiff::harness::conform_detail
