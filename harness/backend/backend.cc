// The batched call's default: the items one after another, through their own sessions.
#include "harness/backend/backend.h"

#include <algorithm>

#include "format/error.h"

namespace kvdiff::harness {

int64_t BatchItem::OutputRows() const {
  if (output.empty()) return static_cast<int64_t>(tokens.size());
  return std::count(output.begin(), output.end(), true);
}

Logits KeepOutputRows(const Logits& all, const std::vector<bool>& output) {
  if (output.empty()) return all;
  KVDIFF_CHECK(static_cast<int64_t>(output.size()) == all.rows(), "{} output flags for {} rows",
               output.size(), all.rows());
  Logits kept(std::count(output.begin(), output.end(), true), all.cols());
  int64_t k = 0;
  for (int64_t r = 0; r < all.rows(); ++r)
    if (output[r]) kept.row(k++) = all.row(r);
  return kept;
}

std::vector<Logits> Backend::AppendBatch(const std::vector<BatchItem>& items) const {
  std::vector<Logits> out;
  out.reserve(items.size());
  for (const BatchItem& item : items) {
    KVDIFF_CHECK(item.session != nullptr, "AppendBatch: an item has no session");
    KVDIFF_CHECK(item.output.empty() || item.output.size() == item.tokens.size(),
                 "AppendBatch: {} output flags for {} tokens", item.output.size(),
                 item.tokens.size());
    const Logits all = item.session->Append(item.tokens);
    KVDIFF_CHECK(all.rows() == static_cast<int64_t>(item.tokens.size()),
                 "backend {} returned {} logits rows for {} tokens", Name(), all.rows(),
                 item.tokens.size());
    out.push_back(KeepOutputRows(all, item.output));
  }
  return out;
}

}  // namespace kvdiff::harness
