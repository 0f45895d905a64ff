// The context shifts of the campaign's cases (issue 34): after a case's step, now and then, an
// episode of shift steps on one conversation, drawn where context-shift code goes wrong, and then
// a decode or a prompt, whose rows are where a wrong shift shows (the rows after a shift are held
// to ref64's, which shifts exactly). The episodes:
//   - one shift: keep 0, 1, a few, or around the length; discard 1, anything up to all that
//     follows keep (nothing left after it), and now and then 0 (a shift that changes nothing);
//   - two shifts in a row before the next call, both moving keys (llama.cpp#3825: the second
//     shift's delta overwrote the first's instead of adding to it);
//   - a shift that moves keys, then one that leaves nothing after keep (discard = length - keep)
//     before the next call (the re-rotation an earlier shift left pending, lost when a shift
//     moves nothing; cf. llama.cpp#3835);
//   - a fork, then a shift of the fork or of its source, and both go on (a shift must move one
//     conversation's cache only);
//   - a shift, then a truncate to keep or less, where the history is again the original's first
//     tokens and the uncached oracle applies again.
// Drawn from a stream of their own (ShiftStream), so a campaign whose backends cannot shift
// (GenerationOptions::shifts false) draws exactly the cases it drew before shifts existed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "harness/campaign/case_rng.h"
#include "harness/scenario/conversations.h"
#include "harness/scenario/scenario.h"

namespace kvdiff::harness {

// The stream of case k's shift episodes, apart from its steps' (CaseStream).
inline uint64_t ShiftStream(uint64_t seed, int64_t k) {
  return CaseStream(seed, k) ^ 0x5348494654535445ull;  // "SHIFTSTE"
}

struct ShiftEpisodeLimits {
  int64_t max_length = 0;       // no conversation grows past it
  int64_t vocab = 0;            // prompt tokens are drawn below it
  int64_t max_call_tokens = 0;  // no prompt is larger (0: no limit)
  std::string fork_name;        // the name a fork may take; empty: no fork (no session to spare)
};

// The steps of one episode on the conversations as `convs` holds them (none when no
// conversation has a position to shift). Each is valid after the ones before it.
std::vector<Step> DrawShiftEpisode(CaseRng& rng, const Conversations& convs,
                                   const ShiftEpisodeLimits& limits);

}  // namespace kvdiff::harness
