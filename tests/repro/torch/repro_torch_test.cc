// reference-reuse: transformers' way, one DynamicCache reused for the second prompt, on the
// LibTorch reference. Silent, and departs from what a new DynamicCache gives; the first
// conversation is the impl's correct output token for token (the document: "ok 和 transformers
// 逐个相同").
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "harness/repro/repro.h"
#include "tests/repro/repro_test_util.h"
#include "tests/test_support.h"

namespace kvdiff::testing {
namespace {

using harness::Experiment;
using ::testing::HasSubstr;

void ExpectReferenceReuseAsDocumented(harness::Repro& repro) {
  const harness::ExperimentResult r = repro.Run(Experiment::kReferenceReuse);
  ASSERT_EQ(r.skipped, "");
  ASSERT_EQ(r.lines.size(), 2u);
  EXPECT_EQ(r.lines[0].generated, repro.Correct("ok")) << "ref's first conversation equals ok";
  EXPECT_EQ(r.lines[1].error, "") << "transformers raises nothing";
  EXPECT_EQ(r.lines[1].baseline, "fresh (ref)");
  EXPECT_GE(r.lines[1].departs_at, 1);
  EXPECT_TRUE(r.as_documented) << r.observed;
}

TEST(ReproTorch, ReferenceReuseIsSilentAndDepartsFromFreshOnTiny) {
  auto weights = TinyWeights();
  harness::Repro repro = harness::Repro::OnModel(
      weights, harness::MakeReproPrompts({}, weights->config, nullptr), "impl", {1});
  ExpectReferenceReuseAsDocumented(repro);
}

TEST(ReproTorch, ReferenceReuseIsSilentAndDepartsFromFreshOnStories) {
  KVDIFF_REQUIRE_SHARED_DATA(data);
  TempDir dir;
  ConvertStories(data, dir / "stories260K");
  auto weights =
      std::make_shared<const format::ModelWeights>(format::LoadModel(dir / "stories260K"));
  auto tokenizer = format::Tokenizer::LoadFromModelDir(dir / "stories260K");
  harness::Repro repro = harness::Repro::OnModel(
      weights, harness::MakeReproPrompts({}, weights->config, &*tokenizer), "impl", {1});
  ExpectReferenceReuseAsDocumented(repro);

  const auto r = RunKvdiff("run " KVDIFF_SOURCE_DIR
                           "/examples/repro/reference-reuse-stories.json --model stories260K "
                           "--threads 1",
                           dir.path());
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("first divergence: step 3 prefill(second,n=4): ref vs ref"));
}

}  // namespace
}  // namespace kvdiff::testing
