// Tolerance profiles: the gate an engine that attends in lower precision is held to. The default
// gate (kDefaultTolerance, max |a-b| <= 1e-4 on logits) is for engines that keep K/V in float32;
// an engine whose cache (or attention) rounds K/V to a narrower type cannot meet it, and is held
// instead to a bound measured against ref64 across models and lengths, written down with its
// numbers (docs/engines.md, "Tolerance profiles"). A profile is chosen by what the backend says it
// attends in (BackendInfo::cache_dtype), never by its name, and every report prints it. A
// --tolerance flag wins over any profile.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "harness/backend/backend.h"

namespace kvdiff::harness {

struct ToleranceProfile {
  std::string cache_dtype;  // "f16": what the backend attends in
  double max_abs = 0;       // the gate on max |a-b| of logits
  std::string basis;        // one line: what the bound was derived from
};

// The measured profile for a cache dtype; nullptr for float32 ("f32", "") and for dtypes without
// a measured profile (those are held to the default gate, and fail it honestly).
const ToleranceProfile* ProfileFor(const std::string& cache_dtype);

// The rope-f32 profile. An engine that computes its RoPE angles in float32 (transformers, and so
// ref; llama.cpp) rounds pos · inv_freq to float: at position p the angle is off by up to about
// p · 2^-23 radians, so its logits drift from the exact ones (impl, ref64: angles in double,
// rounded once) linearly with the position — by ~3e-4 at position 400 on the tiny preset, while
// impl stays within 3e-5 of ref64 at every position. A comparison between two backends where
// either computes its angles in float32 is held to tolerance + per_position · position (Gate::
// Across, gate.h); a backend against its own uncached forward (same angles on both paths) keeps
// the plain gate.
struct RopeAngleProfile {
  double per_position = 0;  // added to the tolerance per position of the compared row
  std::string basis;        // one line: what the allowance was derived from
};
const RopeAngleProfile& RopeF32Profile();

// The per-position allowance of a run over `backends`, resolved once: 0 when --tolerance is given
// (a flag wins over any profile) or no backend declares float32 angles; else the rope-f32
// profile's, with `note` (when not null) set to the line every report prints, else cleared.
double ResolveRopeAllowance(const std::optional<double>& flag,
                            const std::vector<const Backend*>& backends, std::string* note);

// The tolerance of a run over `backends`, resolved once: the --tolerance flag; else the file's
// (scenario or golden) or kDefaultTolerance, raised to the loosest profile among the backends.
// `note` (when not null) is set to the line every report prints when a profile applied, e.g.
// "tolerance profile f16 (max |a-b| <= 1.0e-01) for plugin:...: measured ...", else cleared.
double ResolveRunTolerance(const std::optional<double>& flag, std::optional<double> from_file,
                           const std::vector<const Backend*>& backends, std::string* note);

}  // namespace kvdiff::harness
