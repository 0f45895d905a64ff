// What keeps an engine under test from deciding kvdiff's verdict: the engine is, by definition,
// code that may be broken, and kvdiff the gate that must survive it. Three holes an engine could
// otherwise use, each closed here for main and the commands that load engines:
//   - exit: a plugin calling exit(0) in process would end kvdiff with status 0 and no report. An
//     exit handler, installed before any plugin is loaded, turns every exit that main did not
//     reach into exit 1 with a message (in the engine-host child too, so the parent sees a
//     failure), whichever thread calls exit() and however many at once. _exit() bypasses every
//     handler: only isolation (the default) catches that. The handler also removes kvdiff's
//     scratch folders (format::RemoveLiveScratchDirs), which the engine's exit() would otherwise
//     leave in the temporary directory.
//   - stdout: whatever an in-process engine prints (printf, std::cout, write(1)) must not be
//     taken for kvdiff's report. Commands that load engines print their report to Report(), a
//     private duplicate of the fd 1 kvdiff started with; fd 1 itself then points at stderr.
//   - close: an isolated engine that crashes, hangs or exits while closing fails the run
//     (engines::TakeCloseFaults, reported by ReportCloseFaults).
#pragma once

#include <cstdio>

namespace kvdiff::cli {

// Call first thing in main; MarkFinished just before main returns its exit code, with that code
// (the status the process ends with, whichever thread calls exit() afterwards).
void InstallExitGuard();
void MarkFinished(int exit_code);

// kvdiff's report stream: stdout until SeparateReportFromEngines, its private duplicate after.
std::FILE* Report();
// For commands that may load engines, before the first one is loaded. Idempotent.
void SeparateReportFromEngines();

// Prints every close fault of an isolated engine on stderr; returns the exit code the run then
// has (at least 1 when there was one).
int ReportCloseFaults(int exit_code);

}  // namespace kvdiff::cli
