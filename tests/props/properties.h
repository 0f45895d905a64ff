// The KV-cache properties, written once against harness::Backend so the same property runs on the
// impl, the reference, the scalar test model and every mutant. Each property is a plain function
// meant to be called inside a RapidCheck property (it draws its inputs with *gen and fails with
// RC_FAIL / RC_ASSERT), so a test can run it as RC_GTEST_PROP or through rc::detail::checkProperty
// and inspect the result (the mutation tests do the latter).
#pragma once

#include <rapidcheck.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "harness/backend/backend.h"
#include "harness/campaign/demanding_part.h"
#include "harness/compare/compare.h"
#include "tests/props/generators.h"

namespace kvdiff::props {

// The gate of design.md: max |a - b| <= 1e-4 on logits. Cached and uncached f32 differ by ~1e-6
// (summation order only), and a wrong position or a stale key moves logits by far more.
constexpr double kTolerance = 1e-4;
// On demanding models (GenDemandingModel, logits in the thousands) the gate is also relative:
// max |a - b| <= kDemandingRtol * max |logit| of the oracle row, the campaign's default, measured
// on these shapes too (harness/campaign/demanding_part.h: float32 rounding alone reaches 2.2e-3
// here).
constexpr double kDemandingRtol = harness::kDefaultDemandingRtol;

using BackendFactory =
    std::function<std::unique_ptr<harness::Backend>(std::shared_ptr<const format::ModelWeights>)>;

// What a property runs on: the system's sessions are checked against the oracle's ForwardFull
// (the system's own ForwardFull when no oracle is given: the cache-consistency check).
struct Target {
  BackendFactory system;
  BackendFactory oracle;  // optional: another implementation (impl == ref, or a mutant vs impl)
  rc::Gen<ModelCase> models = GenSmallModel();
  // The gate; a demanding model (GenDemandingModel) adds a relative part (kDemandingRtol).
  harness::Tolerance tolerance = kTolerance;
  // Positions a case may use: the model's max_position_embeddings, capped here for presets whose
  // context (512, 8192) would make a case take seconds instead of milliseconds. 0: no cap.
  int64_t max_positions = 0;
  int64_t Capacity(const ModelCase& model) const {
    return max_positions > 0 ? std::min(max_positions, model.Capacity()) : model.Capacity();
  }
};

// "impl" through harness::MakeBackend, one thread (the models are tiny; threads only cost here).
BackendFactory ImplFactory();
// "ref" (float32 LibTorch) through harness::MakeBackend; only works in a KVDIFF_WITH_TORCH build.
BackendFactory RefFactory();

// What the last case of a property fed its system: the mutation tests replay the shrunk
// counterexample and read this to measure how small it is.
struct CaseSize {
  int64_t tokens = 0;    // tokens in the scenario (prompts, continuations, decode steps); the
                         // stateful property: tokens its commands fed up to the failure
  int64_t commands = 0;  // stateful property: commands run up to and including the failing one
  int64_t layers = 0;    // layers of the model of the case
  std::string model;     // the model, printed
};
CaseSize& LastCaseSize();

// 1. Any prompt split into any chunks: session logits at every position == ForwardFull's.
void ChunkingProperty(const Target& target);
// 2. Prefill (any split) + k greedy steps: every step's logits == ForwardFull(history) and the
//    greedy tokens == an uncached greedy loop's (up to exact ties within the tolerance).
void DecodeProperty(const Target& target);
// 3. Conversation A, then Reset() or a new session, then conversation B: B's logits == those of a
//    fresh backend (a fresh process) and of ForwardFull(B). The length range of B's prompt is a
//    parameter so the one-token case (silent in candle) can be forced.
struct ReuseOptions {
  int64_t min_second_prompt = 1;
  int64_t max_second_prompt = 0;  // 0: up to the capacity
};
void ReuseProperty(const Target& target, const ReuseOptions& options = {});
// 4a. Prefill h, Truncate(k), append c == ForwardFull(h[:k] + c) at positions k.. .
void TruncateProperty(const Target& target);
// 4b. Fork after a prefix p; the fork and its parent then evolve independently.
void ForkProperty(const Target& target);
// 6. rc::state: random command sequences on several conversations, one at a time or several in
//    one batched call (stateful.cc).
void StatefulProperty(const Target& target);
// 7. A batched call equals the same items run alone: random sessions (forks among them, so twins
//    occur) with random histories, a batch over a random subset of them with random output flags;
//    each item's returned rows == the rows of the same tokens appended alone to a fork of its
//    session taken before the call, within kBatchAloneTolerance (batch_property.cc).
void BatchEqualsAloneProperty(const Target& target);

// The bound of property 7: the gate itself. Both sides are float32 paths of the same math, and on
// impl the difference is mostly the alone side's own cached-vs-uncached drift, which the gate is
// there for: in the worst case found, a 3-layer, 64-wide model, a chunk of 6 appended alone at
// length 9 was 6.2e-5 from ForwardFull while the same chunk batched was 3e-6 from it, so batched
// and alone differed by 5.05e-5 (RC_PARAMS="max_success=2000", after 586 cases). Measured
// worst over 200 000 cases of the small models (RC_PARAMS="max_success=20000 seed=S", 10 seeds):
// 4.7e-5; over 24 000 cases of tiny: 2.7e-5. A tighter bound (tests/harness/batch_step_test.cc
// holds one tiny batch to 2e-5) would fail on Append's drift, not on batching. A backend that
// batches by running the items one after another (the scalar model, ref) is bit-identical; the
// mutation test's batching bugs fail it by 1.3e-4 to 13 in their shrunk cases (shrinking stops
// where a case just fails).
constexpr double kBatchAloneTolerance = kTolerance;
// Property 7's measurements since the last Reset: the largest max |batched - alone| of a row, the
// rows compared, the cases run. impl's test prints them.
struct BatchAloneFigures {
  double worst = 0;
  int64_t rows = 0, cases = 0;
};
BatchAloneFigures& BatchAloneMeasured();

// What every property starts from: the drawn model, the system and its oracle (the system itself
// when the target names none), and LastCaseSize() reset for the case.
struct CaseSetup {
  ModelCase model;
  std::unique_ptr<harness::Backend> system;
  std::unique_ptr<harness::Backend> oracle_owned;
  const harness::Backend* oracle = nullptr;  // oracle_owned, or system itself
  int64_t vocab = 0;
  int64_t capacity = 0;
};
CaseSetup Setup(const Target& target);

// Rows [row0, row0 + rows) of got against rows [want_row0, ...) of want: NaN/inf first, then max
// |a - b| <= tolerance; on failure RC_FAIL with what, the position, both argmaxes and the error.
void AssertRowsClose(const Logits& got, int64_t got_row0, const Logits& want, int64_t want_row0,
                     int64_t rows, const harness::Tolerance& tolerance, const std::string& what);
Token Argmax(const Logits& logits, int64_t row);
// The gate of row `row` of the oracle's logits (harness::Tolerance): abs, or rel x its max |logit|.
double RowGate(const harness::Tolerance& tolerance, const Logits& want, int64_t row);

}  // namespace kvdiff::props
