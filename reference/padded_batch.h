// A padded batch as a transformers user builds one, shared by the files of reference/ only (this
// header includes LibTorch).
//
// How a transformers user runs several conversations of different lengths in one forward: LEFT
// padding (generate()'s convention, so that every row's last token is in the last column). Row b
// of a padded batch of B conversations is
//
//     [ zeros (P - P_b) | b's cached K/V (P_b) | padding (S - S_b) | b's new tokens (S_b) ]
//
// where P is the longest cache and S the most new tokens: what a left-padded chunk appended to a
// left-padded cache gives, attention_mask = cat(past mask, chunk mask). The 2-D attention_mask
// [B, P + S] is 1 on real columns and 0 on padding; the 4-D additive mask hides padded keys as it
// hides future ones; generate()'s position_ids count the unmasked columns, so each row's tokens
// sit at that row's own positions.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "format/tensor.h"
#include "reference/dynamic_cache_impl.h"
#include "reference/reference_model.h"

namespace kvdiff::ref {

// One row of a padded batch: a conversation's cache (batch 1) and the tokens appended to it.
struct BatchRow {
  DynamicCache::Impl* cache = nullptr;
  const Tokens* tokens = nullptr;
};

struct PaddedBatch {
  int64_t past_length = 0;           // P: the longest cache
  int64_t new_length = 0;            // S: the most new tokens
  std::vector<int64_t> new_lengths;  // S_b per row
  at::Tensor input_ids;              // [B, S] long; token 0 on padding
  at::Tensor attention_mask;         // [B, P + S] long: 1 real, 0 padding
  at::Tensor padded_inputs;          // [B, S, 1] bool: the input columns that are padding
  DynamicCache::Impl past;           // per layer [B, nkv, P, d], zeros where padded

  // Column of row b's new token k in the batch's input [B, S].
  int64_t InputColumn(size_t b, int64_t k) const { return new_length - new_lengths[b] + k; }
};

// Left-pads every row's cache and new tokens (see the top of this file). The caches belong to the
// same model (checked by the caller); rows with an empty cache get zeros.
PaddedBatch LeftPad(const std::vector<BatchRow>& rows);

// The rows of the batch's hidden states [B*S, hidden] the parts ask for (BatchPart::output), in
// part and token order: the real rows, un-padded.
std::vector<int64_t> OutputRows(const PaddedBatch& batch, const std::vector<BatchPart>& parts);

// Those rows' logits [rows, vocab] split back into the parts: per part, its rows asked for.
std::vector<Logits> SplitByPart(const Logits& kept, const std::vector<BatchPart>& parts);

// After the forward: row b's new K/V (its last S_b columns of the batch's cache) appended to its
// own cache, layer by layer, as copies (a view would keep the whole batch's tensor alive).
void AppendNewKeyValues(const DynamicCache::Impl& batch_cache, const PaddedBatch& batch,
                        const std::vector<BatchRow>& rows);

}  // namespace kvdiff::ref
