// The properties on the exact shape of SmolLM2-135M (30 layers, 9 heads / 3 KV heads, vocab
// 49152) with random weights: a few cases only, labelled slow (each case builds 135M weights).
#include "tests/props/prop_test_support.h"
#include "tests/props/properties.h"

namespace kvdiff::props {
namespace {

Target ImplSmollm2() {
  Target target{ImplFactory(), nullptr};
  target.models = GenPresetModel("smollm2-135m");
  target.max_positions = 12;  // of its 8192: a case must stay in seconds
  return target;
}

KVDIFF_PROP(Smollm2Props, ChunkingInvariance, 3) { ChunkingProperty(ImplSmollm2()); }
KVDIFF_PROP(Smollm2Props, DecodeMatchesUncachedGreedy, 3) { DecodeProperty(ImplSmollm2()); }

}  // namespace
}  // namespace kvdiff::props
