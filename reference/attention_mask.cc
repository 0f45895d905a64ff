// transformers' attention masks and the position_ids generate() derives from them.
#include "reference/attention_mask.h"

#include <limits>

namespace kvdiff::ref {

using at::Tensor;

double MinOf(at::ScalarType dtype) {
  return dtype == at::kDouble ? std::numeric_limits<double>::lowest()
                              : static_cast<double>(std::numeric_limits<float>::lowest());
}

Tensor Prepare4dCausalAttentionMask(const Tensor& attention_mask, int64_t sequence_length,
                                    int64_t target_length, at::ScalarType dtype,
                                    const Tensor& cache_position, int64_t batch_size) {
  const double min_dtype = MinOf(dtype);
  Tensor causal_mask =
      at::full({sequence_length, target_length}, min_dtype, at::TensorOptions().dtype(dtype));
  if (sequence_length != 1) causal_mask = at::triu(causal_mask, /*diagonal=*/1);
  causal_mask *= at::arange(target_length, at::kLong) > cache_position.reshape({-1, 1});
  causal_mask = causal_mask.index({at::indexing::None, at::indexing::None})
                    .expand({batch_size, 1, -1, -1});  // [B, 1, s, target_length]
  if (!attention_mask.defined()) return causal_mask;

  // A key is hidden for padding where causality shows it: causal 0 and attention_mask 0.
  causal_mask = causal_mask.clone();  // contiguous memory for the edit
  const int64_t mask_length = attention_mask.size(-1);
  Tensor visible = causal_mask.narrow(-1, 0, mask_length);
  Tensor padding_mask = (visible + attention_mask
                                       .index({at::indexing::Slice(), at::indexing::None,
                                               at::indexing::None, at::indexing::Slice()})
                                       .to(dtype)) == 0;
  visible.copy_(visible.masked_fill(padding_mask, min_dtype));
  return causal_mask;
}

Tensor ApplySlidingWindow(const Tensor& causal_mask, const Tensor& key_positions,
                          const Tensor& query_positions, int64_t window) {
  using at::indexing::None;
  using at::indexing::Slice;
  const Tensor keys = key_positions.index({Slice(), None, None, Slice()});       // [B, 1, 1, T]
  const Tensor queries = query_positions.index({Slice(), None, Slice(), None});  // [B, 1, s, 1]
  const Tensor out_of_window = keys <= queries - window;                         // [B, 1, s, T]
  return causal_mask.masked_fill(out_of_window, MinOf(causal_mask.scalar_type()));
}

Tensor CausalMask::Rows(int64_t start, int64_t n, int64_t batch_size) const {
  const Tensor positions = cache_position.narrow(0, start, n);
  Tensor rows =
      Prepare4dCausalAttentionMask(Tensor(), n, target_length, dtype, positions, batch_size);
  if (window == 0) return rows;
  return ApplySlidingWindow(rows, at::arange(target_length, at::kLong).unsqueeze(0),
                            positions.unsqueeze(0), window);
}

Tensor PositionIdsFromAttentionMask(const Tensor& attention_mask, int64_t new_length) {
  Tensor position_ids = attention_mask.cumsum(-1) - 1;
  position_ids.masked_fill_(attention_mask == 0, 1);
  return position_ids.narrow(1, position_ids.size(1) - new_length, new_length);
}

}  // namespace kvdiff::ref
