// `kvdiff check --shapes random`: the model of case k, a small random Llama drawn from (seed, k)
// alone with kvdiff's own PRNG (harness/campaign/case_rng.h), so a case has the same shape on every
// machine, shard and job. The shapes cover what a port gets wrong when it was only tried on one
// model: grouped-query ratios 1..8 (MHA, GQA, MQA), head_dim 8..128 (powers of two and odd
// multiples of two), a hidden size that is not heads x head_dim now and then, 1-3 layers, tied and
// untied heads, llama3 rope scaling or none, rope_theta, rms_norm_eps, odd vocabularies, and
// contexts from a few positions (a case reaches the end) to thousands. Every shape is small enough
// for a case to run in milliseconds. The property generators (tests/props/generators.h) draw from
// the same limits.
#pragma once

#include <cstdint>
#include <string>

#include "format/config.h"
#include "harness/scenario/scenario.h"
#include "harness/scenario/shape_params.h"  // ShapeParams, AttentionKind: a shape as text

namespace kvdiff::harness {

// The narrowest attention (num_attention_heads x head_dim) a random shape has. Narrower models
// are ill-conditioned in float32. Measured over 10000 generated cases against the f64 arbiter
// (ref64), 0.4% of 8-wide models drift > 3e-5 and some > 1e-4 in impl and ref alike (a 4-wide
// one: 2e-4), which would make the gate flaky without saying anything about caches; at 16 it is
// ~1 in 10^4 above 3e-5, and a CI run still met a 16-wide, 3-layer model where impl and ref
// differed by 1.01e-4 with no cache involved (ImplEqualsRef.Stateful, one 12-token prefill).
// 32 wide keeps the gate about caches.
inline constexpr int64_t kMinShapeWidth = 32;
// The widest (attention and hidden): a 3-layer model of this width with a 1024-token vocabulary
// still runs a short case in milliseconds.
inline constexpr int64_t kMaxShapeWidth = 256;

// Which shapes a campaign draws. kSmall: the shapes above (`--shapes random`). kLong: the long
// tier (`check --long`): small and narrow (1-2 layers, 32-64 wide, vocabularies up to 256), with
// contexts of 8192 to 32768 positions and, half the time, llama3 rope scaling from an original
// context of 1024-8192, so that a case runs far into the scaled band within seconds. There the
// RoPE angles' rounding grows with the position and cached and uncached paths share it, so only
// the comparison with ref64 sees a port's error (docs/campaign-cases.md, "The long tier").
enum class ShapeTier { kSmall, kLong };
inline constexpr int64_t kLongTierMinContext = 8192;
inline constexpr int64_t kLongTierMaxContext = 32768;

// The config of case k of the campaign seeded `seed` (valid: LlamaConfig::Validate passes). Each
// tier draws from a stream of its own.
// windows: whether every backend applies a sliding window (BackendInfo::sliding_windows); then
// some small-tier shapes (kWindowPercent) have one, of 1 to kMaxWindow positions (within the
// context), drawn from a stream of its own, so every other field of every shape is the same
// either way. The long tier draws none (a window of a few positions would make its long
// positions attend a handful of keys).
format::LlamaConfig DrawShape(uint64_t seed, int64_t k, ShapeTier tier = ShapeTier::kSmall,
                              bool windows = false);
// Case k's model: DrawShape's config with random weights of a seed drawn alongside it, as the
// inline-config ModelSpec a failing case's replay file records.
ModelSpec ShapeModel(uint64_t seed, int64_t k, ShapeTier tier = ShapeTier::kSmall,
                     bool windows = false);
inline constexpr int kWindowPercent = 30;
// Small, so that a short case (48 positions at most) crosses and wraps it.
inline constexpr int64_t kMaxWindow = 40;

}  // namespace kvdiff::harness
