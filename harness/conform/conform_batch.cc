// The batch checks of `kvdiff conform`: several conversations advanced in ONE
// Backend::AppendBatch call, as a serving engine runs them (llama.cpp's one llama_decode, a
// plugin's append_batch). Each returned row is held to the oracle's uncached forward of its own
// conversation, like every row conform sees, and to the rows the engine gives for the same item
// appended alone: the batch's own semantic reference, which names a batching bug (a mask, a
// position, a cell, a row mapped to the wrong item) even where the oracle's difference alone would
// not say it is the batch's. Then the refusals: a batch that cannot be given to an engine changes
// nothing.
#include <fmt/format.h>

#include <string>
#include <vector>

#include "harness/conform/conform_detail.h"

namespace kvdiff::harness::conform_detail {
namespace {

std::vector<bool> Last(int64_t n) {
  std::vector<bool> flags(n, false);
  flags.back() = true;
  return flags;
}
std::vector<bool> None(int64_t n) { return std::vector<bool>(n, false); }

// The positions of the rows `output` flags, for n tokens appended at `length`.
std::vector<int64_t> FlaggedPositions(int64_t length, int64_t n, const std::vector<bool>& output) {
  std::vector<int64_t> positions;
  for (int64_t t = 0; t < n; ++t)
    if (output.empty() || output[t]) positions.push_back(length + t);
  return positions;
}

// One batched call (every row held to the oracle), then each item alone on a new session of the
// same history (its rows held to the oracle too), and the batched rows held to the alone ones. The
// alone sessions live one at a time, so an engine with few sequences (llama.cpp's `sessions=`)
// needs one more than the batch.
std::vector<Logits> BatchThenAlone(Probe& p, const std::vector<Probe::BatchPart>& parts,
                                   const std::string& what) {
  std::vector<Tokens> before;
  for (const Probe::BatchPart& part : parts) before.push_back(part.conversation->history);
  const std::vector<Logits> batched = p.AppendBatch(parts, what);
  for (size_t k = 0; k < parts.size(); ++k) {
    const std::string item = fmt::format("{}, item {} alone", what, k);
    Probe::Conversation alone = p.New();
    if (!before[k].empty()) p.Append(alone, before[k], item + ": its history");
    const Logits rows = KeepOutputRows(p.Append(alone, parts[k].tokens, item), parts[k].output);
    const auto length = static_cast<int64_t>(before[k].size());
    const auto n = static_cast<int64_t>(parts[k].tokens.size());
    p.ExpectSameRows(batched[k], rows, FlaggedPositions(length, n, parts[k].output),
                     fmt::format("{}, item {}: batched against alone", what, k));
  }
  return batched;
}

// Conversations of different lengths in one call: a long one decoding, a new one prefilling and
// asking for its last row only (a server after a prompt chunk), one whose rows nobody wants, a
// twin (a fork of the first) given the same token, a short one prefilling; then a decode step for
// each; then a subset in another order. Batches are larger than a micro-batch of a few tokens, so
// an engine that splits them (llama.cpp's ubatch=) splits across items.
std::string CheckBatch(Probe& p) {
  auto a = p.New(), b = p.New(), c = p.New(), e = p.New();
  p.Append(a, p.RandomTokens(10), "prefill of 10 (a)");
  p.Append(c, p.RandomTokens(5), "prefill of 5 (c)");
  p.Append(e, p.RandomTokens(1), "prefill of 1 (e)");
  auto twin = p.Fork(a, "a fork of a (its twin)");
  const Tokens next = p.RandomTokens(1);
  const std::vector<Logits> first =
      BatchThenAlone(p,
                     {{&a, next, {}},
                      {&b, p.RandomTokens(7), Last(7)},
                      {&c, p.RandomTokens(3), None(3)},
                      {&twin, next, {}},
                      {&e, p.RandomTokens(4), {}}},
                     "batch 1 (a:decode, b:7/last, c:3/none, twin:decode, e:4)");
  p.ExpectSameRows(first[3], first[0], {10}, "batch 1: a and its twin, given the same token");
  std::vector<Probe::BatchPart> decode;
  for (Probe::Conversation* conv : {&a, &b, &c, &twin, &e})
    decode.push_back({conv, p.RandomTokens(1), {}});
  BatchThenAlone(p, decode, "batch 2 (a decode step of each)");
  BatchThenAlone(
      p,
      {{&e, p.RandomTokens(2), {}}, {&a, p.RandomTokens(6), Last(6)}, {&c, p.RandomTokens(1), {}}},
      "batch 3 (e:2, a:6/last, c:1)");
  return p.Figures() + "; against the items alone " + p.SameRowsFigure() +
         "; items of 1 to 7 tokens at lengths 0 to 12, twins, all/last/no rows";
}

// A batch after forks, truncates and a freed session: in an engine with a shared pool of cache
// cells (llama.cpp's unified KV cache) the free cells are then scattered, and the batch's tokens
// land between other sequences' cells.
std::string CheckBatchAfterForkAndTruncate(Probe& p) {
  auto a = p.New();
  p.Append(a, p.RandomTokens(16), "prefill of 16 (a)");
  auto b = p.Fork(a, "b, a fork of a at 16");
  a.session->Truncate(5);
  a.history.resize(5);
  p.ExpectLength(a, "a truncated to 5");
  auto c = p.New();
  p.Append(c, p.RandomTokens(6), "prefill of 6 (c)");
  b.session->Truncate(9);
  b.history.resize(9);
  p.ExpectLength(b, "b truncated to 9");
  auto d = p.Fork(c, "d, a fork of c at 6");
  c.session->Truncate(2);
  c.history.resize(2);
  p.ExpectLength(c, "c truncated to 2");
  p.Append(d, p.RandomTokens(3), "d +3");
  {
    auto freed = p.Fork(b, "a fork of b, freed at once");
    p.Append(freed, p.RandomTokens(4), "the fork of b +4");
  }
  BatchThenAlone(p,
                 {{&a, p.RandomTokens(7), {}},
                  {&b, p.RandomTokens(4), Last(4)},
                  {&c, p.RandomTokens(1), {}},
                  {&d, p.RandomTokens(2), None(2)}},
                 "batch 1 (a:7, b:4/last, c:1, d:2/none)");
  std::vector<Probe::BatchPart> decode;
  for (Probe::Conversation* conv : {&d, &c, &b, &a})
    decode.push_back({conv, p.RandomTokens(1), {}});
  BatchThenAlone(p, decode, "batch 2 (a decode step of each)");
  return p.Figures() + "; against the items alone " + p.SameRowsFigure() +
         "; after 2 forks, 3 truncates and a freed session";
}

// What engine.h's append_batch refuses before anything runs: the call fails as a whole, so every
// session named keeps its length and its cache (the next append is still right).
std::string CheckBatchRefusals(Probe& p) {
  auto a = p.New(), b = p.New();
  p.Append(a, p.RandomTokens(4), "prefill of 4 (a)");
  p.Append(b, p.RandomTokens(3), "prefill of 3 (b)");
  const Backend& engine = p.engine();
  BackendSession* sa = a.session.get();
  BackendSession* sb = b.session.get();
  // The refusal the engine itself makes (a token it cannot embed, in the second item) last, so
  // the report quotes the engine.
  p.ExpectRefused({&a, &b}, "a batch of no items", [&] { engine.AppendBatch({}); });
  p.ExpectRefused({&a, &b}, "a batch naming a session twice", [&] {
    engine.AppendBatch({{sa, {1}, {}}, {sb, {2}, {}}, {sa, {3}, {}}});
  });
  p.ExpectRefused({&a, &b}, "a batch with an empty item", [&] {
    engine.AppendBatch({{sa, {1, 2}, {}}, {sb, {}, {}}});
  });
  const Token vocab = static_cast<Token>(p.vocab());
  p.ExpectRefused(
      {&a, &b},
      fmt::format("a batch whose second item holds token {} (vocab_size {})", vocab, vocab), [&] {
        engine.AppendBatch({{sa, {1, 2}, {}}, {sb, {3, vocab}, {}}});
      });
  return fmt::format("{} batches {}", p.Refusals(), Refused(p));
}

}  // namespace

std::vector<CheckDef> BatchChecks() {
  return {
      {"batch",
       "conversations advanced in one batched call, prefill and decode items of different "
       "lengths, twins, all/last/no rows: every row equals the oracle's and the items alone",
       CheckBatch},
      {"batch-fork-truncate",
       "a batched call after forks, truncates and a freed session (scattered cache cells): "
       "every row equals the oracle's and the items alone",
       CheckBatchAfterForkAndTruncate},
      {"batch-refusals",
       "a batch naming a session twice, with an empty item, a token out of range or no item is "
       "refused, changing nothing",
       CheckBatchRefusals},
  };
}

}  // namespace kvdiff::harness::conform_detail
