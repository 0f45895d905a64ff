// Faulty callers of impl's raw candle-style Model::Forward(tokens, index_pos, cache), wrapped as
// harness backends so the properties can run on them. Each reproduces one way a port gets the
// position or the cache wrong (../shared/seed/); kNone is the correct caller, which must pass.
#pragma once

#include <memory>
#include <string>

#include "format/model_files.h"
#include "harness/backend/backend.h"

namespace kvdiff::props {

enum class DriverFault {
  kNone,                   // index_pos = the caller's running position; Reset clears the cache
  kPos0,                   // index_pos 0 on every call (the seed's `pos0`)
  kReuse,                  // one cache for every conversation, never cleared (seed's `reuse`):
                           // Reset() and NewSession() only restart the position at 0
  kPosOffByOne,            // after the first call, index_pos = position + 1
  kTruncateKeepsPosition,  // Truncate crops the cache but leaves the position where it was
};
std::string DriverFaultName(DriverFault fault);

// ForwardFull is impl's (correct); sessions drive Model::Forward the faulty way.
std::unique_ptr<harness::Backend> MakeRawDriverBackend(
    std::shared_ptr<const format::ModelWeights> weights, DriverFault fault);

}  // namespace kvdiff::props
