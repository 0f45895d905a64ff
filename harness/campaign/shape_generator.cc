#include "harness/campaign/shape_generator.h"

#include <algorithm>

#include "harness/campaign/case_rng.h"

namespace kvdiff::harness {
namespace {

constexpr int64_t kMinHeadDim = 8, kMaxHeadDim = 128;

// A stream of its own, so the shape of case k does not depend on how its steps are drawn.
uint64_t ShapeStream(uint64_t seed, int64_t k) {
  return CaseStream(seed, k) ^ 0x5348415045530000ull;
}

// An even head_dim in [8, 128] with heads x head_dim in [kMinShapeWidth, kMaxShapeWidth]: half the
// time a power of two (what real models use), else any even size (odd strides: 18, 22, 54...).
int64_t DrawHeadDim(CaseRng& rng, int64_t heads, int64_t max_width = kMaxShapeWidth) {
  const int64_t need = std::max(kMinHeadDim, (kMinShapeWidth + heads - 1) / heads);
  const int64_t lo = (need + 1) / 2 * 2;
  const int64_t hi = std::min(kMaxHeadDim, max_width / heads) / 2 * 2;
  std::vector<int64_t> powers;
  for (int64_t p = kMinHeadDim; p <= hi; p *= 2)
    if (p >= lo) powers.push_back(p);
  if (!powers.empty() && rng.Chance(50))
    return powers[rng.Below(static_cast<int64_t>(powers.size()))];
  return 2 * rng.Between(lo / 2, hi / 2);
}

// A few positions (short cases reach the end of the cache), the usual powers of two, or anything
// between.
int64_t DrawContext(CaseRng& rng) {
  const int64_t roll = rng.Below(100);
  if (roll < 30) return rng.Between(8, 64);
  if (roll < 70) return int64_t{1} << rng.Between(7, 12);  // 128 .. 4096
  return rng.Between(65, 2048);
}

// llama3 scaling with an original context of 8..64, so that at any head_dim and theta drawn both
// the scaled (long-wavelength) and the kept (short-wavelength) bands of frequencies occur.
format::RopeScaling DrawRopeScaling(CaseRng& rng) {
  format::RopeScaling s;
  const double factors[] = {2.0, 4.0, 8.0, 32.0};
  s.factor = rng.Pick(factors);
  const double smoothing[][2] = {{1.0, 4.0}, {2.0, 8.0}, {1.0, 2.0}};
  const auto& band = smoothing[rng.Below(3)];
  s.low_freq_factor = band[0];
  s.high_freq_factor = band[1];
  s.original_max_position_embeddings = rng.Between(8, 64);
  return s;
}

// The long tier's shape (ShapeTier::kLong): narrow and shallow, so that a forward of 32768
// positions takes seconds (attention grows with the square of the length and with the width);
// a context of 8192, 16384 or 32768 positions, or anything between.
constexpr int64_t kLongTierMaxWidth = 64;
format::LlamaConfig DrawLongShape(CaseRng& rng) {
  format::LlamaConfig c;
  c.num_hidden_layers = rng.Between(1, 2);
  c.num_key_value_heads = rng.Between(1, 2);
  c.num_attention_heads = c.num_key_value_heads * rng.Between(1, 2);
  c.head_dim = DrawHeadDim(rng, c.num_attention_heads, kLongTierMaxWidth);
  c.hidden_size = c.QDim();
  c.intermediate_size = rng.Between(16, 2 * c.hidden_size);
  c.vocab_size = rng.Between(32, 256);
  const int64_t roll = rng.Below(100);
  c.max_position_embeddings = roll < 35   ? 8192
                              : roll < 65 ? 16384
                              : roll < 80
                                  ? kLongTierMaxContext
                                  : rng.Between(kLongTierMinContext + 1, kLongTierMaxContext);
  const double thetas[] = {10000.0, 500000.0, 1000000.0};
  c.rope_theta = rng.Pick(thetas);
  const double epsilons[] = {1e-6, 1e-5};
  c.rms_norm_eps = rng.Pick(epsilons);
  c.tie_word_embeddings = rng.Chance(50);
  if (rng.Chance(50)) {
    c.rope_scaling = DrawRopeScaling(rng);
    c.rope_scaling->original_max_position_embeddings = rng.Between(1024, 8192);
  }
  return c;
}

}  // namespace

format::LlamaConfig DrawShape(uint64_t seed, int64_t k, ShapeTier tier, bool windows) {
  if (tier == ShapeTier::kLong) {
    CaseRng rng(ShapeStream(seed, k) ^ 0x4C4F4E4754494552ull);  // "LONGTIER"
    format::LlamaConfig c = DrawLongShape(rng);
    c.bos_token_id = 1;
    c.eos_token_id = 2;
    c.torch_dtype = "float32";
    c.Validate();
    return c;
  }
  CaseRng rng(ShapeStream(seed, k));
  format::LlamaConfig c;
  c.num_hidden_layers = rng.Between(1, 3);
  c.num_key_value_heads = rng.Between(1, 4);
  c.num_attention_heads = c.num_key_value_heads * rng.Between(1, 8);  // n_rep 1..8
  c.head_dim = DrawHeadDim(rng, c.num_attention_heads);
  // q_proj maps hidden to heads x head_dim: equal in most models, not in all (HF's explicit
  // head_dim), and a port that assumes they are equal reads the wrong strides.
  c.hidden_size =
      rng.Chance(80) ? c.QDim() : 8 * rng.Between(kMinShapeWidth / 8, kMaxShapeWidth / 8);
  c.intermediate_size = rng.Between(8, std::min<int64_t>(3 * c.hidden_size, 2 * kMaxShapeWidth));
  c.vocab_size = rng.Between(32, 1024);  // odd half the time
  c.max_position_embeddings = DrawContext(rng);
  const double thetas[] = {10000.0, 100000.0, 500000.0};
  c.rope_theta = rng.Chance(70) ? rng.Pick(thetas) : static_cast<double>(rng.Between(100, 1000000));
  const double epsilons[] = {1e-6, 1e-5, 1e-4};
  c.rms_norm_eps = rng.Pick(epsilons);
  c.tie_word_embeddings = rng.Chance(50);
  if (rng.Chance(40)) c.rope_scaling = DrawRopeScaling(rng);
  c.bos_token_id = 1;
  c.eos_token_id = 2;
  c.torch_dtype = "float32";
  if (windows) {
    CaseRng window_rng(ShapeStream(seed, k) ^ 0x57494E444F570000ull);
    if (window_rng.Chance(kWindowPercent))
      c.sliding_window = window_rng.Between(1, std::min(kMaxWindow, c.max_position_embeddings));
  }
  c.Validate();
  return c;
}

ModelSpec ShapeModel(uint64_t seed, int64_t k, ShapeTier tier, bool windows) {
  ModelSpec spec;
  spec.config = DrawShape(seed, k, tier, windows);
  // Drawn from the shape's own stream after the config: the seed does not move the shape.
  CaseRng rng(ShapeStream(seed, k) ^ 0x5745494748545300ull);
  spec.seed = static_cast<uint64_t>(rng.Below(int64_t{1} << 31));
  return spec;
}

}  // namespace kvdiff::harness
