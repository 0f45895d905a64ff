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

// Counts the instances alive: the campaign must free the ordinary part's before it builds the
// demanding part's, so that the two models are never in memory at once.
class Counted : public Backend {
 public:
  Counted(std::unique_ptr<Backend> inner, int* alive) : inner_(std::move(inner)), alive_(alive) {
    ++*alive_;
  }
  ~Counted() override { --*alive_; }
  const BackendInfo& Info() const override { return inner_->Info(); }
  const format::LlamaConfig& config() const override { return inner_->config(); }
  Logits ForwardFull(const Tokens& tokens, ForwardTrace* trace) const override {
    return inner_->ForwardFull(tokens, trace);
  }
  std::unique_ptr<BackendSession> NewSession() const override { return inner_->NewSession(); }
  std::vector<Logits> AppendBatch(const std::vector<BatchItem>& items) const override {
    return inner_->AppendBatch(items);
  }

 private:
  std::unique_ptr<Backend> inner_;
  int* alive_;
};

TEST(Demanding, TheOrdinaryBackendsAreFreedBeforeTheDemandingOnesAreBuilt) {
  if (!BackendRegistry::Global().Has("ref64")) GTEST_SKIP() << "needs LibTorch (ref64)";
  const ModelSpec model = testing::TinyModel();
  const ModelSpec demanding_model = *DemandingVariant(model);
  int ordinary_alive = 0, demanding_builds = 0, alive_at_build = -1;
  auto ordinary = [&] {
    PartBackends part;
    for (int job = 0; job < 2; ++job) {
      part.owned.push_back(
          std::make_unique<Counted>(MakeBackend("impl", LoadModelFor(model), 1), &ordinary_alive));
      part.jobs.push_back({part.owned.back().get()});
    }
    return part;
  };
  testing::TempDir out;
  CampaignOptions options;
  options.cases = 16;
  options.out_dir = out.path();
  options.demanding.options = {0.3, kDefaultDemandingRtol};
  options.demanding.model = demanding_model;
  options.demanding.backends = {"impl", "ref64"};
  options.demanding.build = [&] {
    ++demanding_builds;
    alive_at_build = ordinary_alive;
    PartBackends part;
    auto weights = LoadModelFor(demanding_model);
    for (int job = 0; job < 2; ++job) {
      part.owned.push_back(MakeBackend("impl", weights, 1));
      part.owned.push_back(MakeBackend("ref64", weights, 1));
      part.jobs.push_back({part.owned[2 * job].get(), part.owned[2 * job + 1].get()});
    }
    return part;
  };
  const CampaignReport built = RunCampaignOnJobs(model, ordinary(), options);
  EXPECT_EQ(demanding_builds, 1);
  EXPECT_EQ(alive_at_build, 0) << "the ordinary backends were still alive";
  EXPECT_EQ(ordinary_alive, 0);
  ASSERT_GT(built.demanding.cases, 0);
  EXPECT_LT(built.demanding.cases, 16);
  // The same campaign on backends the caller keeps: the same cases, case for case.
  PartBackends kept = ordinary();
  PartBackends demanding_kept = options.demanding.build();
  options.demanding.build = nullptr;
  options.demanding.jobs = demanding_kept.jobs;
  const CampaignReport given = RunCampaignOnJobs(model, kept.jobs, options);
  EXPECT_EQ(built.ToJson().at("results"), given.ToJson().at("results"));
  EXPECT_EQ(built.rows_compared, given.rows_compared);
}

}  // namespace
}  // namespace kvdiff::harness
