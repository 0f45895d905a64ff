// The batch checks of `kvdiff conform`: several conversations advanced in ONE
// Backend::AppendBatch call, as a serving engine runs them (llama.cpp's one llama_decode, a
// plugin's append_batch). Each returned row is held to the oracle's uncached forward of its own
// conversation, like every row conform sees, and to the rows the engine gives for the same item
// appended alone: the batch's own semantic reference, which names a batching bug (a mask, a
// position, a cell, a row mapped to the wrong item) even where the oracle's difference alone would
// not say it is the batch's. Then the refusals: a batch that cannot be given to an engine changes
// nothing.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "harness/conform/conform_detail.h"

namespace kvdiff::harness::conform_detail {
namespace {

// One item of a batched call: the conversation, its tokens, which rows come back.
struct Part {
  std::string conversation;
  Tokens tokens;
  BatchLogits logits = BatchLogits::kAll;
  bool decode = false;  // named "decode" in failures, not by its count
};

// The conversations a check's batches take, of those it is written for (`order`): all of them,
// or as many as the engine's sessions hold beside the one an item alone needs (a server with four
// slots runs batches of three), the last ones left out. Fewer than two is no batch: the check is
// skipped, saying why.
class Taken {
 public:
  Taken(const Script& s, std::vector<std::string> order)
      : order_(std::move(order)), sessions_(s.engine().Info().max_sessions) {
    if (sessions_ > 0 && sessions_ < 3) {
      throw NotApplicable(fmt::format(
          "a batch of two conversations and an item alone need 3 sessions at once; the engine "
          "holds {} (max_sessions)",
          sessions_));
    }
    cut_ = sessions_ > 0 && sessions_ <= static_cast<int64_t>(order_.size());
    if (cut_) order_.resize(static_cast<size_t>(sessions_ - 1));
  }
  bool Has(const std::string& conversation) const {
    return std::find(order_.begin(), order_.end(), conversation) != order_.end();
  }
  // The parts whose conversation is taken. A batch's tokens are drawn whole, then cut: the tokens
  // of the full batch do not depend on the engine's sessions.
  std::vector<Part> Of(std::vector<Part> parts) const {
    parts.erase(std::remove_if(parts.begin(), parts.end(),
                               [this](const Part& p) { return !Has(p.conversation); }),
                parts.end());
    return parts;
  }
  // "; 3 conversations a call (max_sessions 4)" when the batches were cut to the engine's sessions.
  std::string Note() const {
    return cut_ ? fmt::format("; {} conversations a call (max_sessions {})", order_.size(),
                              sessions_)
                : "";
  }

