// A small persistent thread pool for the forward pass. Decode runs ~120 parallel regions per token
// (tens of microseconds each), so workers spin briefly between regions instead of sleeping on a
// condition variable every time; after a short idle spell they do sleep, so an idle model costs no
// CPU. Work is claimed dynamically in chunks and a worker that wakes late simply misses the job:
// on a busy machine (CI, several builds) the caller never waits for a thread that has not started.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace kvdiff::impl {

// The most threads a pool (and the command line's --threads) accepts: 256, more than the cores of
// any machine kvdiff is meant for; past it a typo like --threads 100000 would start a hundred
// thousand threads before the system refused one.
inline constexpr int kMaxThreads = 256;

class ThreadPool {
 public:
  // threads: total threads including the caller; 0 means std::thread::hardware_concurrency().
  // InputError when threads is negative or above kMaxThreads. When the system refuses a thread,
  // the workers already started are stopped and joined before the std::system_error propagates.
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int Size() const { return size_; }

  // Runs fn(begin, end, thread_index) over chunks covering [0, n) exactly once, chunk boundaries
  // at multiples of `grain`; thread_index < Size() identifies the executing thread (for per-thread
  // scratch). Which thread runs a chunk varies from call to call, so kernels must compute each
  // output element the same way whatever its chunk: then results are identical for any thread
  // count. Not reentrant: one ParallelFor at a time per pool (Model serializes its forward calls).
  template <typename Fn>
  void ParallelFor(int64_t n, int64_t grain, Fn&& fn) {
    Run(n, grain, kChunksPerThread * size_, Call<Fn>, Address(fn));
  }

  // Runs fn(i, i + 1, thread_index) once for each i < n, every item claimed on its own as a
  // thread comes free: for items worth tens of microseconds (GEMM tiles), where one atomic claim
  // each costs nothing and a thread never waits on more than one item at the end of a call.
  template <typename Fn>
  void ParallelForEach(int64_t n, Fn&& fn) {
    if (size_ == 1) {  // Run would make the whole range one call
      for (int64_t i = 0; i < n; ++i) fn(i, i + 1, 0);
      return;
    }
    Run(n, 1, n, Call<Fn>, Address(fn));
  }

  // Chunk c of `chunks` over [0, n), rounded to grain (exposed for tests).
  static std::pair<int64_t, int64_t> Chunk(int64_t n, int64_t grain, int64_t chunks, int64_t c);

 private:
  // Chunks per thread in ParallelFor: enough that a slow or late thread leaves its share to the
  // others.
  static constexpr int64_t kChunksPerThread = 4;

  void StopWorkers();  // wakes every worker with stop_ set and joins it
  using Trampoline = void (*)(void*, int64_t, int64_t, int);
  template <typename Fn>
  static void Call(void* f, int64_t b, int64_t e, int t) {
    (*static_cast<std::remove_reference_t<Fn>*>(f))(b, e, t);
  }
  template <typename Fn>
  static void* Address(Fn& fn) {
    return const_cast<void*>(static_cast<const void*>(&fn));
  }
  // [0, n) in up to max_chunks chunks on grain boundaries.
  void Run(int64_t n, int64_t grain, int64_t max_chunks, Trampoline call, void* fn);
  void Work(int thread_index);  // claims and runs chunks of the current job until none is left
  void WorkerLoop(int index);

  int size_;
  std::vector<std::thread> workers_;
  // The current job. Workers read it only after joining it (see state_).
  Trampoline job_call_ = nullptr;
  void* job_fn_ = nullptr;
  int64_t job_n_ = 0;
  int64_t job_grain_ = 1;
  int64_t job_chunks_ = 0;
  std::atomic<int64_t> next_chunk_{0};
  // state_ = generation << 32 | closed << 31 | workers inside the job. A worker joins by
  // incrementing the count while the job is open; the caller closes it when all chunks are
  // claimed and waits only for the workers that joined.
  std::atomic<uint64_t> state_{0};
  std::atomic<uint64_t> generation_{0};  // what sleeping/spinning workers watch
  std::atomic<int> sleepers_{0};
  std::atomic<bool> stop_{false};
  std::mutex mutex_;
  std::condition_variable wake_;
};

}  // namespace kvdiff::impl
