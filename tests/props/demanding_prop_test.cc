// Numerically demanding models (generators.h, GenDemandingModel: make-model --scale demanding on
// the properties' small shapes): impl holds the relative gate on them, and two faults that are
// right only for O(1) numbers, built into the test's scalar model (scalar_llama.h, outside impl),
// pass the same property (the scalar model's cached rows against impl's ForwardFull) on ordinary
// models and fail it on demanding ones:
//  * softmax-without-max: float32 exp(s) / sum exp(s); scores in the hundreds overflow exp;
//  * naive-float32-rmsnorm: the sum of squares in float32; hidden states of ~1e19 overflow it.
// The test prints, for each, how many cases ran before the failure and the shrunk counterexample.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/detail/TestListenerAdapter.h>
#include <rapidcheck/gtest.h>

#include <iostream>
#include <string>

#include "tests/props/prop_test_support.h"
#include "tests/props/properties.h"
#include "tests/props/scalar_llama.h"

namespace kvdiff::props {
namespace {

Target OnDemandingModels(Target target) {
  target.models = GenDemandingModel();
  target.tolerance = harness::Tolerance(kTolerance, kDemandingRtol);
  return target;
}
// The scalar model (with its fault) against impl: a naive float32 RMSNorm is self-consistent (its
// cached and uncached rows are the same zeros), so only another implementation sees it.
Target ScalarVsImpl(Fault fault) {
  return Target{[fault](auto w) { return MakeScalarBackend(w, fault); }, ImplFactory()};
}

// impl's cached rows against its own ForwardFull, and against the scalar model (float64
// accumulation, a second implementation), on demanding models.
RC_GTEST_PROP(DemandingProps, ImplChunkingInvariance, ()) {
  ChunkingProperty(OnDemandingModels(Target{ImplFactory(), nullptr}));
}
RC_GTEST_PROP(DemandingProps, ImplDecodeMatchesUncachedGreedy, ()) {
  DecodeProperty(OnDemandingModels(Target{ImplFactory(), nullptr}));
}
RC_GTEST_PROP(DemandingProps, ImplEqualsScalarModel, ()) {
  ChunkingProperty(
      OnDemandingModels(Target{ImplFactory(), [](auto w) { return MakeScalarBackend(w); }}));
}
KVDIFF_PROP(DemandingProps, ImplStatefulConversations, 50) {
  StatefulProperty(OnDemandingModels(Target{ImplFactory(), nullptr}));
}

// The first failure of the chunking property (each case a fresh prompt and chunk split) on the
// target, with the shrunk counterexample (RapidCheck's configured parameters, RC_PARAMS).
struct Outcome {
  bool failed = false;
  int64_t cases = 0;  // the case that failed (1-based), or the cases run
  std::string description;
};
Outcome RunChunking(const Target& target, const std::string& id) {
  const rc::detail::TestParams params = rc::detail::configuration().testParams;
  rc::detail::TestListenerAdapter silent;
  rc::detail::TestMetadata metadata;
  metadata.id = id;
  const auto property = rc::detail::toProperty([target] { ChunkingProperty(target); });
  const auto result = rc::detail::checkProperty(property, metadata, params, silent, {});
  Outcome out;
  if (result.is<rc::detail::FailureResult>()) {
    const auto failure = result.get<rc::detail::FailureResult>();
    out.failed = true;
    out.cases = failure.numSuccess + 1;
    out.description = failure.description;
  } else {
    out.cases = params.maxSuccess;
  }
  return out;
}

TEST(DemandingMutants, CaughtOnDemandingModelsOnly) {
  for (Fault fault : {Fault::kSoftmaxWithoutMax, Fault::kNaiveFloat32RmsNorm}) {
    const std::string name = FaultName(fault);
    const Outcome ordinary = RunChunking(ScalarVsImpl(fault), "DemandingMutants/ordinary/" + name);
    EXPECT_FALSE(ordinary.failed) << name << " fails on ordinary models, so it proves nothing "
                                  << "about demanding ones: " << ordinary.description;
    const Outcome demanding =
        RunChunking(OnDemandingModels(ScalarVsImpl(fault)), "DemandingMutants/" + name);
    EXPECT_TRUE(demanding.failed) << name << " not caught on demanding models";
    std::cout << fmt::format(
        "{:<24} ordinary models: {} in {} cases; demanding models: {} at case "
        "{}\n  {}\n",
        name, ordinary.failed ? "CAUGHT" : "passes", ordinary.cases,
        demanding.failed ? "caught" : "MISSED", demanding.cases, demanding.description);
  }
  // The unmutated scalar model passes on demanding models: the faults are what fails.
  const Outcome correct =
      RunChunking(OnDemandingModels(ScalarVsImpl(Fault::kNone)), "DemandingMutants/none");
  EXPECT_FALSE(correct.failed) << correct.description;
}

}  // namespace
}  // namespace kvdiff::props
