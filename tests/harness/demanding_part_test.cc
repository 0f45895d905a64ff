// The campaign's demanding part (harness/campaign/demanding_part.h): which cases, which model,
// which backends, and what the campaign report says about them.
#include "harness/campaign/demanding_part.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "format/error.h"
#include "harness/backend/registry.h"
#include "harness/campaign/campaign.h"
#include "tests/harness/harness_test_util.h"
#include "tests/test_support.h"

namespace kvdiff::harness {
namespace {

using ::testing::HasSubstr;

TEST(Demanding, CasesAreAFunctionOfSeedIndexAndFraction) {
  int64_t demanding = 0;
  for (int64_t k = 0; k < 2000; ++k) {
    const bool d = IsDemandingCase(5, k, 0.1);
    EXPECT_EQ(d, IsDemandingCase(5, k, 0.1));
    if (d) {
      EXPECT_TRUE(IsDemandingCase(5, k, 0.5)) << "a larger fraction keeps the case";
    }
    demanding += d ? 1 : 0;
  }
  EXPECT_GT(demanding, 150);
  EXPECT_LT(demanding, 250);
  EXPECT_FALSE(IsDemandingCase(5, 3, 0.0));
  EXPECT_TRUE(IsDemandingCase(5, 3, 1.0));
  EXPECT_THROW(IsDemandingCase(5, 3, 1.5), InputError);
  EXPECT_THROW(ValidateDemandingOptions({0.1, 1.0}), InputError);
  EXPECT_THROW(ValidateDemandingOptions({-0.1, 1e-3}), InputError);
}

TEST(Demanding, TheVariantIsThePresetWithTheDemandingScale) {
  const ModelSpec tiny = testing::TinyModel();
  const auto v = DemandingVariant(tiny);
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->Describe(), "preset tiny, seed 7, scale demanding");
  EXPECT_FALSE(DemandingVariant(*v).has_value()) << "already scaled";
  ModelSpec dir;
  dir.path = "/some/model";
  EXPECT_FALSE(DemandingVariant(dir).has_value()) << "trained weights have no draw to rescale";
}

TEST(Demanding, BackendsLeaveOutWhatOverflowsAndEndWithTheArbiter) {
  if (!BackendRegistry::Global().Has("ref64")) GTEST_SKIP() << "needs LibTorch (ref64)";
  const ModelSpec model = testing::TinyModel();
  auto weights = LoadModelFor(model);
  auto impl = MakeBackend("impl", weights, 1);
  auto ref = MakeBackend("ref", weights, 1);
  auto ref64 = MakeBackend("ref64", weights, 1);
  std::vector<std::string> notes;
  EXPECT_EQ(DemandingBackends({impl.get(), ref.get()}, &notes),
            (std::vector<std::string>{"impl", "ref64"}));
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_THAT(notes[0], HasSubstr("demanding cases leave out ref: transformers' LlamaRMSNorm"));
  notes.clear();
  EXPECT_EQ(DemandingBackends({ref64.get(), impl.get()}, &notes),
            (std::vector<std::string>{"impl", "ref64"}));
  EXPECT_TRUE(notes.empty());
}

// A campaign with a demanding part: the report counts its cases apart, with their worst relative
// difference, and a failing demanding case's file replays on the demanding model.
TEST(Demanding, TheCampaignReportsItsDemandingCases) {
  if (!BackendRegistry::Global().Has("ref64")) GTEST_SKIP() << "needs LibTorch (ref64)";
  const ModelSpec model = testing::TinyModel();
  auto weights = LoadModelFor(model);
  auto impl = MakeBackend("impl", weights, 1);
  DemandingPart part;
  part.options = {0.5, kDefaultDemandingRtol};
  part.model = *DemandingVariant(model);
  part.backends = {"impl", "ref64"};
  auto dweights = LoadModelFor(part.model);
  auto dimpl = MakeBackend("impl", dweights, 1);
  auto dref64 = MakeBackend("ref64", dweights, 1);
  part.jobs = {{dimpl.get(), dref64.get()}};
  testing::TempDir out;
  CampaignOptions options;
  options.cases = 12;
  options.out_dir = out.path();
  options.demanding = part;
  CampaignReport report = RunCampaign(model, {impl.get()}, options);
  int64_t expected = 0;
  for (int64_t k = 0; k < 12; ++k) expected += IsDemandingCase(0, k, 0.5) ? 1 : 0;
  ASSERT_GT(expected, 0);
  EXPECT_EQ(report.demanding.cases, expected);
  EXPECT_TRUE(report.Passed()) << report.Summary();
  EXPECT_GT(report.demanding.worst_relative_diff, 0);
  EXPECT_LE(report.demanding.worst_relative_diff, kDefaultDemandingRtol);
  EXPECT_THAT(report.Summary(), HasSubstr("demanding part: " + std::to_string(expected) +
                                          " cases on preset tiny, seed 7, scale demanding"));
  const nlohmann::json j = report.ToJson();
  EXPECT_EQ(j.at("demanding").at("cases"), expected);
  for (const auto& r : j.at("results")) {
    EXPECT_EQ(r.contains("demanding"), IsDemandingCase(0, r.at("case"), 0.5));
  }
  // An absolute gate on the same cases fails them: the logits are in the thousands.
  options.demanding.options.rtol = 0;
  report = RunCampaign(model, {impl.get()}, options);
  EXPECT_EQ(report.demanding.failures, expected) << report.Summary();
  std::string failing_file;
  for (const CaseResult& r : report.results)
    if (!r.passed && failing_file.empty()) failing_file = r.scenario_file;
  const Scenario replay = LoadScenario(failing_file);
  EXPECT_EQ(replay.model.Describe(), "preset tiny, seed 7, scale demanding");
  EXPECT_EQ(replay.backends, (std::vector<std::string>{"impl", "ref64"}));
}

}  // namespace
}  // namespace kvdiff::harness
