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

// A sliding window W (Mistral's sliding_window) on top of a 4-D mask [B, 1, s, T]: key column j
// is hidden from query i of row b (set to finfo.min, never added) when its position is W or more
// before the query's, key_positions[b, j] <= query_positions[b, i] - W, so a query sees W keys,
// itself included, as transformers' sliding window mask (kv_idx > q_idx - W) and llama.cpp's
// LLAMA_SWA_TYPE_STANDARD (p1 - p0 >= n_swa is masked). Positions, not columns: in a padded row
// the columns of padding between a cache and a chunk are not positions. key_positions [B or 1,
// T], query_positions [B or 1, s], long.
at::Tensor ApplySlidingWindow(const at::Tensor& causal_mask, const at::Tensor& key_positions,
                              const at::Tensor& query_positions, int64_t window);

// A forward of one conversation whose mask would have more entries than this (s queries x
// P + s + 1 columns) attends its queries a block at a time (llama_layers.cc, EagerAttention),
// each block of at most this many entries. Up to it (every forward of up to 4096 positions, and
// so every forward of the default campaigns; every padded batch) the whole 4-D mask is built once,
// as LlamaModel does. Past it, the whole mask and scores would not fit in memory ([s, P+s+1] and
// [nh, s, P+s]: 4 GB and 16 GB in float32 at 32768 positions on 4 heads, twice that for ref64):
// the long tier's contexts (check --long).
inline constexpr int64_t kWholeMaskEntries = int64_t{4096} * 4097;

// The mask a forward's attention adds to its scores: transformers' whole [B, 1, s, target] mask,
// or (`whole` undefined) the means to build the rows of one block of queries at a time from the
// block's own cache positions, so that each row's scores, softmax and sums are the same
// arithmetic on the same values as in the whole matrix.
struct CausalMask {
  at::Tensor whole;
  at::Tensor cache_position;  // [s] long: the column of each query
  int64_t target_length = 0;
  at::ScalarType dtype = at::kFloat;
  int64_t window = 0;  // the model's sliding window (0: none), applied to each block's rows

  // Rows [start, start + n) of the mask, [batch_size, 1, n, target_length].
  at::Tensor Rows(int64_t start, int64_t n, int64_t batch_size) const;
};

// generate()'s position_ids: attention_mask.cumsum(-1) - 1, padding set to 1, the columns of the
// new tokens: [B, S], row b's new token k at position P_b + k.
at::Tensor PositionIdsFromAttentionMask(const at::Tensor& attention_mask, int64_t new_length);

}  // namespace kvdiff::ref
