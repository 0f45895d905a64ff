// DynamicCache's inside (cache_utils.py), shared by the files of reference/ only: this header
// includes LibTorch. One K and one V tensor per layer, grown by concatenation on the sequence
// dimension (-2). Nothing here knows about positions: the model derives them from SeqLength(),
// which is why reusing a cache continues the old conversation.
//
// A conversation's cache holds batch 1: [1, nkv, P, d]. A padded batch (padded_batch.h) is a
// DynamicCache of batch B, [B, nkv, P, d], as transformers' cache of a batched generate() is.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "reference/reference_model.h"

namespace kvdiff::ref {

struct DynamicCache::Impl {
  std::vector<at::Tensor> key_cache;    // per layer [B, nkv, P, d]
  std::vector<at::Tensor> value_cache;  // per layer [B, nkv, P, d]

  // get_seq_length(layer_idx=0)
  int64_t SeqLength() const {
    if (key_cache.empty() || !key_cache[0].defined() || key_cache[0].numel() == 0) return 0;
    return key_cache[0].size(-2);
  }

  // update(key_states, value_states, layer_idx): returns the whole K/V of that layer.
  std::pair<at::Tensor, at::Tensor> Update(const at::Tensor& key_states,
                                           const at::Tensor& value_states, size_t layer_idx) {
    if (key_cache.size() <= layer_idx) {
      key_cache.push_back(key_states);
      value_cache.push_back(value_states);
    } else if (key_cache[layer_idx].numel() == 0) {
      key_cache[layer_idx] = key_states;
      value_cache[layer_idx] = value_states;
    } else {
      key_cache[layer_idx] = at::cat({key_cache[layer_idx], key_states}, -2);
      value_cache[layer_idx] = at::cat({value_cache[layer_idx], value_states}, -2);
    }
    return {key_cache[layer_idx], value_cache[layer_idx]};
  }

  // crop(max_length): views of the first max_length positions, as transformers slices them.
  void CropTo(int64_t length) {
    for (size_t l = 0; l < key_cache.size(); ++l) {
      if (key_cache[l].numel() == 0) continue;
      key_cache[l] = key_cache[l].narrow(-2, 0, length);
      value_cache[l] = value_cache[l].narrow(-2, 0, length);
    }
  }
};

}  // namespace kvdiff::ref
