// The follow-ups of the campaign's cases: after a case's own steps, from a stream of their own,
// the calls where an engine's deferred or sized work goes wrong and a case's own steps rarely go
// (each a class of wrong engine that passed `check --cases 200` before them):
//   - right after a reset or a context shift, a call other than a plain append: a fork, a batch,
//     a truncate (above keep after a shift), or a one-token prompt. A cache cleared lazily, or a
//     K-shift applied at the next append only, is wrong there;
//   - on the case's deepest conversation (hundreds of positions in a long case): a fork, a batch,
//     a truncate (now and then by exactly one), a reset. A table, block or page boundary past 256
//     is wrong there;
//   - a crowd: 9 to 16 conversations alive, all in one batch. A table of eight slots is wrong
//     there.
// Appended after the case's own steps, so those are the steps drawn before follow-ups existed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "harness/campaign/case_rng.h"
#include "harness/scenario/conversations.h"
#include "harness/scenario/scenario.h"

namespace kvdiff::harness {

// The stream of case k's follow-ups, apart from its steps' (CaseStream).
inline uint64_t FollowUpStream(uint64_t seed, int64_t k) {
  return CaseStream(seed, k) ^ 0x464F4C4C4F575550ull;  // "FOLLOWUP"
}

// The most conversations a crowd keeps alive; the fewest (more than a table of eight).
inline constexpr int64_t kMaxCrowd = 16;
inline constexpr int64_t kMinCrowd = 9;

struct FollowUpLimits {
  int64_t context = 0;          // no conversation grows past it
  int64_t vocab = 0;            // tokens are drawn below it
  int64_t max_call_tokens = 0;  // no prompt or batch is larger (0: no limit)
  int64_t max_sessions = 0;     // no more conversations alive (0: no limit; a crowd's kMaxCrowd)
  int64_t window = 0;           // a sliding window (0: none): truncates stay where it allows
  bool shifts = false;          // whether a shift may lead a follow-up
  bool batches = true;          // whether batch steps may be drawn (--batch-percent 0: none)
};

// The follow-ups of a case whose steps left `convs`: a long case's tour of its deepest
// conversation (`long_case`), else now and then a reset or a shift of it followed by another call
// than an append; then now and then a crowd. New conversations are named c<next_name>,
// c<next_name + 1>, ... (next_name moves past the names taken). Each step is valid after the ones
// before it.
std::vector<Step> DrawFollowUps(CaseRng& rng, const Conversations& convs,
                                const FollowUpLimits& limits, bool long_case, int64_t& next_name);

// Cuts a batch to at most `cap` tokens in all (0: no limit): the longest item loses tokens (one
// is left to it), and while every item has one, the last items go.
void FitBatch(std::vector<BatchEntry>& items, int64_t cap);

}  // namespace kvdiff::harness
