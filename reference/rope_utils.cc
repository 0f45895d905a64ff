// modeling_rope_utils.py's inverse frequencies, the same ATen ops in the same order and dtypes as
// Python, including the scalar-on-the-left operators (`1.0 / t` is `t.reciprocal() * 1.0`).
#include "reference/rope_utils.h"

namespace kvdiff::ref {

using at::Tensor;

namespace {
constexpr double kPi = 3.141592653589793;  // math.pi
}  // namespace

Tensor ComputeDefaultRopeParameters(const format::LlamaConfig& config, at::ScalarType dtype) {
  const int64_t dim = config.head_dim;
  Tensor exponent = at::arange(0, dim, 2, at::kLong).to(dtype) / dim;
  return at::pow(config.rope_theta, exponent).reciprocal() * 1.0;
}

Tensor ComputeLlama3Parameters(const format::LlamaConfig& config, at::ScalarType dtype) {
  const format::RopeScaling& s = *config.rope_scaling;
  Tensor inv_freq = ComputeDefaultRopeParameters(config, dtype);
  const double factor = s.factor;
  const double low_freq_factor = s.low_freq_factor;
  const double high_freq_factor = s.high_freq_factor;
  const double old_context_len = static_cast<double>(s.original_max_position_embeddings);
  const double low_freq_wavelen = old_context_len / low_freq_factor;
  const double high_freq_wavelen = old_context_len / high_freq_factor;

  Tensor wavelen = inv_freq.reciprocal() * (2 * kPi);  // 2 * math.pi / inv_freq
  Tensor inv_freq_llama = at::where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq);
  Tensor smooth_factor = (wavelen.reciprocal() * old_context_len - low_freq_factor) /
                         (high_freq_factor - low_freq_factor);
  Tensor smoothed_inv_freq =
      at::rsub(smooth_factor, 1) * inv_freq_llama / factor + smooth_factor * inv_freq_llama;
  Tensor is_medium_freq =
      (wavelen < high_freq_wavelen).logical_not() * (wavelen > low_freq_wavelen).logical_not();
  return at::where(is_medium_freq, smoothed_inv_freq, inv_freq_llama);
}

}  // namespace kvdiff::ref
