// The campaign's case generator: random scenarios whose lengths concentrate where KV-cache code
// changes path. Most cases stay short (at most kShortCaseLength positions, cheap); a fraction
// (GenerationOptions::long_fraction) goes long, up to the model's full context, drawing its
// prompt, chunk, decode and truncation sizes around the boundaries: powers of two and the sizes
// the backends declare (BackendInfo::interesting_sizes), each with its neighbours b-1, b, b+1.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "format/model_files.h"
#include "harness/backend/backend.h"
#include "harness/scenario/scenario.h"

namespace kvdiff::harness {

// The longest history a short case reaches: long enough for several chunks and a decode run,
// short enough that a case takes milliseconds on the tiny model.
inline constexpr int64_t kShortCaseLength = 48;
inline constexpr double kDefaultLongFraction = 0.1;
// Where a conversation counts as deep: past the first positions, where serving engines' forks,
// truncations and batches of long conversations go wrong (a cell index past a block, a copy of
// the first block only). A deep case (GenerationOptions::deep_fraction) starts its main
// conversation with a prompt of kDeepPosition + 1 to 3 x kDeepPosition tokens, then runs the
// ordinary short steps on top of it, forking mostly its deepest conversation, so its forks,
// truncations and batches act there.
inline constexpr int64_t kDeepPosition = 64;
inline constexpr double kDefaultDeepFraction = 0.3;
// The longest history of the default campaign: the full context of the tiny preset and of
// stories260K (512 positions), the first 1024 positions of larger models. Float32-angle backends
// (ref, llama.cpp) drift from the exact RoPE angles past the flat 1e-4 gate there and are held to
// the measured rope-f32 profile (tolerance_profile.h), measured up to 1024 positions; --max-length
// 0 reaches any model's full context.
inline constexpr int64_t kDefaultMaxLength = 1024;

// A size where some backend changes path, and who said so ("" for a power of two).
struct Boundary {
  int64_t size = 0;
  std::string declared_by;  // "impl", "impl,llama.cpp"; empty: a power of two nobody declared
};

inline constexpr int64_t kDefaultBatchPercent = 20;
// The chance, in percent, that a step of a case is followed by a shift episode
// (harness/campaign/shift_episode.h), when every backend shifts.
inline constexpr int64_t kDefaultShiftPercent = 25;

struct GenerationOptions {
  // The longest history a case may reach (capped by the context); 0: max_position_embeddings.
  int64_t max_length = kDefaultMaxLength;
  double long_fraction = kDefaultLongFraction;  // the share of cases that go long
  double deep_fraction = kDefaultDeepFraction;  // of the others, the share that start deep
  std::vector<Boundary> boundaries;             // from CampaignBoundaries
  // The chance, in percent, that a step of a case is a batch (a serving engine's call, with the
  // conversations joining and leaving around it); 0 draws none.
  int64_t batch_percent = kDefaultBatchPercent;
  // The fewest sessions any backend holds at once (BackendInfo::max_sessions; 0: no limit): no
  // case keeps more conversations alive. CampaignMaxSessions gives it.
  int64_t max_sessions = 0;
  // The fewest tokens any backend takes in one call (BackendInfo::max_batch_tokens; 0: no
  // limit): no prefill chunk and no batch step is larger. CampaignMaxCallTokens gives it.
  int64_t max_call_tokens = 0;
  // Whether every backend shifts (BackendInfo::shifts): only then do cases draw shift episodes
  // (harness/campaign/shift_episode.h). CampaignShifts gives it.
  bool shifts = false;
  // The most tokens a decode step decodes (0: no limit); a long case then reaches its target with
  // a prompt before its last decode. The long tier (check --long) sets it: a decode is a call per
  // token, and thousands of them at 32768 positions would take the campaign's time from the
  // positions it is there to reach.
  int64_t max_decode = 0;
  // The shortest target a long case draws (0: kShortCaseLength + 1); a shorter draw is redrawn
  // uniformly between it and the context. The long tier sets half its smallest context, so that
  // its cases are spent where its contexts are long.
  int64_t min_long_target = 0;
  // The chance, in percent, that a step of a case is followed by a shift episode when `shifts`;
  // 0 draws none (check --shift-percent).
  int64_t shift_percent = kDefaultShiftPercent;
  // Whether a case ends with its follow-ups (harness/campaign/follow_up.h): calls right after a
  // reset or a shift, a long case's tour of its depth, a crowd of more than eight conversations.
  bool follow_ups = true;
};

// The smallest max_sessions the backends declare (0 when none declares one).
int64_t CampaignMaxSessions(const std::vector<const Backend*>& backends);
// The smallest max_batch_tokens the backends declare (0 when none declares one).
int64_t CampaignMaxCallTokens(const std::vector<const Backend*>& backends);
// Whether every backend shifts a conversation's positions (BackendInfo::shifts).
bool CampaignShifts(const std::vector<const Backend*>& backends);
// Empty when the campaign draws shift episodes; else why it draws none, for the coverage's
// `shifts:` line: "none drawn: backend plugin:... does not shift" or "none drawn:
// --shift-percent 0".
std::string CampaignShiftLimit(const std::vector<const Backend*>& backends, int64_t shift_percent);

// The longest history of the campaign: options.max_length (InputError naming --max-length when
// it is < 1), capped by the model's context.
int64_t CampaignMaxLength(const format::LlamaConfig& config, int64_t max_length);
// The same, also capped by the smallest max_length the backends declare: a campaign never asks a
// backend for more positions than it says it holds.
int64_t CampaignMaxLength(const format::LlamaConfig& config, int64_t max_length,
                          const std::vector<const Backend*>& backends);

// Empty when the campaign may reach what the model allows; else, joined by "; ", why it stops
// short, naming what to change: "histories stop at 1024 of the model's 8192 positions:
// --max-length 1024 (--max-length 0 reaches them all)", or the backend that holds fewer
// positions; the backend that holds fewer conversations alive than the generator draws; the
// backend that takes fewer tokens a call.
std::string CampaignReachLimit(const format::LlamaConfig& config, int64_t max_length,
                               const std::vector<const Backend*>& backends);

// Powers of two from 2 below max_length, and every size a backend declares below max_length,
// ascending, each once (a declared power of two names who declared it).
std::vector<Boundary> CampaignBoundaries(const std::vector<const Backend*>& backends,
                                         int64_t max_length);

// Whether case k of the campaign seeded `seed` is a long one: a function of (seed, k) and the
// fraction alone, so the short cases stay the same whatever the fraction. No case is long when
// the context (CampaignMaxLength) is no longer than a short case.
bool IsLongCase(uint64_t seed, int64_t k, double long_fraction, int64_t context);

// How deep case k's main conversation starts (kDeepPosition + 1 and up), or 0 when the case is
// not a deep one: a long case never is, nor any case when the context cannot hold kDeepPosition
// + 1 positions and a short case on top. A function of (seed, k), the fraction and the context.
int64_t DeepCaseStart(uint64_t seed, int64_t k, double deep_fraction, double long_fraction,
                      int64_t context);

// A random scenario (prompts, chunk splits, decode lengths, resets, truncations, forks, several
// conversations) for `config`, a function of (seed, k, options) alone. Uses kvdiff's own PRNG, so
// the same case is generated on every platform. model is recorded in the scenario for replays.
// InputError naming --long-fraction or --deep-fraction when it is not in [0, 1].
Scenario GenerateCase(const format::LlamaConfig& config, const ModelSpec& model, uint64_t seed,
                      int64_t k, const GenerationOptions& options = {});

}  // namespace kvdiff::harness
