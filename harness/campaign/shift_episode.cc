#include "harness/campaign/shift_episode.h"

#include <algorithm>

namespace kvdiff::harness {
namespace {

// Steps of an episode, the conversations moved on with each.
class Episode {
 public:
  Episode(CaseRng& rng, const Conversations& convs, const ShiftEpisodeLimits& limits)
      : rng_(rng), convs_(convs), limits_(limits) {}

  std::vector<Step> Take() { return std::move(steps_); }
  const ConversationState& At(const std::string& name) const { return convs_.At(name); }
  void Emit(const Step& s) {
    convs_.Apply(s);
    steps_.push_back(s);
  }

  // keep: 0, 1, a few, around the length, or anything up to it.
  int64_t DrawKeep(int64_t length) {
    int64_t keep = 0;
    switch (rng_.Below(6)) {
      case 0:
        keep = 0;
        break;
      case 1:
        keep = 1;
        break;
      case 2:
        keep = rng_.Between(2, 4);
        break;
      case 3:
        keep = length - rng_.Between(0, 2);
        break;
      case 4:
        keep = length / 2;
        break;
      default:
        keep = rng_.Between(0, length);
    }
    return std::clamp<int64_t>(keep, 0, length);
  }
  // discard in [1, room] (room = length - keep >= 1): one, all of it (nothing left after keep),
  // all but one, or anything between.
  int64_t DrawDiscard(int64_t room) {
    switch (rng_.Below(4)) {
      case 0:
        return 1;
      case 1:
        return room;
      case 2:
        return std::max<int64_t>(1, room - 1);
      default:
        return rng_.Between(1, room);
    }
  }
  // A shift of `name`, returned; `moving`: one that moves keys (keep + discard < length), when
  // the length allows one.
  Step Shift(const std::string& name, bool moving) {
    const int64_t length = At(name).length;
    if (moving && length >= 2) {
      const int64_t keep = std::min(DrawKeep(length), length - 2);
      const int64_t discard = std::min(DrawDiscard(length - keep), length - keep - 1);
      Emit(Step::Shift(name, keep, discard));
      return steps_.back();
    }
    const int64_t keep = DrawKeep(length);
    const int64_t room = length - keep;
    const int64_t discard = room == 0 || rng_.Chance(8) ? 0 : DrawDiscard(room);
    Emit(Step::Shift(name, keep, discard));
    return steps_.back();
  }
  // What reads the shifted cache: a decode right after when the last row survived, else (or as
  // well, now and then) a short prompt.
  void Continue(const std::string& name) {
    const ConversationState& c = At(name);
    const int64_t room = limits_.max_length - c.length;
    if (room <= 0) return;
    const bool decode = c.has_last_row && rng_.Chance(75);
    if (decode) Emit(Step::Decode(name, rng_.Between(1, std::min<int64_t>(room, 4))));
    if (!decode || rng_.Chance(25)) Prompt(name);
  }
  void Prompt(const std::string& name) {
    int64_t cap = std::min<int64_t>(limits_.max_length - At(name).length, 6);
    if (limits_.max_call_tokens > 0) cap = std::min(cap, limits_.max_call_tokens);
    if (cap <= 0) return;
    Tokens tokens(rng_.Between(1, cap));
    for (Token& t : tokens) t = static_cast<Token>(rng_.Below(limits_.vocab));
    Emit(Step::Prefill(name, std::move(tokens)));
  }

 private:
  CaseRng& rng_;
  Conversations convs_;
  const ShiftEpisodeLimits& limits_;
  std::vector<Step> steps_;
};

}  // namespace

std::vector<Step> DrawShiftEpisode(CaseRng& rng, const Conversations& convs,
                                   const ShiftEpisodeLimits& limits) {
  std::vector<std::string> names;
  for (const std::string& name : convs.Names())
    if (convs.At(name).length > 0) names.push_back(name);
  if (names.empty()) return {};
  Episode e(rng, convs, limits);
  std::string name = names[rng.Below(static_cast<int64_t>(names.size()))];
  const int64_t kind = rng.Below(100);
  if (kind < 30) {  // one shift
    e.Shift(name, false);
  } else if (kind < 55) {  // two shifts in a row, both moving keys when they can
    e.Shift(name, true);
    e.Shift(name, true);
  } else if (kind < 75) {  // a shift that moves keys, then one that leaves nothing after keep
    const Step first = e.Shift(name, true);
    const int64_t length = e.At(name).length;
    if (length >= 1) {
      // keep past the first shift's, so keys it moved stay, and discard >= 1.
      const int64_t keep =
          length >= 2 ? rng.Between(std::min(first.keep + 1, length - 1), length - 1) : 0;
      e.Emit(Step::Shift(name, keep, length - keep));
    }
  } else if (kind < 88 && !limits.fork_name.empty()) {  // a fork, then a shift of one of the two
    e.Emit(Step::Fork(name, limits.fork_name));
    const std::string source = name;
    const bool shift_the_fork = rng.Chance(70);
    name = shift_the_fork ? limits.fork_name : source;
    e.Shift(name, true);
    e.Continue(shift_the_fork ? source : limits.fork_name);  // the other one goes on too
  } else {  // a shift, then a truncate to keep or less: the original's first tokens again
    const int64_t length = e.At(name).length;
    const int64_t keep = e.DrawKeep(length);
    const int64_t discard = keep < length ? e.DrawDiscard(length - keep) : 0;
    e.Emit(Step::Shift(name, keep, discard));
    e.Emit(Step::Truncate(name, rng.Chance(50) ? keep : rng.Between(0, keep)));
  }
  e.Continue(name);
  return e.Take();
}

}  // namespace kvdiff::harness
