// `kvdiff run --html`: the run's report as one self-contained page, made from the same RunReport
// as --json (so the figures are the JSON's): the summary, the per-step table, |a-b| per row
// against position with the gate and the first divergence, and with --localize the per-layer map.
#pragma once

#include <string>

#include "harness/run/differential_run.h"

namespace kvdiff::harness {

std::string RunReportToHtml(const RunReport& report);

}  // namespace kvdiff::harness
