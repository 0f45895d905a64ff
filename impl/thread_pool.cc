#include "impl/thread_pool.h"

#include <algorithm>
#include <chrono>

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

}  // namespace

ThreadPool::ThreadPool(int threads) {
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  size_ = threads;
  workers_.reserve(size_ - 1);
  for (int i = 1; i < size_; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_.store(true);
    generation_.fetch_add(1);
  }
  wake_.notify_all();
  for (auto& worker : workers_) worker.join();
}

std::pair<int64_t, int64_t> ThreadPool::Chunk(int64_t n, int64_t grain, int threads, int t) {
  // Whole grains are dealt out as evenly as possible; the last chunk also takes the remainder.
  const int64_t grains = (n + grain - 1) / grain;
  auto bound = [&](int k) { return std::min(n, grain * ((grains * k) / threads)); };
  return {bound(t), t + 1 == threads ? n : bound(t + 1)};
}

void ThreadPool::Run(int64_t n, int64_t grain, Trampoline call, void* fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  if (size_ == 1 || n <= grain) {
    call(fn, 0, n, 0);
    return;
  }
  job_call_ = call;
  job_fn_ = fn;
  job_n_ = n;
  job_grain_ = grain;
  pending_.store(size_ - 1);
  generation_.fetch_add(1);  // publishes the job (seq_cst: ordered before reading sleepers_)
  if (sleepers_.load() > 0) {
    std::lock_guard<std::mutex> lock(mutex_);
    wake_.notify_all();
  }
  auto [begin, end] = Chunk(n, grain, size_, 0);
  if (begin < end) call(fn, begin, end, 0);
  // A worker that lost its core (other processes, more threads than cores) only comes back if we
  // give the core up: spin briefly, then yield.
  for (int spins = 0; pending_.load(std::memory_order_acquire) > 0; ++spins) {
    if (spins < kSpinsBeforeYield) {
      KVDIFF_CPU_RELAX();
    } else {
      std::this_thread::yield();
    }
  }
}

void ThreadPool::WorkerLoop(int index) {
  uint64_t seen = 0;
  while (true) {
    // Wait for a new generation: spin first, then sleep.
    auto spin_start = std::chrono::steady_clock::now();
    int spins = 0;
    while (generation_.load(std::memory_order_acquire) == seen) {
      if (spins < kSpinsBeforeYield) {
        KVDIFF_CPU_RELAX();
      } else {
        std::this_thread::yield();
      }
      if (++spins % 256 == 0 && std::chrono::steady_clock::now() - spin_start > kSpinBeforeSleep) {
        sleepers_.fetch_add(1);
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return generation_.load() != seen; });
        sleepers_.fetch_sub(1);
        break;
      }
    }
    seen = generation_.load(std::memory_order_acquire);
    if (stop_.load()) return;
    auto [begin, end] = Chunk(job_n_, job_grain_, size_, index);
    if (begin < end) job_call_(job_fn_, begin, end, index);
    pending_.fetch_sub(1, std::memory_order_release);
  }
}

}  // namespace kvdiff::impl
