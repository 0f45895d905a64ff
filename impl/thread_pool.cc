#include "impl/thread_pool.h"

#include <algorithm>
#include <chrono>

#include "format/error.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KVDIFF_CPU_RELAX() _mm_pause()
#else
#define KVDIFF_CPU_RELAX() std::this_thread::yield()
#endif

namespace kvdiff::impl {
namespace {

// How long an idle worker spins before sleeping. Long enough to bridge the serial gaps between
// the parallel regions of one decode step (RMSNorm, RoPE: microseconds), short enough that a
// model nobody is calling does not burn a core the rest of the machine (and CI) needs.
constexpr auto kSpinBeforeSleep = std::chrono::microseconds(200);
// Pause-spins before a waiting thread starts yielding its core (a few microseconds).
constexpr int kSpinsBeforeYield = 2000;

constexpr uint64_t kClosed = uint64_t{1} << 31;
constexpr uint64_t kCountMask = kClosed - 1;

void Relax(int& spins) {
  if (++spins < kSpinsBeforeYield) {
    KVDIFF_CPU_RELAX();
  } else {
    std::this_thread::yield();
  }
}

}  // namespace

ThreadPool::ThreadPool(int threads) {
  KVDIFF_CHECK(threads >= 0 && threads <= kMaxThreads,
               "threads: expected 0 (every core) to {}, got {}", kMaxThreads, threads);
  if (threads == 0) {
    threads =
        std::min(kMaxThreads, static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  }
  size_ = threads;
  workers_.reserve(size_ - 1);
  try {
    for (int i = 1; i < size_; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
  } catch (...) {
    // The destructor does not run for a constructor that throws: the workers started so far
    // would wait on wake_ forever, and destroying a joinable std::thread terminates.
    StopWorkers();
    throw;
  }
}

ThreadPool::~ThreadPool() { StopWorkers(); }

void ThreadPool::StopWorkers() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_.store(true);
    generation_.fetch_add(1);
  }
  wake_.notify_all();
  for (auto& worker : workers_) worker.join();
}

std::pair<int64_t, int64_t> ThreadPool::Chunk(int64_t n, int64_t grain, int64_t chunks, int64_t c) {
  // Whole grains are dealt out as evenly as possible; the last chunk also takes the remainder.
  const int64_t grains = (n + grain - 1) / grain;
  auto bound = [&](int64_t k) { return std::min(n, grain * ((grains * k) / chunks)); };
  return {bound(c), c + 1 == chunks ? n : bound(c + 1)};
}

void ThreadPool::Work(int thread_index) {
  while (true) {
    const int64_t c = next_chunk_.fetch_add(1);
    if (c >= job_chunks_) return;
    auto [begin, end] = Chunk(job_n_, job_grain_, job_chunks_, c);
    if (begin < end) job_call_(job_fn_, begin, end, thread_index);
  }
}

void ThreadPool::Run(int64_t n, int64_t grain, int64_t max_chunks, Trampoline call, void* fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t grains = (n + grain - 1) / grain;
  if (size_ == 1 || grains == 1) {
    call(fn, 0, n, 0);
    return;
  }
  job_call_ = call;
  job_fn_ = fn;
  job_n_ = n;
  job_grain_ = grain;
  job_chunks_ = std::min<int64_t>(grains, max_chunks);
  next_chunk_.store(0);
  const uint64_t generation = generation_.load() + 1;
  state_.store(generation << 32);  // open, nobody inside
  generation_.store(generation);   // seq_cst: ordered before reading sleepers_
  if (sleepers_.load() > 0) {
    std::lock_guard<std::mutex> lock(mutex_);
    wake_.notify_all();
  }
  Work(0);
  // Every chunk is claimed: close the job and wait for the workers inside it (they may still be
  // finishing a chunk). Workers that arrive later see it closed and go back to waiting.
  state_.fetch_or(kClosed);
  int spins = 0;
  while ((state_.load() & kCountMask) != 0) Relax(spins);
}

void ThreadPool::WorkerLoop(int index) {
  uint64_t seen = 0;
  while (true) {
    // Wait for a new generation: spin first, then sleep.
    auto spin_start = std::chrono::steady_clock::now();
    int spins = 0;
    while (generation_.load() == seen) {
      Relax(spins);
      if (spins % 256 == 0 && std::chrono::steady_clock::now() - spin_start > kSpinBeforeSleep) {
        sleepers_.fetch_add(1);
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return generation_.load() != seen; });
        sleepers_.fetch_sub(1);
        break;
      }
    }
    seen = generation_.load();
    if (stop_.load()) return;
    // Join the job of generation `seen` if it is still open.
    uint64_t state = state_.load();
    bool joined = false;
    while ((state >> 32) == seen && !(state & kClosed)) {
      if (state_.compare_exchange_weak(state, state + 1)) {
        joined = true;
        break;
      }
    }
    if (!joined) continue;
    Work(index);
    state_.fetch_sub(1);
  }
}

}  // namespace kvdiff::impl
