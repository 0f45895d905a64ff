// A small persistent thread pool for the forward pass. Decode runs ~120 parallel regions per token
// (a few microseconds each on small matrices), so workers spin briefly between regions instead of
// sleeping on a condition variable every time; after a short idle spell they do sleep, so an idle
// model costs no CPU.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace kvdiff::impl {

class ThreadPool {
 public:
  // threads: total threads including the caller; 0 means std::thread::hardware_concurrency().
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int Size() const { return size_; }

  // Splits [0, n) into Size() contiguous chunks whose boundaries are multiples of `grain` and runs
  // fn(begin, end, thread_index) once per non-empty chunk, the caller taking chunk 0. The split is
  // static: which thread computes an element never changes its arithmetic, so kernels that compute
  // each output element in a fixed order give identical results for any thread count.
  // Not reentrant: one ParallelFor at a time per pool (Model serializes its forward calls).
  template <typename Fn>
  void ParallelFor(int64_t n, int64_t grain, Fn&& fn) {
    using F = std::remove_reference_t<Fn>;
    Run(n, grain, [](void* f, int64_t b, int64_t e, int t) { (*static_cast<F*>(f))(b, e, t); },
        const_cast<void*>(static_cast<const void*>(&fn)));
  }

  // Chunk t of Size() over [0, n) rounded to grain (exposed for tests).
  static std::pair<int64_t, int64_t> Chunk(int64_t n, int64_t grain, int threads, int t);

 private:
  using Trampoline = void (*)(void*, int64_t, int64_t, int);
  void Run(int64_t n, int64_t grain, Trampoline call, void* fn);
  void WorkerLoop(int index);

  int size_;
  std::vector<std::thread> workers_;
  // The current job, published by bumping generation_.
  Trampoline job_call_ = nullptr;
  void* job_fn_ = nullptr;
  int64_t job_n_ = 0;
  int64_t job_grain_ = 1;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<int> sleepers_{0};
  std::atomic<bool> stop_{false};
  std::mutex mutex_;
  std::condition_variable wake_;
};

}  // namespace kvdiff::impl
