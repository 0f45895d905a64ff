// The batched call's default: the items one after another, through their own sessions, once every
// refusal has been made.
#include "harness/backend/backend.h"

#include <fmt/format.h>

#include <algorithm>

#include "format/error.h"
#include "plugin_host/batch_items.h"

namespace kvdiff::harness {

int64_t BatchItem::OutputRows() const {
  if (output.empty()) return static_cast<int64_t>(tokens.size());
  return std::count(output.begin(), output.end(), true);
}

void BackendSession::Shift(int64_t keep, int64_t discard) {
  // ValidateScenarioFor refuses shift steps on a backend without BackendInfo::shifts, so a caller
  // that gets here skipped the validation.
  throw InputError(fmt::format(
      "shift(keep={}, discard={}): this backend's sessions cannot shift positions", keep, discard));
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
  // What a session would refuse halfway through the items is refused before the first runs, so a
  // refused call changes nothing, as engine.h promises of append_batch.
  const std::string who = fmt::format("backend {}", Name());
  engines::CheckBatchItems(who, items, [](const BackendSession* s) { return s != nullptr; });
  const format::LlamaConfig& c = config();
  for (size_t i = 0; i < items.size(); ++i) {
    const Tokens& tokens = items[i].tokens;
    for (size_t t = 0; t < tokens.size(); ++t) {
      KVDIFF_CHECK(tokens[t] >= 0 && tokens[t] < c.vocab_size,
                   "{}: batch item {}: token id {} at index {} is out of range for vocab_size {}",
                   who, i, tokens[t], t, c.vocab_size);
    }
    const int64_t length = items[i].session->Length();
    const auto n = static_cast<int64_t>(tokens.size());
    KVDIFF_CHECK(length + n <= c.max_position_embeddings,
                 "{}: batch item {}: {} tokens at length {} need {} positions, beyond "
                 "max_position_embeddings {}",
                 who, i, n, length, length + n, c.max_position_embeddings);
  }
  std::vector<Logits> out;
  out.reserve(items.size());
  for (const BatchItem& item : items) {
    const Logits all = item.session->Append(item.tokens);
    KVDIFF_CHECK(all.rows() == static_cast<int64_t>(item.tokens.size()),
                 "backend {} returned {} logits rows for {} tokens", Name(), all.rows(),
                 item.tokens.size());
    out.push_back(KeepOutputRows(all, item.output));
  }
  return out;
}

}  // namespace kvdiff::harness
