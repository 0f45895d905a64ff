// Properties 1-4 and 6 on the impl backend (harness::MakeBackend("impl")): random small models,
// and the fixed "tiny" preset.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "tests/props/prop_test_support.h"
#include "tests/props/properties.h"

namespace kvdiff::props {
namespace {

Target Impl() { return Target{ImplFactory(), nullptr}; }
Target ImplTiny() {
  Target target = Impl();
  target.models = GenPresetModel("tiny");
  target.max_positions = 64;  // of its 512
  return target;
}

RC_GTEST_PROP(ImplProps, ChunkingInvariance, ()) { ChunkingProperty(Impl()); }
RC_GTEST_PROP(ImplProps, DecodeMatchesUncachedGreedy, ()) { DecodeProperty(Impl()); }
RC_GTEST_PROP(ImplProps, ResetOrNewSessionLeaksNothing, ()) { ReuseProperty(Impl()); }
RC_GTEST_PROP(ImplProps, OneTokenPromptAfterResetLeaksNothing, ()) {
  ReuseProperty(Impl(), ReuseOptions{1, 1});
}
RC_GTEST_PROP(ImplProps, TruncateThenAppendEqualsScratch, ()) { TruncateProperty(Impl()); }
RC_GTEST_PROP(ImplProps, ForkEvolvesIndependently, ()) { ForkProperty(Impl()); }
KVDIFF_PROP(ImplProps, StatefulConversations, 200) { StatefulProperty(Impl()); }

KVDIFF_PROP(ImplTinyProps, ChunkingInvariance, 30) { ChunkingProperty(ImplTiny()); }
KVDIFF_PROP(ImplTinyProps, DecodeMatchesUncachedGreedy, 30) { DecodeProperty(ImplTiny()); }
KVDIFF_PROP(ImplTinyProps, StatefulConversations, 30) { StatefulProperty(ImplTiny()); }

}  // namespace
}  // namespace kvdiff::props
