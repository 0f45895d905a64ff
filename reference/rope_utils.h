// modeling_rope_utils.py's rope_init_fn for Llama (internal to reference/; includes LibTorch):
// the inverse frequencies LlamaRotaryEmbedding multiplies with position_ids.
#pragma once

#include <ATen/ATen.h>

#include "format/config.h"

namespace kvdiff::ref {

// _compute_default_rope_parameters: 1.0 / (base ** (arange(0, dim, 2, int64).float() / dim)),
// [head_dim / 2] in `dtype` (float32 as transformers, float64 for ref64).
at::Tensor ComputeDefaultRopeParameters(const format::LlamaConfig& config, at::ScalarType dtype);

// _compute_llama3_parameters: long wavelengths slowed by `factor`, short ones kept, a smooth
// blend between; the same tensor expressions as transformers, in the same dtype. Needs
// config.rope_scaling.
at::Tensor ComputeLlama3Parameters(const format::LlamaConfig& config, at::ScalarType dtype);

}  // namespace kvdiff::ref
