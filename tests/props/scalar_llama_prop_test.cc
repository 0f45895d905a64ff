// The test tree's own models must be right before their mutants prove anything: the unmutated
// scalar Llama and the correct raw-Forward driver pass every property, and the scalar model agrees
// with impl's ForwardFull within 1e-4.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "tests/props/prop_test_support.h"
#include "tests/props/properties.h"
#include "tests/props/raw_drivers.h"
#include "tests/props/scalar_llama.h"

namespace kvdiff::props {
namespace {

Target Scalar() {
  return Target{[](auto weights) { return MakeScalarBackend(weights, Fault::kNone); }, nullptr};
}
Target ScalarVsImpl() {
  Target target = Scalar();
  target.oracle = ImplFactory();
  return target;
}
Target RawDriver() {
  return Target{[](auto weights) { return MakeRawDriverBackend(weights, DriverFault::kNone); },
                nullptr};
}

RC_GTEST_PROP(ScalarLlamaProps, ForwardFullAgreesWithImpl, ()) {
  const ModelCase model = *GenSmallModel();
  const auto weights = model.MakeWeights();
  const Tokens prompt = *GenPrompt(model.config.vocab_size, model.Capacity());
  const Logits got = MakeScalarBackend(weights)->ForwardFull(prompt);
  const Logits want = ImplFactory()(weights)->ForwardFull(prompt);
  AssertRowsClose(got, 0, want, 0, static_cast<int64_t>(prompt.size()), kTolerance,
                  "scalar ForwardFull vs impl ForwardFull");
}
RC_GTEST_PROP(ScalarLlamaProps, ChunkingInvariance, ()) { ChunkingProperty(Scalar()); }
RC_GTEST_PROP(ScalarLlamaProps, DecodeMatchesUncachedGreedy, ()) { DecodeProperty(Scalar()); }
RC_GTEST_PROP(ScalarLlamaProps, ResetOrNewSessionLeaksNothing, ()) { ReuseProperty(Scalar()); }
RC_GTEST_PROP(ScalarLlamaProps, TruncateThenAppendEqualsScratch, ()) { TruncateProperty(Scalar()); }
RC_GTEST_PROP(ScalarLlamaProps, ForkEvolvesIndependently, ()) { ForkProperty(Scalar()); }
// Its sessions against impl's ForwardFull: the cross-implementation check the KV-head mutant needs.
RC_GTEST_PROP(ScalarLlamaProps, SessionsAgreeWithImpl, ()) { ChunkingProperty(ScalarVsImpl()); }
KVDIFF_PROP(ScalarLlamaProps, StatefulConversations, 30) { StatefulProperty(Scalar()); }
RC_GTEST_PROP(ScalarLlamaProps, BatchEqualsItemsAlone, ()) { BatchEqualsAloneProperty(Scalar()); }

RC_GTEST_PROP(RawDriverProps, DecodeMatchesUncachedGreedy, ()) { DecodeProperty(RawDriver()); }
RC_GTEST_PROP(RawDriverProps, ResetOrNewSessionLeaksNothing, ()) { ReuseProperty(RawDriver()); }
RC_GTEST_PROP(RawDriverProps, TruncateThenAppendEqualsScratch, ()) {
  TruncateProperty(RawDriver());
}
RC_GTEST_PROP(RawDriverProps, ChunkingInvariance, ()) { ChunkingProperty(RawDriver()); }
KVDIFF_PROP(RawDriverProps, StatefulConversations, 30) { StatefulProperty(RawDriver()); }

}  // namespace
}  // namespace kvdiff::props
