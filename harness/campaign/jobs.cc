#include "harness/campaign/jobs.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <iterator>
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

void SharedWork::RunOne(Offer& offer, int64_t i, int job, std::unique_lock<std::mutex>& lock) {
  ++offer.running;
  lock.unlock();
  std::exception_ptr error;
  try {
    (*offer.task)(i, job);
  } catch (...) {
    error = std::current_exception();
  }
  lock.lock();
  --offer.running;
  if (error && (offer.error_index < 0 || i < offer.error_index)) {
    offer.error_index = i;
    offer.error = error;
  }
  changed_.notify_all();
}

void SharedWork::Run(int job, int64_t n, const std::function<void(int64_t i, int job)>& task) {
  std::unique_lock<std::mutex> lock(mutex_);
  Offer mine;
  mine.task = &task;
  mine.n = n;
  offers_.push_back(mine);
  const auto offer = std::prev(offers_.end());
  changed_.notify_all();
  while (offer->next < offer->n) RunOne(*offer, offer->next++, job, lock);
  // The tasks an idle job took: never waited on before they started, so this cannot deadlock.
  changed_.wait(lock, [&] { return offer->running == 0; });
  const std::exception_ptr error = offer->error;
  offers_.erase(offer);
  if (error) std::rethrow_exception(error);
}

void SharedWork::Join() {
  std::lock_guard<std::mutex> lock(mutex_);
  ++busy_;
}

void SharedWork::Finish() {
  std::lock_guard<std::mutex> lock(mutex_);
  --busy_;
  changed_.notify_all();
}

void SharedWork::HelpUntilDone(int job) {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    auto open =
        std::find_if(offers_.begin(), offers_.end(), [](const Offer& o) { return o.next < o.n; });
    if (open != offers_.end()) {
      RunOne(*open, open->next++, job, lock);
      continue;
    }
    if (busy_ <= 0) return;
    changed_.wait(lock);
  }
}

void RunJobs(int64_t n, int jobs, const std::function<void(int job, int64_t i)>& body,
             const std::function<void(int64_t i)>& after, SharedWork* shared) {
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
  auto claim = [&](int job) {
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
  auto work = [&](int job) {
    if (!shared) return claim(job);
    claim(job);
    shared->Finish();
    shared->HelpUntilDone(job);
  };
  std::vector<std::thread> threads;
  threads.reserve(jobs - 1);
  // Every job is busy from the start, so none stops helping before the others began.
  if (shared) {
    for (int j = 0; j < jobs; ++j) shared->Join();
  }
  for (int j = 1; j < jobs; ++j) {
    try {
      threads.emplace_back(work, j);
    } catch (const std::system_error&) {
      // Out of threads (EAGAIN): the jobs started take the rest of the items.
      for (int k = j; shared && k < jobs; ++k) shared->Finish();
      break;
    }
  }
  work(0);
  for (auto& t : threads) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace kvdiff::harness
