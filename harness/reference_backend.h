// The LibTorch backends ("ref", "ref64"), compiled only when KVDIFF_WITH_TORCH is on.
#pragma once

#include <memory>
#include <string>

#include "harness/backend.h"

namespace kvdiff::harness {

// name: "ref" (float32) or "ref64" (float64).
std::unique_ptr<Backend> MakeReferenceBackend(const std::string& name,
                                              std::shared_ptr<const format::ModelWeights> weights,
                                              int threads);

}  // namespace kvdiff::harness
