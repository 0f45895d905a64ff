#include "harness/campaign/case_generator.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "format/error.h"
#include "harness/campaign/case_rng.h"
#include "harness/campaign/follow_up.h"
#include "harness/campaign/shift_episode.h"
#include "harness/scenario/conversations.h"

namespace kvdiff::harness {
namespace {

using Rng = CaseRng;

// Conversations alive at once: enough for batches of up to kMaxBatch items.
constexpr int64_t kMaxConversations = 8;  // at most; GenerationOptions::max_sessions may lower it
constexpr int64_t kMaxBatch = 8;

// How a case draws its sizes. A short case: uniform, small (today's generator, unchanged). A long
// case: half the draws land on a boundary or a neighbour of one, the rest are uniform.
class Sizes {
 public:
  Sizes(Rng& rng, const std::vector<Boundary>& boundaries, bool long_case)
      : rng_(rng), long_(long_case) {
    for (const Boundary& b : boundaries) sizes_.push_back(b.size);
  }
  bool Long() const { return long_; }
  // A size in [1, room]; short cases cap it at `short_cap`.
  int64_t Pick(int64_t room, int64_t short_cap) {
    if (!long_) return rng_.Between(1, std::min(room, short_cap));
    if (rng_.Chance(50)) {
      std::vector<int64_t> near;
      for (int64_t b : sizes_)
        for (int64_t d = -1; d <= 1; ++d)
          if (b + d >= 1 && b + d <= room) near.push_back(b + d);
      if (!near.empty()) return near[rng_.Below(static_cast<int64_t>(near.size()))];
    }
    if (rng_.Chance(15)) return room;  // the whole room: reaches the context's end
    return rng_.Between(1, room);
  }

