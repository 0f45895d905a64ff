// The one replay: a scenario's steps on one backend, through the scenario's driver, every logits
// row kept. `run`, `check`, `golden regen/verify`, `repro`, `conform` and `--localize` all replay
// this way; the oracle check (oracle_check.h) and the cross-backend comparison are passes over
// recordings, which read them and leave them as replayed.
//
// After an error a scenario goes on as a program would: the step that threw stops its
// conversation (later steps on it, and forks of it, are skipped and say why), and the other
// conversations go on. A row with a NaN or inf logit is such an error ("non-finite logits: ...").
// A backend that outlasted its time-out (EngineHungError) is the exception: every later step of
// the scenario is skipped (Recording::hung_at).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "format/tensor.h"
#include "harness/backend/backend.h"
#include "harness/compare/compare.h"
#include "harness/scenario/scenario.h"

namespace kvdiff::harness {

struct RecordedRow {
  int64_t step = 0, row = 0;          // the step's index; the row's index within the step
  int64_t call = 0, row_in_call = 0;  // which forward call of the step, and the row within it
  std::string conversation;
  int64_t position = 0;
  Token token = 0;         // the token fed at this position
  int64_t chosen_by = -1;  // decode rows: the index (into Recording::rows) of the row whose
                           // argmax chose `token`; -1 when the scenario gave it
  int64_t history = 0;     // Recording::histories[history][0..position] is this row's history
  // Appended to a conversation after a shift (or to a fork of one, until a reset or a truncate
  // to the shift's keep or less, which leaves the original history's first tokens): its cached
  // keys were computed with tokens in view that its history no longer holds, so no uncached
  // forward is its oracle; it is compared across backends only (ref64 the arbiter).
  bool after_shift = false;
  // The position a float32-angle backend's RoPE error in this row is that of (the rope-f32
  // profile's allowance is taken there, tolerance_profile.h): the row's own position, or after a
  // shift, further: its moved keys were rotated at their first positions and then turned back by
  // each discard, in float32 too, so their error is that of keys at the first position plus the
  // discards (measured: a key moved from 952 to 1 put ref 1.1e-4 off ref64 at position 1).
  int64_t rope_reach = 0;
  std::vector<float> logits;  // (vocab)
};

enum class StepStatus {
  kDone,     // ran (its rows may still disagree with the oracle, or the oracle fail on them)
  kError,    // the backend threw, or returned a wrong shape or non-finite logits
  kSkipped,  // its conversation had stopped at an earlier error
};

struct StepRecord {
  StepStatus status = StepStatus::kDone;
  std::string message;                  // the error, or why the step was skipped
  size_t rows_begin = 0, rows_end = 0;  // into Recording::rows
};

struct Recording {
  std::string backend;
  std::vector<StepRecord> steps;  // one per scenario step
  std::vector<RecordedRow> rows;
  // Token sequences that only ever grow: a conversation appends to its history in place until a
  // fork, truncate, reset or shift sends it to a new one, so each is a leaf of the conversation
  // tree. After a shift, a history holds the tokens the cache still holds, in their new order.
  std::vector<Tokens> histories;
  // The step at which the backend outlasted its time-out (EngineHungError): that step failed, and
  // the later ones were not run, since each would wait as long (or be refused at once).
  std::optional<size_t> hung_at;

  // The index of the first step that failed, if any.
  std::optional<size_t> FirstError() const;
  // Whether rows x of this and y of other were fed the same tokens at positions 0..position.
  bool SameHistory(const RecordedRow& x, const Recording& other, const RecordedRow& y) const;
};

// --localize: record the layer trace of every forward call of one step, so the map covers each
// of its rows (a decode step makes one call per token).
struct TraceRequest {
  int64_t step = 0;
  std::map<int64_t, ForwardTrace> traces;  // by RecordedRow::call; only the calls that returned
};

// Called once each step is recorded, with the recording so far: the step's rows and its record
// are final (later steps only append rows and histories), so a caller can compare them while the
// replay goes on instead of holding every row until it ends.
using AfterStep = std::function<void(const Recording& so_far, size_t step)>;

// The scenario must be prepared and validated (PrepareScenario). InputError when its driver does
// not apply to the backend; every other failure is recorded in the steps.
Recording Replay(const Scenario& scenario, const Backend& backend, TraceRequest* trace = nullptr,
                 const AfterStep& after_step = {});

// The greedy choice: the first maximum of the row (torch.argmax, llama2.c). A row with a NaN or
// inf logit has no greedy choice: InputError saying what is wrong.
Token GreedyNext(const float* row, int64_t vocab);

// The one greedy loop (decode steps, `generate`, `repro`): up to n times, choose the greedy token
// of `row` (vocab floats) and hand it to `feed`, which returns the row that token produced, or
// nullptr to stop there (an EOS, the context's end, the last token wanted). Returns the tokens
// chosen, every one of them handed to feed.
Tokens Greedy(const float* row, int64_t vocab, int64_t n,
              const std::function<const float*(Token)>& feed);

}  // namespace kvdiff::harness
