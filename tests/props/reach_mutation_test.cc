// Proof of reach: faults that hide past some size (a decode that drops keys past P, a mask wrong on
// the second query tile, a RoPE table that wraps, a cache re-allocation that loses rows), built
// into the test's scalar model (scalar_llama.h), must be caught by the DEFAULT `kvdiff check`
// campaign: the cases of seed 0, generated with the default options from the boundaries the
// backends declare and the powers of two, run in order against impl until one fails. The test
// prints which case caught each mutant, and the failing case with every step that is not needed
// for the failure removed (a one-pass shrink).
//
// Nothing here knows the mutants' sizes: a mutant at 200, which nobody declares and which is not a
// power of two, must be caught by the long tail all the same.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "harness/backend/registry.h"
#include "harness/campaign/campaign.h"
#include "harness/campaign/demanding_part.h"
#include "harness/report/run_report.h"
#include "tests/harness/harness_test_util.h"
#include "tests/props/scalar_llama.h"
#include "tests/test_support.h"

namespace kvdiff::props {
namespace {

constexpr int64_t kDefaultCampaignCases = 200;  // what the README's `ci/demo` runs

struct Caught {
  int64_t case_index = -1;  // -1: not caught by the campaign
  harness::Scenario scenario;
  std::string failure;
};

class ReachTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = testing::TinyModel();
    weights_ = harness::LoadModelFor(model_);
    impl_ = harness::MakeBackend("impl", weights_, 1);
  }

  bool Fails(harness::Scenario sc, const std::vector<const harness::Backend*>& backends,
             std::string* failure = nullptr) const {
    try {
      harness::ValidateScenario(sc, weights_->config);
    } catch (const std::exception&) {
      return false;  // a shrink step that made the scenario invalid
    }
    const harness::RunReport run = harness::RunScenario(sc, backends, {});
    if (failure && run.first_divergence) {
      const harness::Divergence& d = *run.first_divergence;
      *failure = fmt::format("step {} {}: {} vs {} at position {}: max |a-b| {}", d.step, d.params,
                             d.a, d.b, d.row.position, harness::FormatDiff(d.row.cmp.max_abs_diff));
    } else if (failure && run.first_error) {
      *failure = run.first_error->message;
    }
    return !run.Passed();
  }

  // The default campaign's cases, in order, until one fails; then that case, shrunk.
  // with_impl: the mutant beside impl (cross comparisons), else alone against its own oracle.
  Caught RunDefaultCampaign(const harness::Backend& mutant, int64_t cases = kDefaultCampaignCases,
                            bool with_impl = true) const {
    std::vector<const harness::Backend*> backends = {&mutant};
    if (with_impl) backends.push_back(impl_.get());
    harness::GenerationOptions generation;
    const int64_t context = harness::CampaignMaxLength(weights_->config, generation.max_length);
    generation.boundaries = harness::CampaignBoundaries(backends, context);
    Caught caught;
    for (int64_t k = 0; k < cases; ++k) {
      harness::Scenario sc = harness::GenerateCase(weights_->config, model_, 0, k, generation);
      sc.backends.clear();
      for (const harness::Backend* b : backends) sc.backends.push_back(b->Name());
      if (!Fails(sc, backends)) continue;
      caught.case_index = k;
      // One pass of step removal: what is left is needed for the failure.
      for (size_t i = sc.steps.size(); i-- > 1;) {
        harness::Scenario smaller = sc;
        smaller.steps.erase(smaller.steps.begin() + static_cast<std::ptrdiff_t>(i));
        if (Fails(smaller, backends)) sc = smaller;
      }
      Fails(sc, backends, &caught.failure);
      caught.scenario = sc;
      return caught;
    }
    return caught;
  }

  harness::ModelSpec model_;
  std::shared_ptr<const format::ModelWeights> weights_;
  std::unique_ptr<harness::Backend> impl_;
};

std::string StepsText(const harness::Scenario& sc) {
  std::string out;
  for (const harness::Step& s : sc.steps)
    out += fmt::format("{}{} {}", out.empty() ? "" : "; ", OpName(s.op), s.ParamString());
  return out;
}

struct ReachMutant {
  Fault fault;
  int64_t at;  // 0: the fault's default
};

TEST_F(ReachTest, EveryReachMutantIsCaughtByTheDefaultCampaign) {
  const std::vector<ReachMutant> mutants = {{Fault::kDecodeDropsKeysPastP, 0},
                                            {Fault::kMaskSecondTile, 0},
                                            {Fault::kRopeWrapsAtP, 0},
                                            {Fault::kReallocLosesRows, 0},
                                            {Fault::kDecodeDropsKeysPastP, 200}};
  std::cout << fmt::format("{:<28} {:>5} {:>6}  {}\n", "mutant", "at", "case", "shrunk failure");
  for (const ReachMutant& m : mutants) {
    const auto mutant = MakeScalarBackend(weights_, m.fault, m.at);
    const Caught caught = RunDefaultCampaign(*mutant);
    const std::string at = m.at > 0 ? std::to_string(m.at) : "dflt";
    if (caught.case_index < 0) {
      ADD_FAILURE() << FaultName(m.fault) << " at " << at << ": not caught by the "
                    << kDefaultCampaignCases << " cases of the default campaign";
      continue;
    }
    std::cout << fmt::format("{:<28} {:>5} {:>6}  {}\n    steps: {}\n", FaultName(m.fault), at,
                             caught.case_index, caught.failure, StepsText(caught.scenario));
    EXPECT_FALSE(caught.failure.empty());
  }
  std::cout.flush();
}