 private:
  std::vector<std::string> order_;
  int64_t sessions_;
  bool cut_ = false;
};

// "a:decode, b:7/last": the items as a failure names them ("main" is "a").
std::string Describe(const std::vector<Part>& parts) {
  std::vector<std::string> items;
  for (const Part& p : parts) {
    std::string item = (p.conversation == "main" ? std::string("a") : p.conversation) + ":";
    item += p.decode ? std::string("decode") : std::to_string(p.tokens.size());
    if (p.logits == BatchLogits::kLast) item += "/last";
    if (p.logits == BatchLogits::kNone) item += "/none";
    items.push_back(item);
  }
  return fmt::format("{}", fmt::join(items, ", "));
}

// One batched call (every row held to the oracle), then each item alone on a new conversation of
// the same history (its rows held to the oracle too), and the batched rows held to the alone ones.
// The alone conversations live one at a time, so an engine with few sequences (llama.cpp's
// `sessions=`) needs one more than the batch. `histories` holds each conversation's tokens and
// moves on with the batch. Returns the batch step's index.
size_t BatchThenAlone(Script& s, std::map<std::string, Tokens>& histories,
                      const std::vector<Part>& parts, const std::string& what) {
  std::vector<BatchEntry> items;
  for (const Part& part : parts) {
    BatchEntry item;
    item.conversation = part.conversation;
    item.tokens = part.tokens;
    item.logits = part.logits;
    items.push_back(item);
  }
  const size_t batch = s.Add(Step::Batch(items), what);
  for (size_t k = 0; k < parts.size(); ++k) {
    const std::string item = fmt::format("{}, item {} alone", what, k);
    Tokens& history = histories[parts[k].conversation];
    s.Add(Step::NewConversation("alone"), item + ": a new session");
    if (!history.empty()) s.Append("alone", history, item + ": its history");
    const size_t alone = s.Append("alone", parts[k].tokens, item);
    s.Add(Step::End("alone"), item + ": freed");
    s.Same(fmt::format("{}, item {}: batched against alone", what, k), batch, parts[k].conversation,
           alone, "alone");
    history.insert(history.end(), parts[k].tokens.begin(), parts[k].tokens.end());
  }
  return batch;
}

// Appends n random tokens to the conversation, its history kept beside it.
void Append(Script& s, std::map<std::string, Tokens>& histories, const std::string& conversation,
            int64_t n, const std::string& what) {
  const Tokens tokens = s.RandomTokens(n);
  s.Append(conversation, tokens, what);
  Tokens& history = histories[conversation];
  history.insert(history.end(), tokens.begin(), tokens.end());
}

void Fork(Script& s, std::map<std::string, Tokens>& histories, const std::string& from,
          const std::string& to, const std::string& what) {
  s.Add(Step::Fork(from, to), what);
  histories[to] = histories[from];
}

void Truncate(Script& s, std::map<std::string, Tokens>& histories, const std::string& conversation,
              int64_t length, const std::string& what) {
  s.Add(Step::Truncate(conversation, length), what);
  histories[conversation].resize(length);
}

// Conversations of different lengths in one call: a long one decoding, a new one prefilling and
// asking for its last row only (a server after a prompt chunk), one whose rows nobody wants, a
// twin (a fork of the first) given the same token, a short one prefilling; then a decode step for
// each; then a subset in another order. Batches are larger than a micro-batch of a few tokens, so
// an engine that splits them (llama.cpp's ubatch=) splits across items. ("a" is the scenario's
// "main".)
std::string CheckBatch(Script& s) {
  const Taken taken(s, {"main", "b", "c", "twin", "e"});
  std::map<std::string, Tokens> h;
  for (const char* name : {"b", "c", "e"})
    if (taken.Has(name)) s.Add(Step::NewConversation(name), "a new session");
  Append(s, h, "main", 10, "prefill of 10 (a)");
  if (taken.Has("c")) Append(s, h, "c", 5, "prefill of 5 (c)");
  if (taken.Has("e")) Append(s, h, "e", 1, "prefill of 1 (e)");
  if (taken.Has("twin")) Fork(s, h, "main", "twin", "a fork of a (its twin)");
  const Tokens next = s.RandomTokens(1);
  const std::vector<Part> one = taken.Of({{"main", next, BatchLogits::kAll, true},
                                          {"b", s.RandomTokens(7), BatchLogits::kLast},
                                          {"c", s.RandomTokens(3), BatchLogits::kNone},
                                          {"twin", next, BatchLogits::kAll, true},
                                          {"e", s.RandomTokens(4)}});
  const size_t first = BatchThenAlone(s, h, one, fmt::format("batch 1 ({})", Describe(one)));
  if (taken.Has("twin"))
    s.Same("batch 1: a and its twin, given the same token", first, "twin", first, "main");
  std::vector<Part> decode;
  for (const char* name : {"main", "b", "c", "twin", "e"})
    decode.push_back({name, s.RandomTokens(1)});
  BatchThenAlone(s, h, taken.Of(decode), "batch 2 (a decode step of each)");
  const std::vector<Part> three = taken.Of({{"e", s.RandomTokens(2)},
                                            {"main", s.RandomTokens(6), BatchLogits::kLast},
                                            {"c", s.RandomTokens(1)}});
  BatchThenAlone(s, h, three, fmt::format("batch 3 ({})", Describe(three)));
  const Played played = s.Play();
  return played.Figures() + "; against the items alone " + played.SameRowsFigure() +
         "; items of 1 to 7 tokens at lengths 0 to 12, twins, all/last/no rows" + taken.Note();
}

// A batch after forks, truncates and a freed session: in an engine with a shared pool of cache
// cells (llama.cpp's unified KV cache) the free cells are then scattered, and the batch's tokens
// land between other sequences' cells. ("a" is the scenario's "main".)
std::string CheckBatchAfterForkAndTruncate(Script& s) {
  const Taken taken(s, {"main", "b", "c", "d"});
  std::map<std::string, Tokens> h;
  Append(s, h, "main", 16, "prefill of 16 (a)");
  Fork(s, h, "main", "b", "b, a fork of a at 16");
  Truncate(s, h, "main", 5, "a truncated to 5");
  if (taken.Has("c")) {
    s.Add(Step::NewConversation("c"), "a new session");
    Append(s, h, "c", 6, "prefill of 6 (c)");
  }
  Truncate(s, h, "b", 9, "b truncated to 9");
  if (taken.Has("d")) Fork(s, h, "c", "d", "d, a fork of c at 6");
  if (taken.Has("c")) Truncate(s, h, "c", 2, "c truncated to 2");
  if (taken.Has("d")) Append(s, h, "d", 3, "d +3");
  Fork(s, h, "b", "freed", "a fork of b, freed at once");
  Append(s, h, "freed", 4, "the fork of b +4");
  s.Add(Step::End("freed"), "the fork of b freed");
  const std::vector<Part> one = taken.Of({{"main", s.RandomTokens(7)},
                                          {"b", s.RandomTokens(4), BatchLogits::kLast},
                                          {"c", s.RandomTokens(1)},
                                          {"d", s.RandomTokens(2), BatchLogits::kNone}});
  BatchThenAlone(s, h, one, fmt::format("batch 1 ({})", Describe(one)));
  std::vector<Part> decode;
  for (const char* name : {"d", "c", "b", "main"}) decode.push_back({name, s.RandomTokens(1)});
  BatchThenAlone(s, h, taken.Of(decode), "batch 2 (a decode step of each)");
  const Played played = s.Play();
  return played.Figures() + "; against the items alone " + played.SameRowsFigure() +
         "; after 2 forks, 3 truncates and a freed session" + taken.Note();
}

// What engine.h's append_batch refuses before anything runs: the call fails as a whole, so every
// session named keeps its length and its cache (the next append of each is still right).
std::string CheckBatchRefusals(Script& s) {
  s.Add(Step::NewConversation("b"), "a new session");
  s.Append("main", s.RandomTokens(4), "prefill of 4 (a)");
  s.Append("b", s.RandomTokens(3), "prefill of 3 (b)");
  const auto refuse =
      [&s](const std::string& what,
           std::function<std::vector<BatchItem>(BackendSession*, BackendSession*)> items) {
        s.Refuse(what,
                 [items](const Backend& engine, const std::vector<BackendSession*>& sessions) {
                   engine.AppendBatch(items(sessions.at(0), sessions.at(1)));
                 });
        s.Append("main", s.RandomTokens(2), what + ", then an append (a)");
        s.Append("b", s.RandomTokens(2), what + ", then an append (b)");
      };
  // The refusal the engine itself makes (a token it cannot embed, in the second item) last, so
  // the report quotes the engine.
  refuse("a batch of no items",
         [](BackendSession*, BackendSession*) { return std::vector<BatchItem>{}; });
  refuse("a batch naming a session twice", [](BackendSession* a, BackendSession* b) {
    return std::vector<BatchItem>{{a, {1}, {}}, {b, {2}, {}}, {a, {3}, {}}};
  });
  refuse("a batch with an empty item", [](BackendSession* a, BackendSession* b) {
    return std::vector<BatchItem>{{a, {1, 2}, {}}, {b, {}, {}}};
  });
  const Token vocab = static_cast<Token>(s.vocab());
  refuse(fmt::format("a batch whose second item holds token {} (vocab_size {})", vocab, vocab),
         [vocab](BackendSession* a, BackendSession* b) {
           return std::vector<BatchItem>{{a, {1, 2}, {}}, {b, {3, vocab}, {}}};
         });
  const Played played = s.Play();
  return fmt::format("{} batches {}", played.refusals.size(), played.Refused());
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
