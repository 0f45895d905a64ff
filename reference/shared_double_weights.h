// ref64's weights in double, converted once per process: a campaign's jobs each build their own
// backends over one copy of the float weights, and each ref64 converting its own would hold
// another 1.1 GB on smollm2-135m per job.
#pragma once

#include <ATen/ATen.h>

#include "format/model_files.h"

namespace kvdiff::ref {

// `t` converted to double (exactly: every float is a double), shared with every other caller
// that converts the same tensor while any of them still holds it. Thread-safe. The result does
// not alias `t`, whose address is only the key: a caller keeps `t`'s weights alive while it holds
// the result (ReferenceModel holds its weights), so the address cannot be reused meanwhile.
at::Tensor SharedDoubleCopy(const format::Tensor& t);

}  // namespace kvdiff::ref
