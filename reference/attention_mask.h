// transformers' attention masks (modeling_attn_mask_utils.py and LlamaModel's mask code), shared by
// the files of reference/ only: this header includes LibTorch.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace kvdiff::ref {

// torch.finfo(dtype).min: the additive mask's value for a key a query may not see. Not -inf: a
// row that sees no key at all (a padded query with nothing real before it) then softmaxes to a
// uniform average instead of 0/0 = NaN.
double MinOf(at::ScalarType dtype);

// LlamaModel._prepare_4d_causal_attention_mask_with_cache_position: [batch, 1, s, target_length]
// in `dtype`, 0 where query i (at column cache_position[i]) may see key j and finfo.min where it
// may not: j after the query, or, given a 2-D attention_mask [batch, target_length], j padded.
// Each entry is 0 or finfo.min, never their sum (padded keys are set with masked_fill, as
// transformers does: min + min would be -inf). attention_mask undefined: causality alone.
at::Tensor Prepare4dCausalAttentionMask(const at::Tensor& attention_mask, int64_t sequence_length,
                                        int64_t target_length, at::ScalarType dtype,
                                        const at::Tensor& cache_position, int64_t batch_size);

// generate()'s position_ids: attention_mask.cumsum(-1) - 1, padding set to 1, the columns of the
// new tokens: [B, S], row b's new token k at position P_b + k.
at::Tensor PositionIdsFromAttentionMask(const at::Tensor& attention_mask, int64_t new_length);

}  // namespace kvdiff::ref
