// Runs the items of a campaign on several threads with the result of a sequential loop: every item
// exactly once, claimed in ascending order, each job (thread) with its own backends.
#pragma once

#include <cstdint>
#include <functional>

namespace kvdiff::harness {

// The most jobs `--jobs` accepts (docs/bad-input.md), like --threads: each job holds its own
// backends and a thread, and beyond a few hundred threads the system may refuse one.
inline constexpr int kMaxJobs = 256;

// The number of jobs `--jobs requested` means for `items` items: 0 is every core; never more jobs
// than items, never fewer than one.
int ResolveJobs(int requested, int64_t items);

// Calls body(job, i) for every i in [0, n) on `jobs` threads, job in [0, jobs) naming the thread
// (so it can use that job's own backends). Items are claimed in ascending order; after(i) runs
// under a lock once item i is done (progress lines). With one job everything runs on the calling
// thread. When a body throws, no further item is claimed, and once every thread has stopped the
// exception of the smallest failing i is rethrown: the one a sequential loop would have thrown.
// When the system refuses to start a thread, the jobs already started share the items (job
// numbers stay below `jobs`; the results do not depend on how many run).
void RunJobs(int64_t n, int jobs, const std::function<void(int job, int64_t i)>& body,
             const std::function<void(int64_t i)>& after = {});

}  // namespace kvdiff::harness
