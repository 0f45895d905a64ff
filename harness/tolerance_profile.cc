#include "harness/tolerance_profile.h"

#include <fmt/format.h>

#include <algorithm>

#include "harness/compare.h"

namespace kvdiff::harness {
namespace {

// Measured with llama.cpp (kvdiff check --backends ref64,plugin:...?kv=f16 --tolerance 1, 100
// cases of up to 48 positions; and a 400-token chunked prefill with 100 decode steps): worst
// max |a-b| 2.3e-2..2.9e-2 on three tiny models, 4.6e-2 on stories260K (5.3e-2 at 500
// positions), 7.3e-3 on the smollm2-135m shape; flash attention (K/V cast to F16 even over an
// f32 cache) 2.8e-2 on tiny, 5.9e-2 on stories260K. The bound is ~1.7x the worst of those. A
// cache bug moves logits by whole units (a truncate that keeps the cache: 7.9, a fork without
// the parent's cache: 13), so the profile still catches what the default gate catches.
const ToleranceProfile kProfiles[] = {
    {"f16", 1e-1,
     "float16 K/V (f16 cache or flash attention) measured against ref64: worst 5.9e-02 over 4 "
     "models up to 500 positions"},
};

}  // namespace

const ToleranceProfile* ProfileFor(const std::string& cache_dtype) {
  for (const ToleranceProfile& p : kProfiles)
    if (p.cache_dtype == cache_dtype) return &p;
  return nullptr;
}

double ResolveRunTolerance(const std::optional<double>& flag, std::optional<double> from_file,
                           const std::vector<const Backend*>& backends, std::string* note) {
  if (note) note->clear();
  double tolerance = ResolveTolerance(flag, from_file);
  if (flag) return tolerance;
  for (const Backend* backend : backends) {
    const ToleranceProfile* profile = ProfileFor(backend->Info().cache_dtype);
    if (!profile || profile->max_abs <= tolerance) continue;
    tolerance = profile->max_abs;
    if (note) {
      *note = fmt::format("tolerance profile {} (max |a-b| <= {:.1e}) for {}: {}",
                          profile->cache_dtype, profile->max_abs, backend->Name(),
                          profile->basis);
    }
  }
  return tolerance;
}

}  // namespace kvdiff::harness
