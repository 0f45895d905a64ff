#include "cli/engine_guard.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#include "format/scratch_dir.h"
#include "plugin_host/isolated_engine.h"

namespace kvdiff::cli {
namespace {

std::atomic<bool> finished{false};
std::atomic<int> verdict{0};  // main's exit code, once finished
std::atomic<bool> exiting{false};
thread_local bool exits_here = false;     // this thread is the one ending the process
thread_local bool finished_here = false;  // this thread reached the verdict (main's)
std::FILE* report = nullptr;

// glibc unlocks its list of exit handlers while it runs each one: a second thread calling exit()
// while the first is inside OnExit walks on through the handlers behind it and ends the process
// with its own status (in CI, a plugin's exit(0) on both campaign workers ended kvdiff with 0).
// So OnExit is registered this many times: each thread that calls exit() meets a copy of its own
// (a copy is used up by the thread that takes it): twice the most campaign workers kvdiff runs
// (--jobs 256), so an engine's own threads have room too. 1,024 registrations: microseconds.
constexpr int kGuardCopies = 512;

// Runs inside exit(): only calls that neither allocate nor lock, then _exit so no later handler
// can undo it. The first thread in ends the process; any other parks until it has. The scratch
// folders (an engine's model copy: 538 MB for smollm2) go either way: after main returns none is
// alive, and after an engine's exit() no destructor will remove them.
//   - before the verdict: exit 1 and a message, whatever status the engine gave;
//   - after it, from main: the normal exit (static destructors, the sanitizers' leak check);
//   - after it, from another thread (an engine's leftover thread): _exit with main's verdict.
void OnExit() {
  if (!exits_here) {
    if (exiting.exchange(true)) {
      for (;;) pause();
    }
    exits_here = true;
    format::RemoveLiveScratchDirs();
  }
  if (finished.load()) {
    if (finished_here) return;
    _exit(verdict.load());
  }
  static const char kMessage[] =
      "kvdiff: engine failure: the process was ended by exit() before kvdiff finished its work "
      "(an engine in this process called exit()?); no verdict was reached, so this run fails\n";
  [[maybe_unused]] const ssize_t n = write(STDERR_FILENO, kMessage, sizeof kMessage - 1);
  _exit(1);
}

}  // namespace

void InstallExitGuard() {
  for (int i = 0; i < kGuardCopies; ++i) {
    std::atexit(OnExit);
    std::at_quick_exit(OnExit);
  }
}

void MarkFinished(int exit_code) {
  if (report) std::fflush(report);
  verdict.store(exit_code);
  finished_here = true;
  finished.store(true);
}

std::FILE* Report() { return report ? report : stdout; }

void SeparateReportFromEngines() {
  if (report) return;
  std::fflush(stdout);
  // Close-on-exec: an engine-host child gets its own fd 1 (our stderr), never the report.
  const int fd = fcntl(STDOUT_FILENO, F_DUPFD_CLOEXEC, 3);
  if (fd < 0) return;  // no stdout to protect
  report = fdopen(fd, "w");
  if (!report) {
    close(fd);
    return;
  }
  if (isatty(fd)) setvbuf(report, nullptr, _IOLBF, 0);
  dup2(STDERR_FILENO, STDOUT_FILENO);
}

int ReportCloseFaults(int exit_code) {
  for (const std::string& fault : engines::TakeCloseFaults()) {
    fmt::print(stderr, "kvdiff: engine failure: {}\n", fault);
    exit_code = std::max(exit_code, 1);
  }
  return exit_code;
}

}  // namespace kvdiff::cli
