// Properties 1-4, 6 and 7 on the LibTorch reference ("ref", float32), and property 5: impl and ref
// agree within 1e-4 on every scenario above (each one's sessions against the other's ForwardFull),
// and on ForwardFull itself. Built only with KVDIFF_WITH_TORCH.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "tests/props/prop_test_support.h"
#include "tests/props/properties.h"

namespace kvdiff::props {
namespace {

Target Ref() { return Target{RefFactory(), nullptr}; }
Target ImplVsRef() { return Target{ImplFactory(), RefFactory()}; }
Target RefVsImpl() { return Target{RefFactory(), ImplFactory()}; }

RC_GTEST_PROP(RefProps, ChunkingInvariance, ()) { ChunkingProperty(Ref()); }
RC_GTEST_PROP(RefProps, DecodeMatchesUncachedGreedy, ()) { DecodeProperty(Ref()); }
RC_GTEST_PROP(RefProps, ResetOrNewSessionLeaksNothing, ()) { ReuseProperty(Ref()); }
RC_GTEST_PROP(RefProps, OneTokenPromptAfterResetLeaksNothing, ()) {
  ReuseProperty(Ref(), ReuseOptions{1, 1});
}
RC_GTEST_PROP(RefProps, TruncateThenAppendEqualsScratch, ()) { TruncateProperty(Ref()); }
RC_GTEST_PROP(RefProps, ForkEvolvesIndependently, ()) { ForkProperty(Ref()); }
KVDIFF_PROP(RefProps, StatefulConversations, 30) { StatefulProperty(Ref()); }
RC_GTEST_PROP(RefProps, BatchEqualsItemsAlone, ()) { BatchEqualsAloneProperty(Ref()); }

RC_GTEST_PROP(ImplEqualsRef, ForwardFull, ()) {
  const ModelCase model = *GenSmallModel();
  const auto weights = model.MakeWeights();
  const Tokens prompt = *GenPrompt(model.config.vocab_size, model.Capacity());
  AssertRowsClose(ImplFactory()(weights)->ForwardFull(prompt), 0,
                  RefFactory()(weights)->ForwardFull(prompt), 0,
                  static_cast<int64_t>(prompt.size()), kTolerance, "impl vs ref ForwardFull");
}
RC_GTEST_PROP(ImplEqualsRef, Chunking, ()) {
  ChunkingProperty(ImplVsRef());
  ChunkingProperty(RefVsImpl());
}
RC_GTEST_PROP(ImplEqualsRef, Decode, ()) {
  DecodeProperty(ImplVsRef());
  DecodeProperty(RefVsImpl());
}
RC_GTEST_PROP(ImplEqualsRef, Reuse, ()) {
  ReuseProperty(ImplVsRef());
  ReuseProperty(RefVsImpl());
}
RC_GTEST_PROP(ImplEqualsRef, TruncateAndFork, ()) {
  TruncateProperty(ImplVsRef());
  ForkProperty(RefVsImpl());
}
KVDIFF_PROP(ImplEqualsRef, Stateful, 30) { StatefulProperty(ImplVsRef()); }

}  // namespace
}  // namespace kvdiff::props
