// The campaign's demanding part: a share of every `kvdiff check` campaign's cases runs on the
// demanding variant of the campaign's model (format::RandomModelScale::Demanding(): attention
// scores in the hundreds, hidden states whose float32 sum of squares overflows, logits in the
// thousands), with ref64 beside the backends under test and a gate relative to the logits' scale.
// Code that is right only for O(1) numbers (a softmax that does not subtract the row max, a naive
// float32 RMSNorm) passes every other case and fails these (docs/campaign-cases.md, "The demanding
// part").
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "harness/backend/backend.h"
#include "harness/scenario/scenario.h"

namespace kvdiff::harness {

// One case in 10: 20 of `kvdiff check --cases 200`. A demanding case costs what an ordinary one
// does (ref64 stands in for ref), so the share is a choice of emphasis, not of cost (measured on
// tiny: 2.9 s for 200 cases with the part, 3.2 s without, noise included).
inline constexpr double kDefaultDemandingFraction = 0.1;
// The demanding cases' gate: max |a-b| <= max(abs, rel * max |logit| of the row). Float32 rounding
// alone goes far: scores of std 100 turn the rounding of q.k (~1e-5) into changes of near-tied
// softmax weights, which the logit scale of 300 carries to the output; ref, float32 too, is as far
// off where it does not overflow (--scale scores=25,logits=300). Measured, impl against ref64 and
// against its own ForwardFull: over 28000 demanding cases of tiny (model seeds 7, 3, 11;
// --demanding-fraction 1) median 1.4e-5 of max |logit|, 99th percentile 2.7e-4, 3 cases above
// 1e-3, worst 2.3e-3; over 200000 cases of the properties' small shapes (tests/props,
// GenDemandingModel) worst 2.2e-3, none above 3e-3 (a CI run drew one at 2.4e-3). The first
// default, 1e-3 (set from 1800 cases, worst 3.4e-4), failed correct code about once in 10000 cases
// of tiny. 1e-2 leaves a margin of 4x; what the part is for is far above it: NaN or zeros from a
// float32 exp or sum of squares, and a stale key or a wrong position moves a row by a large part
// of the logits' spread (thousands: a relative 0.1-1).
inline constexpr double kDefaultDemandingRtol = 1e-2;

struct DemandingOptions {
  double fraction = kDefaultDemandingFraction;  // --demanding-fraction, in [0, 1]
  double rtol = kDefaultDemandingRtol;          // --demanding-rtol, in [0, 1)
};

// The backends one part of a campaign runs on: a set per job (a backend is used by one thread at a
// time), and what owns them (nothing when the caller does). The campaign runs its ordinary cases,
// then its demanding ones, and frees each part's backends when the part is done: the two models
// (the ordinary one, and its demanding variant with ref64's float64 copy) are never in memory at
// once, about 1.1 GB less at the peak on smollm2 (docs/performance.md).
struct PartBackends {
  std::vector<std::unique_ptr<Backend>> owned;
  std::vector<std::vector<const Backend*>> jobs;
};

// What the campaign runs its demanding cases on, resolved once by the caller (it builds backends).
struct DemandingPart {
  DemandingOptions options;
  ModelSpec model;                    // DemandingVariant of the campaign's model
  std::vector<std::string> backends;  // DemandingBackends: the names, ref64 last
  // Per campaign job, over `model`: given (the caller owns them), or built by `build` when the
  // demanding cases start, after the ordinary part's backends are freed.
  std::vector<std::vector<const Backend*>> jobs;
  std::function<PartBackends()> build;
  // Not empty: why the campaign has no demanding part (printed, and in --json); jobs is empty.
  std::string skipped;
  std::vector<std::string> notes;  // backends left out of the demanding cases, and why
  bool Active() const {
    return skipped.empty() && (!jobs.empty() || build) && options.fraction > 0;
  }
};

// The demanding variant of a campaign's model: its preset (or inline config) and seed with the
// demanding scale. nullopt for a model directory or a llama2.c checkpoint (trained weights have no
// random draw to rescale) and for a model already scaled (the campaign is then demanding
// throughout).
std::optional<ModelSpec> DemandingVariant(const ModelSpec& model);

// The backends of the demanding cases: the campaign's, except those that declare they reproduce
// an arithmetic that overflows there (BackendInfo::overflows_on_demanding_models; each left out
// with a line in *notes) and those that attend in a narrower type (BackendInfo::cache_dtype: their
// tolerance profile is measured on ordinary models only), then the registry's arbiter (ref64) once.
// InputError when the build has no float64 backend (the caller says the part is skipped instead).
// The campaign's backends are asked as built (a plugin declares what it attends in when opened).
std::vector<std::string> DemandingBackends(const std::vector<const Backend*>& campaign_backends,
                                           std::vector<std::string>* notes);

// Whether case k of the campaign seeded `seed` is demanding: a function of (seed, k) and the
// fraction alone, drawn apart from the case's own stream, so a case's steps are the same whether
// or not it is demanding. InputError naming --demanding-fraction outside [0, 1].
bool IsDemandingCase(uint64_t seed, int64_t k, double fraction);

// InputError naming the flag when an option is out of range.
void ValidateDemandingOptions(const DemandingOptions& options);

}  // namespace kvdiff::harness
