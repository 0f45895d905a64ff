// Left-padded batches (see padded_batch.h for the layout of a row).
#include "reference/padded_batch.h"

#include <algorithm>

namespace kvdiff::ref {

using at::Tensor;

namespace {

// Layer l's K (or V) of one cache, left-padded with zeros to `length` positions: [1, nkv, length,
// d]. `like` is the same layer of a cache that holds something (shape and dtype).
Tensor LeftPadded(const std::vector<Tensor>& layers, size_t l, int64_t length, const Tensor& like) {
  const bool empty = layers.size() <= l || layers[l].numel() == 0;
  const int64_t held = empty ? 0 : layers[l].size(-2);
  if (held == length) return layers[l];
  Tensor zeros = at::zeros({1, like.size(1), length - held, like.size(3)}, like.options());
  return empty ? zeros : at::cat({zeros, layers[l]}, -2);
}

}  // namespace

PaddedBatch LeftPad(const std::vector<BatchRow>& rows) {
  PaddedBatch batch;
  const DynamicCache::Impl* longest = nullptr;  // a cache that holds something, for its shapes
  for (const BatchRow& row : rows) {
    const int64_t held = row.cache->SeqLength();
    if (held > batch.past_length) longest = row.cache;
    batch.past_length = std::max(batch.past_length, held);
    batch.new_lengths.push_back(static_cast<int64_t>(row.tokens->size()));
    batch.new_length = std::max(batch.new_length, batch.new_lengths.back());
  }
  const int64_t B = static_cast<int64_t>(rows.size());
  const int64_t P = batch.past_length, S = batch.new_length;

  std::vector<int64_t> ids(B * S, 0), mask(B * (P + S), 0);
  for (int64_t b = 0; b < B; ++b) {
    const BatchRow& row = rows[b];
    const int64_t held = row.cache->SeqLength();
    std::fill_n(mask.begin() + b * (P + S) + P - held, held, 1);
    std::fill_n(mask.begin() + b * (P + S) + P + S - batch.new_lengths[b], batch.new_lengths[b], 1);
    for (int64_t k = 0; k < batch.new_lengths[b]; ++k) {
      ids[b * S + batch.InputColumn(b, k)] = (*row.tokens)[k];
    }
  }
  batch.input_ids = at::tensor(ids, at::kLong).reshape({B, S});
  batch.attention_mask = at::tensor(mask, at::kLong).reshape({B, P + S});
  batch.padded_inputs = (batch.attention_mask.narrow(1, P, S) == 0).unsqueeze(-1);

  if (longest == nullptr) return batch;  // no row has a past: the batch's cache starts empty
  for (size_t l = 0; l < longest->key_cache.size(); ++l) {
    std::vector<Tensor> keys, values;
    for (const BatchRow& row : rows) {
      keys.push_back(LeftPadded(row.cache->key_cache, l, P, longest->key_cache[l]));
      values.push_back(LeftPadded(row.cache->value_cache, l, P, longest->value_cache[l]));
    }
    batch.past.key_cache.push_back(at::cat(keys, 0));  // [B, nkv, P, d]
    batch.past.value_cache.push_back(at::cat(values, 0));
  }
  return batch;
}

std::vector<int64_t> OutputRows(const PaddedBatch& batch, const std::vector<BatchPart>& parts) {
  std::vector<int64_t> rows;
  for (size_t b = 0; b < parts.size(); ++b) {
    for (int64_t k = 0; k < batch.new_lengths[b]; ++k) {
      if (parts[b].output.empty() || parts[b].output[k])
        rows.push_back(static_cast<int64_t>(b) * batch.new_length + batch.InputColumn(b, k));
    }
  }
  return rows;
}

std::vector<Logits> SplitByPart(const Logits& kept, const std::vector<BatchPart>& parts) {
  std::vector<Logits> out;
  int64_t begin = 0;
  for (const BatchPart& part : parts) {
    const int64_t n = part.output.empty()
                          ? static_cast<int64_t>(part.tokens->size())
                          : std::count(part.output.begin(), part.output.end(), true);
    out.push_back(kept.middleRows(begin, n));
    begin += n;
  }
  return out;
}

void AppendNewKeyValues(const DynamicCache::Impl& batch_cache, const PaddedBatch& batch,
                        const std::vector<BatchRow>& rows) {
  const int64_t columns = batch.past_length + batch.new_length;
  for (size_t b = 0; b < rows.size(); ++b) {
    const int64_t n = batch.new_lengths[b];
    for (size_t l = 0; l < batch_cache.key_cache.size(); ++l) {
      const auto own = [&](const Tensor& t) {
        return t.narrow(0, static_cast<int64_t>(b), 1).narrow(-2, columns - n, n).clone();
      };
      rows[b].cache->Update(own(batch_cache.key_cache[l]), own(batch_cache.value_cache[l]), l);
    }
  }
}

}  // namespace kvdiff::ref
