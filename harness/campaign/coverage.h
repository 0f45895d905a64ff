// What a campaign exercised, as a fuzzer's coverage line is to a fuzzer: the lengths, forward-call
// (chunk) sizes, op kinds and op bigrams, conversation counts and model shapes of its cases, and
// for every boundary whether the campaign reached it from both sides.
//
// Every field is a count (or a maximum), so the coverage of shards adds up: Merge() of the shards'
// coverage is the coverage of the whole campaign. The JSON form is documented in
// docs/campaigns.md ("Coverage").
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "format/model_files.h"
#include "harness/campaign/case_generator.h"
#include "harness/scenario/conversations.h"
#include "harness/scenario/scenario.h"

namespace kvdiff::harness {

// Past it a conversation is far: the coverage counts its forks, truncates, batch items and ends.
inline constexpr int64_t kFarPosition = 256;

// For one boundary b: forward calls of b-1 or b tokens ("at") and of more than b ("over"), and
// rows written at positions b-1 ("at") and b or beyond ("over") — a history that crossed it. A
// batch step is one call of all its items' tokens (what a micro-batch size n_ubatch splits).
struct BoundaryCoverage {
  int64_t size = 0;
  std::string declared_by;  // empty: a power of two
  int64_t calls_at = 0, calls_over = 0;
  int64_t rows_at = 0, rows_over = 0;
};

struct Coverage {
  int64_t cases = 0, long_cases = 0;
  int64_t context = 0;           // the campaign's longest allowed history
  std::string reach_limit;       // why the campaign stops short of the model or the generator: its
                                 // context, sessions or call size (CampaignReachLimit), or ""
  std::string shift_limit;       // why no shift episode was drawn (CampaignShiftLimit), or ""
  int64_t longest = 0;           // the longest history any case reached
  int64_t cases_at_context = 0;  // cases that reached `context` (or their own, case_context)
  // Histograms keyed by the lower end of a power-of-two bucket [2^i, 2^(i+1)): 1, 2, 4, 8...
  std::map<int64_t, int64_t> lengths;        // per case, its longest history
  std::map<int64_t, int64_t> call_sizes;     // per forward call (a prefill chunk; decode: 1)
  std::map<int64_t, int64_t> conversations;  // per case, how many conversations it used
  std::map<std::string, int64_t> ops;        // "prefill", "decode", ... per step
  std::map<std::string, int64_t> bigrams;    // "fork>truncate": consecutive steps
  std::map<std::string, int64_t> shapes;     // DescribeModel of the case's model -> cases
  // Batch steps (a serving engine's calls): "calls"; "items N" per call of N items; "mix prefill",
  // "mix decode", "mix mixed" per call; "rows all|last|none" per item; "joined" per item whose
  // conversation was in no earlier batch of the case, or left it since; "left" per conversation
  // of a batch absent from the next one.
  std::map<std::string, int64_t> batches;
  // Shift steps: "steps"; "keep 0", "keep 1", "discard 0"; "nothing after keep" (keep + discard
  // = the length, discard >= 1); "twice before a call" (a shift moving keys right after another
  // of the same conversation); "of a fork" (of a conversation a fork made); "then decode" (a
  // decode right after the conversation's shift); "then truncate to keep" (a truncate to keep or
  // less right after, where the uncached oracle applies again).
  std::map<std::string, int64_t> shifts;
  // Forks, truncations, batch items and ends, each counted under "fork" and so on, and also under
  // "fork deep" and so on when its conversation held more than kDeepPosition positions, and
  // "fork far" and so on when more than kFarPosition (where tables, blocks and pages of 256 end).
  std::map<std::string, int64_t> deep;
  // A sliding-window model's cases (window W): "cases"; "crossed" per case that wrote a position
  // at W or beyond (its ring wrapped, its window dropped positions); "twice" per case that wrote
  // one at 2W or beyond; per call, "ends at W-1..W+1" (its last position W-2..W), "over W" (a
  // chunk of more than W tokens), "after a drop" (starting at W or beyond: appending to a wrapped
  // ring); per truncate or fork of a conversation past W, "truncate after a drop", "fork after a
  // drop".
  std::map<std::string, int64_t> windows;
  std::vector<BoundaryCoverage> boundaries;  // ascending by size

  // Counts the scenario's steps (it must be valid for its model). case_context: the longest
  // history this case may reach, when it has a context of its own (--shapes random); 0: `context`.
  // window: the model's sliding window (0: none; then nothing is counted under `windows`).
  void Add(const Scenario& scenario, const std::string& shape, bool long_case,
           int64_t case_context = 0, int64_t window = 0);
  void Merge(const Coverage& other);
  // Declared boundaries the campaign never crossed, one line each ("" when all were).
  std::vector<std::string> Warnings() const;
  std::string Text() const;  // the report's coverage lines for the terminal
  nlohmann::json ToJson() const;
  // The inverse of ToJson (a shard report's "coverage", for `kvdiff merge`); InputError naming
  // `where` and the field when it is not of that form.
  static Coverage FromJson(const nlohmann::json& j, const std::string& where);

 private:
  void AddBatch(const Step& step, std::set<std::string>& in_last_batch);
  void AddDepth(const Step& step, const Conversations& convs);  // before the step is applied
  // before the step is applied; `last`: the step before it, or null
  void AddShift(const Step& step, const Step* last, const Conversations& convs,
                const std::set<std::string>& forked);
  std::string BatchText() const;
  std::string ShiftText() const;
  std::string WindowText() const;
  std::string DeepText() const;
};

// A histogram bucket's name, as the JSON report keys it: "1", "2-3", "4-7" (from its lower end).
std::string BucketName(int64_t lo);

Coverage NewCoverage(const std::vector<Boundary>& boundaries, int64_t context);

}  // namespace kvdiff::harness
