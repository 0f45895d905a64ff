#include "impl/batch_fault.h"

#include <fmt/format.h>

#include "format/error.h"

namespace kvdiff::impl {
namespace {

constexpr BatchFault kFaults[] = {BatchFault::kNone,
                                  BatchFault::kMaskOfPartZero,
                                  BatchFault::kSharedPositions,
                                  BatchFault::kRowsMisMapped,
                                  BatchFault::kSeesOtherSequence,
                                  BatchFault::kShiftNotRerotated,
                                  BatchFault::kShiftDeltaOverwritten,
                                  BatchFault::kShiftSkippedWhenEmpty,
                                  BatchFault::kWindowPlusOne,
                                  BatchFault::kWindowMinusOne,
                                  BatchFault::kRingSlicedByLogicalLength};

}  // namespace

const char* BatchFaultName(BatchFault fault) {
  switch (fault) {
    case BatchFault::kNone:
      return "none";
    case BatchFault::kMaskOfPartZero:
      return "batch-mask-of-part0";
    case BatchFault::kSharedPositions:
      return "batch-shared-positions";
    case BatchFault::kRowsMisMapped:
      return "batch-rows-swapped";
    case BatchFault::kSeesOtherSequence:
      return "batch-sees-other-sequence";
    case BatchFault::kShiftNotRerotated:
      return "shift-not-rerotated";
    case BatchFault::kShiftDeltaOverwritten:
      return "shift-delta-overwritten";
    case BatchFault::kShiftSkippedWhenEmpty:
      return "shift-skipped-when-empty";
    case BatchFault::kWindowPlusOne:
      return "window-plus-one";
    case BatchFault::kWindowMinusOne:
      return "window-minus-one";
    case BatchFault::kRingSlicedByLogicalLength:
      return "ring-sliced-by-logical-length";
  }
  return "?";
}

BatchFault ParseBatchFault(const std::string& name) {
  std::string names;
  for (BatchFault f : kFaults) {
    if (name == BatchFaultName(f)) return f;
    names += fmt::format("{}{}", names.empty() ? "" : ", ", BatchFaultName(f));
  }
  throw InputError(
      fmt::format("fault={}: expected one of {} (test-only faults of impl's batched forward, "
                  "context shift and sliding-window ring)",
                  name, names));
}

}  // namespace kvdiff::impl
