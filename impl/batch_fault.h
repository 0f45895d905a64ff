// TEST-ONLY bugs of a serving engine's batched forward, built into impl's own batched path
// (Model::ForwardBatch) so that kvdiff can prove its batch steps catch each one in a real
// batched implementation, not only in a model written for the purpose; and three of its context
// shift (Session::Shift, the re-rotation at the next append), which shift steps must catch.
// Switched on by the backend option impl?fault=NAME (harness/backend/impl_backend.cc); off by
// default, and a call of one part (every single append, ForwardFull, a batch of one item) is never
// faulty for the batch faults; the window faults act on every cached call of a windowed model. Each
// is a bug class from serving engines' trackers (docs/scenarios.md, "Batch steps").
#pragma once

#include <string>

namespace kvdiff::impl {

enum class BatchFault {
  kNone,
  kMaskOfPartZero,         // every part attends with part 0's causal extent (candle#3582: a mask
                           // built for row 0 and broadcast to b rows)
  kSharedPositions,        // one position vector for every part: RoPE at part 0's positions
                           // (transformers#18104, left padding)
  kRowsMisMapped,          // the first output rows of parts 0 and 1 swapped (llama.cpp#14853:
                           // logits mapped to the wrong sequence)
  kSeesOtherSequence,      // every later part also attends to part 0's first cached position
                           // (llama.cpp#27994: a cell of another sequence visible)
  kShiftNotRerotated,      // Session::Shift moves the cached rows down but leaves the keys rotated
                           // for their old positions (a K-shift forgotten; cf. llama.cpp#3825,
                           // where a second shift's delta overwrote the first's)
  kShiftDeltaOverwritten,  // a second shift before an append sets the moved keys' pending
                           // delta to its own instead of adding it (llama.cpp#3825: `delta =`
                           // where `delta +=` was meant), so they are re-rotated by the latest
                           // shift's delta only
  kShiftSkippedWhenEmpty,  // a shift that moves nothing (nothing left after keep + discard)
                           // clears the pending flag an earlier shift set, so that shift's
                           // re-rotation is never applied (cf. llama.cpp#3835: "the KV shift was
                           // applied only if there was at least one token leaving the cache")
  // Three of a sliding-window model's rotating cache (KvCache's ring), in every cached call
  // (the uncached forward, the oracle, has no ring and stays right):
  kWindowPlusOne,              // the cached queries see W + 1 keys (an off-by-one window,
                               // transformers#39408)
  kWindowMinusOne,             // the cached queries see W - 1 keys (a ring holding W - 1 positions,
                               // mlx-examples#1093)
  kRingSlicedByLogicalLength,  // the ring's rows read in row order as if row i held the i-th
                               // position in view: right until the window drops a position, wrong
                               // after (mlx-vlm#1715: a rotated buffer sliced as a linear one)
};

// "batch-mask-of-part0" and so on; "none" is kNone. InputError naming the accepted names.
BatchFault ParseBatchFault(const std::string& name);
const char* BatchFaultName(BatchFault fault);

}  // namespace kvdiff::impl
