#include "harness/campaign/jobs.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

namespace kvdiff::harness {

int ResolveJobs(int requested, int64_t items) {
  int64_t jobs = requested;
  if (jobs <= 0) jobs = std::max(1u, std::thread::hardware_concurrency());
  return static_cast<int>(std::max<int64_t>(1, std::min(jobs, items)));
}

void RunJobs(int64_t n, int jobs, const std::function<void(int job, int64_t i)>& body,
             const std::function<void(int64_t i)>& after) {
  if (jobs <= 1) {
    for (int64_t i = 0; i < n; ++i) {
      body(0, i);
      if (after) after(i);
    }
    return;
  }
  std::atomic<int64_t> next{0};
  std::atomic<bool> stop{false};
  std::mutex mutex;  // guards after() and the first error
  int64_t error_index = n;
  std::exception_ptr error;
  auto work = [&](int job) {
    while (!stop.load()) {
      const int64_t i = next.fetch_add(1);
      if (i >= n) return;
      try {
        body(job, i);
        std::lock_guard<std::mutex> lock(mutex);
        if (after) after(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex);
        if (i < error_index) {
          error_index = i;
          error = std::current_exception();
        }
        stop.store(true);
      }
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(jobs - 1);
  for (int j = 1; j < jobs; ++j) {
    try {
      threads.emplace_back(work, j);
    } catch (const std::system_error&) {
      break;  // out of threads (EAGAIN): the jobs started take the rest of the items
    }
  }
  work(0);
  for (auto& t : threads) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace kvdiff::harness
