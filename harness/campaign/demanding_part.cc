#include "harness/campaign/demanding_part.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "format/error.h"
#include "format/prng.h"
#include "harness/backend/registry.h"

namespace kvdiff::harness {

std::optional<ModelSpec> DemandingVariant(const ModelSpec& model) {
  if ((!model.preset && !model.config) || !model.scale.IsDefault()) return std::nullopt;
  ModelSpec variant = model;
  variant.scale = format::RandomModelScale::Demanding();
  return variant;
}

std::vector<std::string> DemandingBackends(const std::vector<const Backend*>& campaign_backends,
                                           std::vector<std::string>* notes) {
  const std::string arbiter = BackendRegistry::Global().Arbiter();
  std::vector<std::string> out;
  for (const Backend* backend : campaign_backends) {
    const BackendInfo& info = backend->Info();
    const std::string& name = info.name;
    if (name == arbiter) continue;  // added once, last
    if (!info.overflows_on_demanding_models.empty()) {
      if (notes) {
        notes->push_back(fmt::format("demanding cases leave out {}: {}", name,
                                     info.overflows_on_demanding_models));
      }
      continue;
    }
    if (!info.cache_dtype.empty()) {
      // Its tolerance profile was measured on ordinary models only. Measured: llama.cpp with an
      // f16 cache returned all-zero logits on demanding tiny (with an f32 cache it holds the gate).
      if (notes) {
        notes->push_back(fmt::format(
            "demanding cases leave out {}: it attends in {}, and its tolerance profile is "
            "measured on ordinary models only",
            name, info.cache_dtype));
      }
      continue;
    }
    out.push_back(name);
  }
  out.push_back(arbiter);
  return out;
}

bool IsDemandingCase(uint64_t seed, int64_t k, double fraction) {
  KVDIFF_CHECK(fraction >= 0 && fraction <= 1,
               "--demanding-fraction: expected a fraction in [0, 1], got {}", fraction);
  if (fraction == 0) return false;
  // A stream of its own (named, like a tensor's), so the case's steps do not depend on it.
  format::Xoshiro256 rng = format::Xoshiro256::ForStream(seed, fmt::format("demanding case {}", k));
  return static_cast<double>(rng.Next() >> 11) * 0x1.0p-53 < fraction;
}

void ValidateDemandingOptions(const DemandingOptions& options) {
  KVDIFF_CHECK(options.fraction >= 0 && options.fraction <= 1,
               "--demanding-fraction: expected a fraction in [0, 1], got {}", options.fraction);
  KVDIFF_CHECK(std::isfinite(options.rtol) && options.rtol >= 0 && options.rtol < 1,
               "--demanding-rtol: expected a number >= 0 and < 1 (a fraction of the row's max "
               "|logit|), got {}",
               options.rtol);
}

}  // namespace kvdiff::harness
