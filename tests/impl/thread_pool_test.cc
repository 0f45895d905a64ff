// ThreadPool's bounds and its constructor's clean-up when the system refuses a thread.
#include "impl/thread_pool.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <system_error>

#include "format/error.h"

namespace kvdiff::impl {
namespace {

TEST(ThreadPoolBounds, RefusesMoreThanKMaxThreadsAndNegativeCounts) {
  EXPECT_THROW(ThreadPool(kMaxThreads + 1), InputError);
  EXPECT_THROW(ThreadPool(-1), InputError);
  ThreadPool pool(0);  // every core, capped at kMaxThreads
  EXPECT_GE(pool.Size(), 1);
  EXPECT_LE(pool.Size(), kMaxThreads);
}

#if defined(__SANITIZE_ADDRESS__)
#define KVDIFF_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVDIFF_UNDER_ASAN 1
#endif
#endif

// In a child with so little address space that thread stacks run out after a few threads: the
// constructor must throw std::system_error (after joining the workers it started) instead of
// hanging on them or terminating. The parent gives the child 20 seconds.
TEST(ThreadPoolBounds, ARefusedThreadUnwindsCleanly) {
#ifdef KVDIFF_UNDER_ASAN
  GTEST_SKIP() << "AddressSanitizer reserves terabytes of address space; RLIMIT_AS cannot be used";
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

}  // namespace
}  // namespace kvdiff::impl
