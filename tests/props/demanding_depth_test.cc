// The demanding part on deep models. With the attention scores scaled in every layer, a deep random
// model was chaotic in float32: every demanding case of smollm2-135m (30 layers) failed on correct
// code, impl's cached rows against its own ForwardFull. The scores are now scaled in the first
// format::kDemandingScoreLayers layers only (format/model_files.h), and these tests pin it:
//  * the default campaign (its demanding share and gate) on a 30-layer shape passes on impl, with
//    ref64 arbitrating the demanding cases;
//  * it still catches the two faults the part exists for (a softmax without the max, a float32
//    RMSNorm sum), each only in its demanding cases, there and on the tiny preset;
//  * on each preset's demanding variant, both faults break a short prompt's rows while the correct
//    scalar model holds the gate: the scores overflow float32's exp, the hidden states its sum of
//    squares, at every depth the presets have.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "format/model_files.h"
#include "harness/backend/registry.h"
#include "harness/campaign/campaign.h"
#include "harness/campaign/demanding_part.h"
#include "tests/harness/harness_test_util.h"
#include "tests/props/properties.h"
#include "tests/props/scalar_llama.h"
#include "tests/test_support.h"

namespace kvdiff::props {
namespace {

harness::ModelSpec ThirtyLayers() {
  format::LlamaConfig config = format::PresetConfig("tiny");
  config.num_hidden_layers = 30;
  harness::ModelSpec model;
  model.config = config;
  model.seed = 7;
  return model;
}

// `kvdiff check --cases N` on `model` with `system` as the backend under test: the default
// demanding share and gate, ref64 beside `system` in the demanding cases (as the CLI plans it).
harness::CampaignReport DefaultCampaign(const harness::ModelSpec& model,
                                        const BackendFactory& system, int64_t cases,
                                        const std::filesystem::path& out_dir) {
  const auto system_backend = system(harness::LoadModelFor(model));
  harness::DemandingPart part;
  part.model = *harness::DemandingVariant(model);
  const auto weights = harness::LoadModelFor(part.model);
  const auto demanding_system = system(weights);
  const auto arbiter = harness::MakeBackend("ref64", weights, 1);
  part.backends = {demanding_system->Name(), arbiter->Name()};
  part.jobs = {{demanding_system.get(), arbiter.get()}};
  harness::CampaignOptions options;
  options.cases = cases;
  options.out_dir = out_dir;
  options.demanding = part;
  return harness::RunCampaign(model, {system_backend.get()}, options);
}

TEST(DemandingDepth, TheDefaultCampaignOnThirtyLayersPasses) {
  if (!harness::BackendRegistry::Global().Has("ref64")) GTEST_SKIP() << "needs LibTorch (ref64)";
  testing::TempDir out;
  const harness::CampaignReport report =
      DefaultCampaign(ThirtyLayers(), ImplFactory(), 80, out.path());
  EXPECT_GE(report.demanding.cases, 5) << report.Summary();
  EXPECT_TRUE(report.Passed()) << report.Summary();
  std::cout << report.demanding.Text();
}

// On the tiny preset (2 layers) and on the 30-layer shape.
TEST(DemandingDepth, TheDefaultCampaignCatchesBothFaultsShallowAndDeep) {
  if (!harness::BackendRegistry::Global().Has("ref64")) GTEST_SKIP() << "needs LibTorch (ref64)";
  const harness::ModelSpec tiny = testing::TinyModel();
  for (const harness::ModelSpec& model : {tiny, ThirtyLayers()}) {
    for (Fault fault : {Fault::kSoftmaxWithoutMax, Fault::kNaiveFloat32RmsNorm}) {
      SCOPED_TRACE(model.Describe() + ": " + FaultName(fault));
      testing::TempDir out;
      const harness::CampaignReport report = DefaultCampaign(
          model, [fault](auto w) { return MakeScalarBackend(w, fault); }, 40, out.path());
      ASSERT_GE(report.demanding.cases, 2) << report.Summary();
      EXPECT_EQ(report.demanding.failures, report.demanding.cases) << report.Summary();
      EXPECT_EQ(report.Failures(), report.demanding.failures)
          << "the fault fails ordinary cases too, so it proves nothing about demanding ones:\n"
          << report.Summary();
    }
  }
}

// Both faults break the rows of an 8-token prompt on every preset's demanding variant (smollm2-135m
// has 30 layers); the correct scalar model holds the demanding gate against impl there.
TEST(DemandingDepth, EachPresetsDemandingVariantExposesBothFaults) {
  for (const std::string& preset : format::PresetNames()) {
    SCOPED_TRACE(preset);
    const auto weights = std::make_shared<const format::ModelWeights>(format::MakeRandomModel(
        format::PresetConfig(preset), 7, format::RandomModelScale::Demanding()));
    const Tokens prompt = {1, 17, 42, 7, 99, 3, 150, 12};
    const Logits expected = harness::MakeBackend("impl", weights, 1)->ForwardFull(prompt);
    const harness::Tolerance gate(kTolerance, kDemandingRtol);
    const auto rows_within = [&](const Logits& got) {
      int64_t within = 0;
      for (int64_t r = 0; r < got.rows(); ++r) {
        within += harness::CompareRows(got.row(r).data(), expected.row(r).data(), got.cols(), gate)
                          .within_tolerance
                      ? 1
                      : 0;
      }
      return within;
    };
    const auto rows = static_cast<int64_t>(prompt.size());
    EXPECT_EQ(rows_within(MakeScalarBackend(weights)->ForwardFull(prompt)), rows);
    for (Fault fault : {Fault::kSoftmaxWithoutMax, Fault::kNaiveFloat32RmsNorm}) {
      EXPECT_LT(rows_within(MakeScalarBackend(weights, fault)->ForwardFull(prompt)), rows)
          << FaultName(fault) << " not exposed on the demanding " << preset;
    }
  }
}

}  // namespace
}  // namespace kvdiff::props
