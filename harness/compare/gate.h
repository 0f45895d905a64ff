// The gate a run holds its rows to, resolved once and carried whole: by the scenario, the
// campaign's and conform's options, conform's scripts and the run report, instead of a tolerance
// here and an allowance there.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "harness/backend/backend.h"
#include "harness/compare/compare.h"

namespace kvdiff::harness {

struct Gate {
  // max |a-b| of a row (--tolerance, the scenario file's, or a tolerance profile's)
  double abs = kDefaultTolerance;
  // also within when max |a-b| <= rel * max |logit| of the row; 0: the absolute gate alone (the
  // campaign's demanding cases set it; Tolerance)
  double rel = 0;
  // the rope-f32 profile's allowance (tolerance_profile.h): added per position to a row compared
  // between two backends, either of which computes its RoPE angles in float32
  double rope_f32_per_position = 0;
  // the tolerance profile's gate on each row's KL divergence (Tolerance::kl_max); 0: none
  double kl_max = 0;
  // the tolerance profile's gate of a backend against its own uncached forward, where a quantized
  // cache rounds alike on both paths (tolerance_profile.h); 0: abs
  double own_abs = 0;

  // A backend's row against its own uncached forward: the same angles and the same cache rounding
  // on both paths, so no KL gate (own_abs already holds it tighter than the cross bounds).
  Tolerance Own() const { return {own_abs > 0 ? own_abs : abs, rel}; }
  // A row at `position` compared between backends a and b: abs, plus the rope-f32 allowance
  // times the position when either computes its angles in float32.
  Tolerance Across(const BackendInfo& a, const BackendInfo& b, int64_t position) const;
};

// The gate of a run over `backends`, resolved once: abs is the --tolerance flag, else from_file's
// abs raised to the loosest tolerance profile among the backends (ResolveRunTolerance), kl_max
// the loosest of their KL gates (ResolveKlGate), own_abs the loosest of their bounds against
// their own forward (ResolveOwnGate); rel is from_file's; the rope-f32 allowance is
// ResolveRopeAllowance's. The lines every report prints (the tolerance profile's, then the rope-f32
// profile's, when they apply) are appended to *notes.
Gate ResolveGate(const std::optional<double>& flag, const Gate& from_file,
                 const std::vector<const Backend*>& backends, std::vector<std::string>* notes);

}  // namespace kvdiff::harness