// The faults of serving engines' batched calls (scalar_llama.h's kBatch*: a mask broadcast from
// item 0, one position vector for all items, output rows mis-mapped after a micro-batch split, a
// cell of another sequence visible) must be caught by the default campaign's batch steps, beside
// impl, each with its shrunk failing case printed; and the same model without a fault passes
// those cases (so the batch steps, not the model, are what fails).
TEST_F(ReachTest, EveryBatchMutantIsCaughtByTheDefaultCampaign) {
  const std::vector<Fault> mutants = {Fault::kBatchMaskOfItemZero, Fault::kBatchSharedPositions,
                                      Fault::kBatchRowsAfterSplit, Fault::kBatchSeesOtherSequence};
  std::cout << fmt::format("{:<28} {:>6}  {}\n", "mutant", "case", "shrunk failure");
  for (Fault fault : mutants) {
    const auto mutant = MakeScalarBackend(weights_, fault);
    const Caught caught = RunDefaultCampaign(*mutant);
    if (caught.case_index < 0) {
      ADD_FAILURE() << FaultName(fault) << ": not caught by the " << kDefaultCampaignCases
                    << " cases of the default campaign";
      continue;
    }
    std::cout << fmt::format("{:<28} {:>6}  {}\n    steps: {}\n", FaultName(fault),
                             caught.case_index, caught.failure, StepsText(caught.scenario));
    EXPECT_FALSE(caught.failure.empty());
    const auto has_batch = [](const harness::Scenario& sc) {
      for (const harness::Step& s : sc.steps)
        if (s.op == harness::Op::kBatch) return true;
      return false;
    };
    EXPECT_TRUE(has_batch(caught.scenario)) << FaultName(fault) << ": shrunk to no batch step";
  }
  const auto healthy = MakeScalarBackend(weights_, Fault::kNone);
  EXPECT_LT(RunDefaultCampaign(*healthy, 60).case_index, 0)
      << "the scalar model without a fault fails a case of the default campaign";
  std::cout.flush();
}

// Faults right only for O(1) numbers (a softmax without the row max, a float32 sum of squares in
// RMSNorm) through the DEFAULT `kvdiff check` campaign as RunCampaign runs it: the ordinary cases
// with the mutant beside impl, and the demanding part (harness/campaign/demanding_part.h, its
// default fraction and relative gate) with the mutant rebuilt over the demanding variant of the
// model, beside impl and ref64 (when built). The ordinary cases must all pass (the fault is
// invisible there) and the demanding part must fail.
TEST_F(ReachTest, NumericFaultsAreCaughtByTheDefaultCampaignsDemandingPartOnly) {
  harness::DemandingPart part;
  part.model = *harness::DemandingVariant(model_);
  auto demanding_weights = harness::LoadModelFor(part.model);
  auto demanding_impl = harness::MakeBackend("impl", demanding_weights, 1);
  std::unique_ptr<harness::Backend> demanding_ref64;
  if (harness::BackendRegistry::Global().Has("ref64"))
    demanding_ref64 = harness::MakeBackend("ref64", demanding_weights, 1);
  for (Fault fault : {Fault::kSoftmaxWithoutMax, Fault::kNaiveFloat32RmsNorm}) {
    const auto mutant = MakeScalarBackend(weights_, fault);
    const auto demanding_mutant = MakeScalarBackend(demanding_weights, fault);
    part.backends = {mutant->Name(), "impl"};
    part.jobs = {{demanding_mutant.get(), demanding_impl.get()}};
    if (demanding_ref64) {
      part.backends.push_back("ref64");
      part.jobs[0].push_back(demanding_ref64.get());
    }
    testing::TempDir out;
    harness::CampaignOptions options;
    options.cases = kDefaultCampaignCases;
    options.out_dir = out.path();
    options.shrink_cases = 0;  // what is asserted is the catch, not the smallest reproduction
    options.demanding = part;
    const harness::CampaignReport report =
        harness::RunCampaign(model_, {mutant.get(), impl_.get()}, options);
    int64_t first = -1, ordinary_failures = 0;
    std::string failure;
    for (const harness::CaseResult& r : report.results) {
      if (r.passed) continue;
      if (!r.demanding) ++ordinary_failures;
      if (first < 0) {
        first = r.index;
        failure = r.failure;
      }
    }
    EXPECT_EQ(ordinary_failures, 0) << FaultName(fault) << " fails ordinary cases: " << failure;
    EXPECT_GT(report.demanding.failures, 0) << FaultName(fault) << " not caught";
    std::cout << fmt::format(
        "{:<28} demanding part: {} of {} demanding cases failed (of {}); "
        "first: case {}: {}\n",
        FaultName(fault), report.demanding.failures, report.demanding.cases, report.results.size(),
        first, failure);
  }
}

// The mutant at 200 must be a real test of the long tail: 200 is neither declared by a backend
// of the campaign nor a power of two, so no generator aimed at it.
TEST_F(ReachTest, TwoHundredIsNoBoundaryOfTheCampaign) {
  const auto mutant = MakeScalarBackend(weights_, Fault::kDecodeDropsKeysPastP, 200);
  const auto bounds = harness::CampaignBoundaries({mutant.get(), impl_.get()},
                                                  weights_->config.max_position_embeddings);
  for (const harness::Boundary& b : bounds) {
    EXPECT_NE(b.size, 200);
    EXPECT_NE(b.size, 199);
    EXPECT_NE(b.size, 201);
  }
}

// The unmutated scalar model passes the same cases: the campaign catches the faults, not a
// disagreement of the scalar model with impl (the first 50 cases: every mutant above is caught by
// one of them, long ones among them).
TEST_F(ReachTest, TheScalarModelPassesTheDefaultCampaign) {
  const auto scalar = MakeScalarBackend(weights_);
  EXPECT_LT(RunDefaultCampaign(*scalar, 50).case_index, 0);
}

}  // namespace
}  // namespace kvdiff::props
