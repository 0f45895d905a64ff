// What a batched call (engine.h's append_batch) refuses before its engine sees anything, said once
// for every caller that builds one: engines::Engine, engines::IsolatedEngine (in the parent, before
// a byte is sent) and the harness's plugin backend. Works on any item type with the members of
// engines::BatchItemOf: `session` (a pointer), `tokens`, `output`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "format/error.h"

namespace kvdiff::engines {

// InputError naming `who` and the items unless `items` may be given to an engine: at least one
// item; every item's session is one of the engine's (`owned(item.session)`, which also refuses
// null); its tokens are not empty; its output flags are empty (every row) or one per token; no
// session is named twice.
template <class Item, class Owned>
void CheckBatchItems(const std::string& who, const std::vector<Item>& items, Owned&& owned) {
  KVDIFF_CHECK(!items.empty(), "{}: a batch of no items (expected at least one)", who);
  for (size_t i = 0; i < items.size(); ++i) {
    const Item& item = items[i];
    KVDIFF_CHECK(owned(item.session), "{}: batch item {} is not a session of this engine", who, i);
    KVDIFF_CHECK(!item.tokens.empty(), "{}: batch item {} has no tokens (expected at least one)",
                 who, i);
    KVDIFF_CHECK(item.output.empty() || item.output.size() == item.tokens.size(),
                 "{}: batch item {} has {} output flags for {} tokens", who, i, item.output.size(),
                 item.tokens.size());
    // Quadratic, and fine: a batch holds as many items as a scenario has conversations.
    for (size_t j = 0; j < i; ++j) {
      KVDIFF_CHECK(items[j].session != item.session,
                   "{}: batch items {} and {} name the same session", who, j, i);
    }
  }
}

// engine.h's output flags of `item`: one byte per token, 1 when its row comes back.
template <class Item>
std::vector<uint8_t> OutputFlags(const Item& item) {
  std::vector<uint8_t> flags(item.tokens.size(), 1);
  for (size_t r = 0; r < item.output.size(); ++r) flags[r] = item.output[r] ? 1 : 0;
  return flags;
}

// How many rows of `flags` come back.
inline int64_t FlaggedRows(const std::vector<uint8_t>& flags) {
  int64_t rows = 0;
  for (uint8_t f : flags) rows += f;
  return rows;
}

}  // namespace kvdiff::engines
