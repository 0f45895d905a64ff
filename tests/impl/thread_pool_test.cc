// ThreadPool: its bounds, its constructor's clean-up when the system refuses a thread, how it
// splits a range into chunks and runs every index and every item exactly once.
#include "impl/thread_pool.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <mutex>
#include <system_error>
#include <vector>

#include "format/error.h"
#include "format/sanitizer_runtime.h"

namespace kvdiff::impl {
namespace {

TEST(ThreadPoolBounds, RefusesMoreThanKMaxThreadsAndNegativeCounts) {
  EXPECT_THROW(ThreadPool(kMaxThreads + 1), InputError);
  EXPECT_THROW(ThreadPool(-1), InputError);
  ThreadPool pool(0);  // every core, capped at kMaxThreads
  EXPECT_GE(pool.Size(), 1);
  EXPECT_LE(pool.Size(), kMaxThreads);
}

// In a child with so little address space that thread stacks run out after a few threads: the
// constructor must throw std::system_error (after joining the workers it started) instead of
// hanging on them or terminating. The parent gives the child 20 seconds.
TEST(ThreadPoolBounds, ARefusedThreadUnwindsCleanly) {
#ifdef KVDIFF_SANITIZER_RUNTIME
  GTEST_SKIP() << "the sanitizer reserves terabytes of address space; RLIMIT_AS cannot be used";
#else
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    alarm(20);
    rlimit limit{};
    getrlimit(RLIMIT_AS, &limit);
    // Room for the process as it is plus a few 8 MiB stacks, not for kMaxThreads of them.
    FILE* f = std::fopen("/proc/self/statm", "r");
    unsigned long pages = 0;
    if (f == nullptr || std::fscanf(f, "%lu", &pages) != 1) _exit(3);
    std::fclose(f);
    limit.rlim_cur = pages * static_cast<unsigned long>(sysconf(_SC_PAGESIZE)) + (64ul << 20);
    if (setrlimit(RLIMIT_AS, &limit) != 0) _exit(4);
    try {
      ThreadPool pool(kMaxThreads);
      _exit(5);  // every thread started: the limit did not bite, nothing shown
    } catch (const std::system_error&) {
      _exit(0);
    } catch (...) {
      _exit(6);
    }
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "the child died of signal " << WTERMSIG(status)
                                 << " (a hang hits the alarm; a leaked joinable thread aborts)";
  if (WEXITSTATUS(status) == 5) GTEST_SKIP() << "every thread started under the limit";
  EXPECT_EQ(WEXITSTATUS(status), 0);
#endif
}

TEST(ThreadPoolTest, ChunksCoverTheRangeOnGrainBoundaries) {
  for (int threads : {1, 2, 3, 7}) {
    for (int64_t n : {1, 15, 16, 17, 100, 576, 49152}) {
      int64_t expected_begin = 0;
      for (int t = 0; t < threads; ++t) {
        auto [b, e] = ThreadPool::Chunk(n, 16, threads, t);
        EXPECT_EQ(b, expected_begin) << "n=" << n << " threads=" << threads << " t=" << t;
        EXPECT_LE(b, e);
        if (e < n) {
          EXPECT_EQ(e % 16, 0);
        }
        expected_begin = e;
      }
      EXPECT_EQ(expected_begin, n);
    }
  }
}

TEST(ThreadPoolTest, EveryIndexRunsExactlyOnceInChunksOnGrainBoundaries) {
  ThreadPool pool(3);
  for (int round = 0; round < 200; ++round) {
    std::vector<int> hits(1000, 0);
    std::vector<int> owner(1000, -1);
    std::vector<int64_t> begins;
    std::mutex mutex;
    pool.ParallelFor(1000, 7, [&](int64_t b, int64_t e, int t) {
      {
        std::lock_guard<std::mutex> lock(mutex);
        begins.push_back(b);
      }
      ASSERT_TRUE(t >= 0 && t < 3);
      for (int64_t i = b; i < e; ++i) {
        ++hits[i];
        owner[i] = t;
      }
    });
    for (int i = 0; i < 1000; ++i) ASSERT_EQ(hits[i], 1) << "index " << i << " round " << round;
    for (int64_t b : begins) ASSERT_EQ(b % 7, 0);
  }
}

TEST(ThreadPoolTest, ForEachRunsEveryItemOnceAndAlone) {
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    for (int64_t n : {int64_t{1}, int64_t{2}, int64_t{5}, int64_t{200}}) {
      std::vector<int> hits(n, 0);
      pool.ParallelForEach(n, [&](int64_t b, int64_t e, int t) {
        ASSERT_EQ(e, b + 1);
        ASSERT_TRUE(t >= 0 && t < threads);
        ++hits[b];
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i], 1) << "item " << i << " of " << n;
    }
  }
}

}  // namespace
}  // namespace kvdiff::impl
