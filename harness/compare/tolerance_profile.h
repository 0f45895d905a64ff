// Tolerance profiles: the gate an engine that attends in lower precision is held to. The default
// gate (kDefaultTolerance, max |a-b| <= 1e-4 on logits) is for engines that keep K/V in float32;
// an engine whose cache (or attention) rounds K/V to a narrower type cannot meet it, and is held
// instead to a bound measured against ref64 across models and lengths, written down with its
// numbers (docs/tolerance-profiles.md). A profile is chosen by what the backend says it
// attends in (BackendInfo::cache_dtype) or computes in (BackendInfo::compute_dtype), never by its
// name, and every report prints it. A
// --tolerance flag wins over any profile.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "harness/backend/backend.h"

namespace kvdiff::harness {

// A quantized cache (q8_0, q4_0) rounds K/V to 8 or 4 bits per value, and what that does to the
// logits depends on which path is compared:
//   - against another backend (Gate::Across), the whole rounding shows: max |a-b| grows with the
//     logits' spread (random-weight logits span tens of units), so the profile also gates each
//     row's next-token distribution, KL(oracle || row) <= kl_max, the figure llama.cpp's
//     perplexity tool reports for quantizations;
//   - against the engine's own uncached forward (Gate::Own), both paths read the same quantized
//     cache and differ only by kernel order (chunk sizes), so own_max_abs stays small, and a cache
//     bug (a stale or missing position) moves that path by whole units however coarse the type.
struct ToleranceProfile {
  // What selects it: a cache dtype ("f16", "q8_0", "q4_0": what the backend attends in), or a
  // compute dtype ("bf16": what its matrix products round their inputs to).
  std::string dtype;
  bool compute = false;    // dtype is a compute dtype (BackendInfo::compute_dtype)
  double max_abs = 0;      // the gate on max |a-b| of logits
  double kl_max = 0;       // the gate on each row's KL divergence, in nats; 0: none
  double own_max_abs = 0;  // the gate of the engine against its own forward; 0: max_abs
  std::string basis;       // one line: what the bounds were derived from
};

// The measured profile a backend is held to: its cache dtype's or its compute dtype's, the looser
// when both have one; nullptr for float32 ("f32", "") and for dtypes without a measured profile
// (those are held to the default gate, and fail it honestly).
const ToleranceProfile* ProfileFor(const BackendInfo& info);

// "q8_0", "compute bf16": how reports name a profile.
std::string ProfileName(const ToleranceProfile& profile);

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
// `note` (when not null) is set to the lines every report prints, one per profiled backend, e.g.
// "tolerance profile f16 (max |a-b| <= 1.0e-01) for plugin:...: measured ...", else cleared.
double ResolveRunTolerance(const std::optional<double>& flag, std::optional<double> from_file,
                           const std::vector<const Backend*>& backends, std::string* note);

// The KL gate of a run over `backends` (Tolerance::kl_max): 0 when --tolerance is given (a flag
// wins over any profile) or no backend's profile has one; else the loosest among them.
double ResolveKlGate(const std::optional<double>& flag,
                     const std::vector<const Backend*>& backends);

// The gate of a backend's rows against its own uncached forward (Gate::own_abs): 0 (the run's
// tolerance) when --tolerance is given or no backend has a profile; else the loosest own bound
// among the profiled backends (a replay file's tolerance, the cross bound it was written with,
// does not loosen it).
double ResolveOwnGate(const std::optional<double>& flag,
                      const std::vector<const Backend*>& backends);

}  // namespace kvdiff::harness
