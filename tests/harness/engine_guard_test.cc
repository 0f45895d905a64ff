// kvdiff's exit guard (cli/engine_guard.h): whatever thread calls exit(), and however many at
// once, the process ends with 1 before main's verdict and with that verdict after it. Each case
// runs in a forked child whose guard is installed there, and reads the child's exit status.
#include "cli/engine_guard.h"

#include <gtest/gtest.h>
#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <functional>
#include <string>

#include "format/scratch_dir.h"

namespace kvdiff::testing {
namespace {

// The child's exit status, or -1 when a signal ended it. `body` must end the process.
int ExitStatusOf(const std::function<void()>& body) {
  const pid_t pid = fork();
  if (pid == 0) {
    cli::InstallExitGuard();
    body();
    _exit(99);
  }
  int status = 0;
  EXPECT_EQ(waitpid(pid, &status, 0), pid);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

void* ExitZero(void*) { std::exit(0); }
// Starts a thread that calls exit(0).
void StartExitZero() {
  pthread_t thread;
  if (pthread_create(&thread, nullptr, ExitZero, nullptr) == 0) pthread_detach(thread);
}
// A live scratch folder of 2,000 files (never destroyed: the guard is to remove it), which makes
// the guard's work slow enough for a thread behind it to lose every race without the fix.
void LeaveAScratchFolderOf2000Files() {
  auto* scratch = new format::ScratchDir("guard-test");
  for (int f = 0; f < 2000; ++f) std::ofstream(scratch->path() / std::to_string(f)) << f;
}
// Registered after the guard, so the exiting thread runs it first: another thread's exit(0)
// begins while this one is held (as an engine's thread does while kvdiff exits).
void StartExitZeroAndWait() {
  StartExitZero();
  usleep(200 * 1000);
}

TEST(ExitGuard, AnExitBeforeTheVerdictEndsTheProcessWithOne) {
  EXPECT_EQ(ExitStatusOf([] { std::exit(0); }), 1);
  EXPECT_EQ(ExitStatusOf([] { std::quick_exit(0); }), 1);
}

TEST(ExitGuard, AnExitFromAnotherThreadBeforeTheVerdictEndsItWithOne) {
  EXPECT_EQ(ExitStatusOf([] {
              StartExitZero();
              pause();
            }),
            1);
}

// As an engine's exit(0) on two campaign workers did in CI: the thread in the guard was removing
// an engine's model copy while the other reached _exit(0). StartExitZero, registered after the
// guard, starts the second exit(0), and this thread goes on at once into the guard.
TEST(ExitGuard, TwoThreadsExitingAtOnceBeforeTheVerdictEndItWithOne) {
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(ExitStatusOf([] {
                LeaveAScratchFolderOf2000Files();
                std::atexit(StartExitZero);
                std::exit(0);
              }),
              1);
  }
}

// Every thread that exits takes a copy of the guard and parks in it: 300 at once (more than the
// 256 campaign workers --jobs allows), while the first removes the 2,000 files.
TEST(ExitGuard, ThreeHundredThreadsExitingAtOnceEndItWithOne) {
  EXPECT_EQ(ExitStatusOf([] {
              LeaveAScratchFolderOf2000Files();
              for (int t = 0; t < 300; ++t) StartExitZero();
              pause();
            }),
            1);
}

TEST(ExitGuard, MainsVerdictIsTheStatus) {
  EXPECT_EQ(ExitStatusOf([] {
              cli::MarkFinished(0);
              std::exit(0);
            }),
            0);
  EXPECT_EQ(ExitStatusOf([] {
              cli::MarkFinished(1);
              std::exit(1);
            }),
            1);
}

// An engine's leftover thread calling exit(0) while main exits with a failing verdict: it ended
// the process with 0 (it passed the guard after the verdict and ran on to _exit(0)).
TEST(ExitGuard, AnotherThreadsExitAfterTheVerdictKeepsTheVerdict) {
  EXPECT_EQ(ExitStatusOf([] {
              cli::MarkFinished(1);
              std::atexit(StartExitZeroAndWait);
              std::exit(1);
            }),
            1);
}

}  // namespace
}  // namespace kvdiff::testing