 private:
  Rng& rng_;
  bool long_;
  std::vector<int64_t> sizes_;
};

// The backend that declares the smallest limit in `field` (the first on ties; 0 declares none),
// or null when none declares one.
const Backend* Tightest(const std::vector<const Backend*>& backends, int64_t BackendInfo::*field) {
  const Backend* out = nullptr;
  for (const Backend* b : backends) {
    const int64_t n = b->Info().*field;
    if (n > 0 && (out == nullptr || n < out->Info().*field)) out = b;
  }
  return out;
}
int64_t TightestLimit(const std::vector<const Backend*>& backends, int64_t BackendInfo::*field) {
  const Backend* b = Tightest(backends, field);
  return b == nullptr ? 0 : b->Info().*field;
}

// On a sliding-window model (window W), a size that takes a conversation at `length` to where
// a ring goes wrong: to W-1, W, W+1 (the ring filling, full, wrapped), 2W and 2W+1 (wrapped
// whole, once more), or a chunk of W+1 (more than the ring holds, in one call); 0 when none fits
// in [1, room] or the draw says not this time. Drawn from the window's own stream, so a model
// without a window draws nothing from it and its cases stay as they were.
int64_t WindowSize(Rng& rng, int64_t window, int64_t length, int64_t room) {
  if (window <= 0 || !rng.Chance(40)) return 0;
  std::vector<int64_t> fits;
  for (int64_t target : {window - 1, window, window + 1, 2 * window, 2 * window + 1}) {
    if (target - length >= 1 && target - length <= room) fits.push_back(target - length);
  }
  if (window + 1 <= room) fits.push_back(window + 1);
  if (fits.empty()) return 0;
  return fits[rng.Below(static_cast<int64_t>(fits.size()))];
}

}  // namespace

int64_t CampaignMaxLength(const format::LlamaConfig& config, int64_t max_length) {
  KVDIFF_CHECK(max_length >= 0,
               "--max-length: expected a length >= 0 (0: the model's context), got {}", max_length);
  if (max_length == 0) return config.max_position_embeddings;
  return std::min<int64_t>(max_length, config.max_position_embeddings);
}

int64_t CampaignMaxLength(const format::LlamaConfig& config, int64_t max_length,
                          const std::vector<const Backend*>& backends) {
  const int64_t out = CampaignMaxLength(config, max_length);
  const int64_t declared = TightestLimit(backends, &BackendInfo::max_length);
  return declared > 0 ? std::min(out, declared) : out;
}

namespace {

// Why the histories stop short of the model's context, or "".
std::string LengthLimit(const format::LlamaConfig& config, int64_t max_length,
                        const std::vector<const Backend*>& backends) {
  const int64_t context = config.max_position_embeddings;
  const int64_t reach = CampaignMaxLength(config, max_length, backends);
  if (reach >= context) return "";
  if (reach < CampaignMaxLength(config, max_length)) {
    return fmt::format("histories stop at {} of the model's {} positions: backend {} holds {}",
                       reach, context, Tightest(backends, &BackendInfo::max_length)->Name(), reach);
  }
  return fmt::format(
      "histories stop at {} of the model's {} positions: --max-length {} (--max-length 0 reaches "
      "them all)",
      reach, context, max_length);
}

}  // namespace

std::string CampaignReachLimit(const format::LlamaConfig& config, int64_t max_length,
                               const std::vector<const Backend*>& backends) {
  std::vector<std::string> limits;
  if (std::string length = LengthLimit(config, max_length, backends); !length.empty())
    limits.push_back(std::move(length));
  const int64_t sessions = CampaignMaxSessions(backends);
  if (sessions > 0 && sessions < kMaxCrowd) {
    const Backend* b = Tightest(backends, &BackendInfo::max_sessions);
    limits.push_back(fmt::format(
        "at most {} conversation{} alive at once of the {} drawn otherwise: backend {} holds {} "
        "(max_sessions){}",
        sessions, sessions == 1 ? "" : "s", kMaxCrowd, b->Name(), sessions,
        sessions == 1 ? ", so no fork, no second conversation and no batch of two" : ""));
  }
  const int64_t call_tokens = CampaignMaxCallTokens(backends);
  // A limit of a whole history or more leaves out nothing a single conversation would draw.
  if (call_tokens > 0 && call_tokens < CampaignMaxLength(config, max_length, backends)) {
    const Backend* b = Tightest(backends, &BackendInfo::max_batch_tokens);
    limits.push_back(
        fmt::format("calls of at most {} tokens: backend {} takes {} (max_batch_tokens)",
                    call_tokens, b->Name(), call_tokens));
  }
  return fmt::format("{}", fmt::join(limits, "; "));
}

std::vector<Boundary> CampaignBoundaries(const std::vector<const Backend*>& backends,
                                         int64_t max_length) {
  std::map<int64_t, std::string> by_size;
  for (int64_t p = 2; p < max_length; p *= 2) by_size[p];  // the context itself has no far side
  for (const Backend* b : backends) {
    for (int64_t size : b->Info().interesting_sizes) {
      if (size < 1 || size >= max_length) continue;
      std::string& who = by_size[size];
      if (who.find(b->Name()) == std::string::npos) who += (who.empty() ? "" : ",") + b->Name();
    }
  }
  std::vector<Boundary> out;
  for (const auto& [size, who] : by_size) out.push_back({size, who});
  return out;
}

int64_t CampaignMaxSessions(const std::vector<const Backend*>& backends) {
  return TightestLimit(backends, &BackendInfo::max_sessions);
}

int64_t CampaignMaxCallTokens(const std::vector<const Backend*>& backends) {
  return TightestLimit(backends, &BackendInfo::max_batch_tokens);
}

bool CampaignShifts(const std::vector<const Backend*>& backends) {
  return std::all_of(backends.begin(), backends.end(),
                     [](const Backend* b) { return b->Info().shifts; });
}

std::string CampaignShiftLimit(const std::vector<const Backend*>& backends, int64_t shift_percent) {
  for (const Backend* b : backends)
    if (!b->Info().shifts) return fmt::format("none drawn: backend {} does not shift", b->Name());
  if (shift_percent == 0) return "none drawn: --shift-percent 0";
  return "";
}

bool IsLongCase(uint64_t seed, int64_t k, double long_fraction, int64_t context) {
  if (context <= kShortCaseLength) return false;
  // A stream of its own, so the short cases are the same whatever the fraction.
  Rng rng(CaseStream(seed, k) ^ 0x4C4F4E4743415345ull);
  return static_cast<double>(rng.Next() >> 11) * 0x1.0p-53 < long_fraction;
}

int64_t DeepCaseStart(uint64_t seed, int64_t k, double deep_fraction, double long_fraction,
                      int64_t context) {
  const int64_t deepest = std::min(3 * kDeepPosition, context - kShortCaseLength);
  if (deepest <= kDeepPosition || IsLongCase(seed, k, long_fraction, context)) return 0;
  // A stream of its own, so the other cases are the same whatever the fraction.
  Rng rng(CaseStream(seed, k) ^ 0x4445455043415345ull);
  if (static_cast<double>(rng.Next() >> 11) * 0x1.0p-53 >= deep_fraction) return 0;
  return rng.Between(kDeepPosition + 1, deepest);
}

Scenario GenerateCase(const format::LlamaConfig& config, const ModelSpec& model, uint64_t seed,
                      int64_t k, const GenerationOptions& options) {
  KVDIFF_CHECK(options.long_fraction >= 0 && options.long_fraction <= 1,
               "--long-fraction: expected a fraction in [0, 1], got {}", options.long_fraction);
  KVDIFF_CHECK(options.deep_fraction >= 0 && options.deep_fraction <= 1,
               "--deep-fraction: expected a fraction in [0, 1], got {}", options.deep_fraction);
  Rng rng(CaseStream(seed, k));
  const int64_t context = CampaignMaxLength(config, options.max_length);
  const bool long_case = IsLongCase(seed, k, options.long_fraction, context);
  const int64_t deep_start =
      DeepCaseStart(seed, k, options.deep_fraction, options.long_fraction, context);
  Sizes sizes(rng, options.boundaries, long_case);
  Scenario sc;
  sc.name = fmt::format("case-{}", k);
  sc.description = fmt::format("kvdiff check --seed {}: case {}{}", seed, k,
                               long_case        ? " (long)"
                               : deep_start > 0 ? fmt::format(" (deep: from {})", deep_start)
                                                : std::string());
  sc.model = model;
  // A long case aims at a length of its own: a boundary's neighbourhood, the full context, or
  // anything between; its sizes are drawn within that. A deep one is a short case on top of its
  // first prompt.
  int64_t max_len = long_case
                        ? std::max<int64_t>(kShortCaseLength + 1, sizes.Pick(context, context))
                        : std::min<int64_t>(deep_start + kShortCaseLength, context);
  // A tier that wants its long cases longer (min_long_target) redraws a target short of it.
  if (long_case && max_len < options.min_long_target)
    max_len = rng.Between(std::min(options.min_long_target, context), context);
  Conversations convs;
  int64_t next_name = 1;
  auto emit = [&](const Step& s) {
    convs.Apply(s);
    sc.steps.push_back(s);
  };

  auto random_tokens = [&](int64_t n) {
    Tokens t(n);
    for (auto& x : t) x = static_cast<Token>(rng.Below(config.vocab_size));
    return t;
  };
  // Chunk sizes summing to n: a random split into 1..4 pieces (cut points drawn without
  // repeats), or (long cases) the whole prompt in one call, or one boundary-sized chunk
  // repeated, the rest in the last.
  auto split = [&](int64_t n) {
    std::vector<int64_t> chunks;
    if (sizes.Long() && rng.Chance(30)) return chunks;  // the whole prompt in one call
    if (sizes.Long() && n > 1 && rng.Chance(55)) {
      const int64_t size = sizes.Pick(n, n);
      for (int64_t left = n; left > 0; left -= size) chunks.push_back(std::min(size, left));
      return chunks.size() > 1 ? chunks : std::vector<int64_t>{};
    }
    const int64_t pieces = rng.Between(1, std::min<int64_t>(n, 4));
    if (pieces > 1) {
      std::vector<int64_t> cuts;
      while (static_cast<int64_t>(cuts.size()) < pieces - 1) {
        const int64_t cut = rng.Between(1, n - 1);
        if (std::find(cuts.begin(), cuts.end(), cut) == cuts.end()) cuts.push_back(cut);
      }
      std::sort(cuts.begin(), cuts.end());
      int64_t prev = 0;
      for (int64_t cut : cuts) {
        chunks.push_back(cut - prev);
        prev = cut;
      }
      chunks.push_back(n - prev);
    }
    return chunks;
  };
  // Chunks no larger than a call the backends take (options.max_call_tokens), cut from `chunks`
  // (empty: the whole prompt of n in one call).
  const int64_t call_cap = options.max_call_tokens;
  auto fit_calls = [&](std::vector<int64_t> chunks, int64_t n) {
    if (call_cap <= 0) return chunks;
    if (chunks.empty()) chunks = {n};
    std::vector<int64_t> out;
    for (int64_t c : chunks)
      for (; c > 0; c -= call_cap) out.push_back(std::min(c, call_cap));
    return out.size() > 1 ? out : std::vector<int64_t>{};
  };
  // A sliding window's draws (WindowSize), from a stream of their own.
  Rng window_rng(CaseStream(seed, k) ^ 0x57494E444F57ull);
  const int64_t window = config.sliding_window;
  auto window_size = [&](const std::string& name) {
    const int64_t length = convs.At(name).length;
    return WindowSize(window_rng, window, length, max_len - length);
  };
  auto prefill = [&](const std::string& name, int64_t tokens = 0) {
    Step s;
    s.op = Op::kPrefill;
    s.conversation = name;
    const int64_t toward_window = tokens > 0 ? 0 : window_size(name);
    const int64_t n = tokens > 0          ? tokens
                      : toward_window > 0 ? toward_window
                                          : sizes.Pick(max_len - convs.At(name).length, 12);
    s.tokens = random_tokens(n);
    s.chunks = fit_calls(split(n), n);
    emit(s);
  };
  // A conversation drawn from those `pred` accepts, in creation order; "" when none is.
  auto pick = [&](auto pred) -> std::string {
    std::vector<std::string> ok;
    for (const std::string& name : convs.Names())
      if (pred(convs.At(name))) ok.push_back(name);
    return ok.empty() ? "" : ok[rng.Below(static_cast<int64_t>(ok.size()))];
  };
  auto any = [&]() -> const std::string& {
    return convs.Names()[rng.Below(static_cast<int64_t>(convs.Names().size()))];
  };

  const int64_t max_conversations = options.max_sessions > 0
                                        ? std::min(kMaxConversations, options.max_sessions)
                                        : kMaxConversations;
  // A fork's source: in a deep case, mostly its deepest conversation (a long history is what a
  // fork must copy whole); any conversation otherwise.
  auto fork_source = [&]() -> std::string {
    if (deep_start == 0 || !rng.Chance(75)) return any();
    std::string deepest = convs.Names().front();
    for (const std::string& name : convs.Names())
      if (convs.At(name).length > convs.At(deepest).length) deepest = name;
    return deepest;
  };
  auto new_name = [&] { return fmt::format("c{}", next_name++); };
  auto live = [&] { return static_cast<int64_t>(convs.Names().size()); };

  // A serving engine's call: 2..8 conversations in one batch step, some of them joining just
  // before (a new request, or a fork: a twin whose history equals its source's), each fed a
  // prompt chunk or one greedy token, with logits for all, the last or none of its rows; then
  // now and then a few decode rounds of the same conversations (continuous batching) and one of
  // them ending (its cells freed for the next).
  auto batch = [&] {
    const int64_t size = rng.Between(2, kMaxBatch);
    while (live() < size && live() < max_conversations) {
      const std::string name = new_name();
      if (rng.Chance(50)) {
        emit(Step::Fork(fork_source(), name));
      } else {
        emit(Step::NewConversation(name));
      }
    }
    std::vector<std::string> names;
    for (const std::string& name : convs.Names())
      if (convs.At(name).length < max_len) names.push_back(name);
    for (size_t i = names.size(); i > 1; --i)
      std::swap(names[i - 1], names[rng.Below(static_cast<int64_t>(i))]);
    if (static_cast<int64_t>(names.size()) > size) names.resize(size);
    if (names.empty()) return;
    std::vector<BatchEntry> items;
    for (const std::string& name : names) {
      const ConversationState& c = convs.At(name);
      BatchEntry item;
      item.conversation = name;
      item.decode = c.has_last_row && rng.Chance(50);
      if (!item.decode) item.tokens = random_tokens(sizes.Pick(max_len - c.length, 12));
      const int64_t roll = rng.Below(100);
      item.logits = roll < 60
                        ? BatchLogits::kAll
                        : (roll < 90 || item.decode ? BatchLogits::kLast : BatchLogits::kNone);
      items.push_back(std::move(item));
    }
    FitBatch(items, call_cap);
    emit(Step::Batch(std::move(items)));
    const int64_t rounds = rng.Chance(50) ? rng.Between(1, 4) : 0;
    for (int64_t r = 0; r < rounds; ++r) {
      std::vector<BatchEntry> decodes;
      for (const std::string& name : names) {
        if (!convs.Exists(name)) continue;
        const ConversationState& c = convs.At(name);
        if (c.has_last_row && c.length < max_len) decodes.push_back({name, {}, true});
      }
      FitBatch(decodes, call_cap);
      if (decodes.empty()) break;
      emit(Step::Batch(std::move(decodes)));
    }
    if (live() > 1 && rng.Chance(30)) emit(Step::End(any()));
  };

  prefill("main", deep_start);
  Rng shift_rng(ShiftStream(seed, k));
  const int64_t n_steps = long_case ? rng.Between(2, 6) : rng.Between(2, 10);
  for (int64_t i = 0; i < n_steps; ++i) {
    const int64_t roll = rng.Below(100);
    const bool can_add = live() < max_conversations;
    Step s;
    if (rng.Chance(options.batch_percent)) {
      batch();
    } else if (roll < 30) {  // prefill
      const std::string c = pick([&](const ConversationState& c) { return c.length < max_len; });
      if (!c.empty()) prefill(c);
    } else if (roll < 60) {  // decode
      const std::string c =
          pick([&](const ConversationState& c) { return c.has_last_row && c.length < max_len; });
      if (!c.empty()) {
        s.op = Op::kDecode;
        s.conversation = c;
        const int64_t toward_window = window_size(c);
        s.n = toward_window > 0 ? toward_window : sizes.Pick(max_len - convs.At(c).length, 8);
        if (options.max_decode > 0) s.n = std::min(s.n, options.max_decode);
        emit(s);
      }
    } else if (roll < 72) {  // truncate (to the same length now and then: keeps the last row)
      const std::string c = pick([](const ConversationState& c) { return c.length > 0; });
      if (!c.empty()) {
        const int64_t length = convs.At(c).length;
        s.op = Op::kTruncate;
        s.conversation = c;
        if (rng.Chance(10)) {
          s.length = length;
        } else {
          s.length = sizes.Long() ? sizes.Pick(length, length) - 1 : rng.Below(length);
        }
        // Once a window has dropped positions, only a truncate back to its furthest length minus
        // one is possible (ShortestTruncate): a drawn length below is moved to one that is.
        const int64_t shortest = ShortestTruncate(convs.At(c), window);
        if (s.length < shortest) s.length = window_rng.Between(shortest, length);
        emit(s);
      }
    } else if (roll < 84) {  // fork
      if (can_add) {
        s.op = Op::kFork;
        s.from = fork_source();
        s.to = s.conversation = new_name();
        emit(s);
      }
    } else if (roll < 92) {  // new conversation, started with a prefill
      if (can_add) {
        s.op = Op::kNewConversation;
        s.name = s.conversation = new_name();
        emit(s);
        prefill(s.name);
      }
    } else {  // reset, then a new prompt
      s.op = Op::kReset;
      s.conversation = any();
      emit(s);
      prefill(s.conversation);
    }
    // Now and then a context shift (harness/campaign/shift_episode.h), from a stream of its own.
    // (None on a sliding-window model: its conversations do not shift.)
    if (options.shifts && !config.Windowed() &&
        shift_rng.Chance(static_cast<int>(options.shift_percent))) {
      const std::string fork_name = fmt::format("c{}", next_name);
      const ShiftEpisodeLimits limits{max_len, config.vocab_size, call_cap,
                                      live() < max_conversations ? fork_name : std::string()};
      for (const Step& step : DrawShiftEpisode(shift_rng, convs, limits)) {
        if (step.op == Op::kFork) ++next_name;
        emit(step);
      }
    }
  }
  // A long case ends with a decode to its target on its longest conversation: decoding is where
  // a cache is read past everything the prompt wrote. With decodes capped (max_decode), a prompt
  // brings it within max_decode of the target first, so any conversation can be the one.
  if (long_case) {
    const bool capped = options.max_decode > 0;
    std::string longest;
    for (const std::string& name : convs.Names()) {
      const ConversationState& c = convs.At(name);
      if ((c.has_last_row || capped) && c.length < max_len &&
          (longest.empty() || c.length > convs.At(longest).length))
        longest = name;
    }
    if (!longest.empty()) {
      const ConversationState& c = convs.At(longest);
      const int64_t room = max_len - c.length;
      const int64_t prompt =
          capped ? std::max(room - options.max_decode, c.has_last_row ? int64_t{0} : 1) : 0;
      if (prompt > 0) prefill(longest, prompt);
      if (room > prompt) emit(Step::Decode(longest, room - prompt));
    }
  }
  // The follow-ups (harness/campaign/follow_up.h), from a stream of their own, after every step
  // above: those are the steps the case drew before follow-ups existed.
  if (options.follow_ups) {
    Rng follow_rng(FollowUpStream(seed, k));
    FollowUpLimits limits;
    limits.context = context;
    limits.vocab = config.vocab_size;
    limits.max_call_tokens = call_cap;
    limits.max_sessions = options.max_sessions;
    limits.window = window;
    limits.shifts = options.shifts && !config.Windowed() && options.shift_percent > 0;
    limits.batches = options.batch_percent > 0;
    for (const Step& step : DrawFollowUps(follow_rng, convs, limits, long_case, next_name))
      emit(step);
  }
  return sc;
}

}  // namespace kvdiff::harness
