// Runs the items of a campaign on several threads with the result of a sequential loop: every item
// exactly once, claimed in ascending order, each job (thread) with its own backends. A job that
// finds no item left helps the others: a case offers its backends' replays on a SharedWork board,
// and an idle job runs one of them with its own copy of that backend (the same model).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <list>
#include <mutex>

namespace kvdiff::harness {

// The most jobs `--jobs` accepts (docs/bad-input.md), like --threads: each job holds its own
// backends and a thread, and beyond a few hundred threads the system may refuse one.
inline constexpr int kMaxJobs = 256;

// The number of jobs `--jobs requested` means for `items` items: 0 is every core; never more jobs
// than items, never fewer than one.
int ResolveJobs(int requested, int64_t items);

// Tasks a busy job offers to idle ones. A campaign's last cases would otherwise run on one core
// while the others wait: the long case of `check --preset smollm2-135m --cases 40` is 40% of its
// rows, and its two backends' replays are independent until they are compared.
class SharedWork {
 public:
  // Runs task(i, job) for every i in [0, n), on the calling job and on any idle job that takes
  // one meanwhile (`job` names the thread that runs it, so it uses that job's backends). Tasks are
  // claimed in ascending order. Returns when every task is done; the exception of the smallest
  // failing i, if any, is rethrown here, on the job that offered them.
  void Run(int job, int64_t n, const std::function<void(int64_t i, int job)>& task);

  // A job starts claiming items (Join) and stops (Finish); an idle job runs offered tasks until
  // no job is busy. A job that joins after the others finished only loses their help.
  void Join();
  void Finish();
  void HelpUntilDone(int job);

 private:
  struct Offer {
    const std::function<void(int64_t, int)>* task;
    int64_t n = 0, next = 0, running = 0;
    int64_t error_index = -1;
    std::exception_ptr error;
  };
  // Runs task i of `offer` on `job`, with the lock released; records a failure.
  void RunOne(Offer& offer, int64_t i, int job, std::unique_lock<std::mutex>& lock);

  std::mutex mutex_;
  std::condition_variable changed_;  // a task offered or finished, or a job no longer busy
  std::list<Offer> offers_;          // list: an Offer stays put while others come and go
  int busy_ = 0;
};

// Calls body(job, i) for every i in [0, n) on `jobs` threads, job in [0, jobs) naming the thread
// (so it can use that job's own backends). Items are claimed in ascending order; after(i) runs
// under a lock once item i is done (progress lines). With one job everything runs on the calling
// thread. When a body throws, no further item is claimed, and once every thread has stopped the
// exception of the smallest failing i is rethrown: the one a sequential loop would have thrown.
// When the system refuses to start a thread, the jobs already started share the items (job
// numbers stay below `jobs`; the results do not depend on how many run). With `shared`, a job that
// finds no item left helps the others through it until every job is done (bodies offer tasks on
// it with SharedWork::Run).
void RunJobs(int64_t n, int jobs, const std::function<void(int job, int64_t i)>& body,
             const std::function<void(int64_t i)>& after = {}, SharedWork* shared = nullptr);

}  // namespace kvdiff::harness
