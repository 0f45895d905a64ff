// Backends: every model implementation offered to the harness through one interface, so the
// harness never asks which one it holds. What a backend is (its name, dtype, what raw calls it
// offers) is its BackendInfo, kept in the registry (harness/backend/registry.h) and asked, never
// guessed from the name.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "format/config.h"
#include "format/tensor.h"

namespace kvdiff::harness {

// The checked API: a session owns its cache and its position; no call takes a position.
class BackendSession {
 public:
  virtual ~BackendSession() = default;
  virtual Logits Append(const Tokens& tokens, ForwardTrace* trace = nullptr) = 0;
  virtual int64_t Length() const = 0;
  virtual void Truncate(int64_t length) = 0;
  virtual std::unique_ptr<BackendSession> Fork() const = 0;
  virtual void Reset() = 0;
  // A context shift (llama.cpp's n_keep/n_discard, StreamingLLM): drops positions
  // [keep, keep + discard), moves the later ones down by `discard` and re-rotates their cached
  // keys by -discard positions (RoPE is a rotation: R(p - d) = R(-d)·R(p)); values move
  // unchanged. Length() drops by `discard`; the next token goes at the new length. InputError
  // unless 0 <= keep, 0 <= discard and keep + discard <= Length(). Offered exactly when
  // BackendInfo::shifts is set; the default refuses.
  virtual void Shift(int64_t keep, int64_t discard);
};

// One conversation's part of a batched call (Backend::AppendBatch): tokens appended to `session`
// at its own next positions, and which of their rows come back.
struct BatchItem {
  BackendSession* session = nullptr;
  Tokens tokens;
  // Per token: whether its logits row is returned (a serving engine's per-row output flag).
  // Empty: every row.
  std::vector<bool> output;

  bool Outputs(size_t row) const { return output.empty() || output[row]; }
  int64_t OutputRows() const;
};

// The rows of `all` (one per token) whose output flag is set, in order; all of them when `output`
// is empty.
Logits KeepOutputRows(const Logits& all, const std::vector<bool>& output);

// The raw call a port makes, unchecked: candle's forward(tokens, index_pos, cache), or
// transformers' model(input_ids, past_key_values=cache), which reads the position from the cache.
// The misuse drivers (harness/replay/drivers.h) are written once against it.
class RawCache {
 public:
  virtual ~RawCache() = default;
  virtual int64_t Length() const = 0;
  virtual void Crop(int64_t length) = 0;  // keeps the first `length` positions
  virtual void Clear() = 0;
  virtual std::unique_ptr<RawCache> Fork() const = 0;  // explicit deep copy
};

// How a backend's raw call treats positions; the drivers a backend can run follow from it.
enum class RawCall {
  kNone,               // no raw call: only the checked session API (the misuse drivers skip it)
  kTakesPosition,      // candle: the caller passes index_pos (pos0, stale-position apply)
  kPositionFromCache,  // transformers: the position is the cache's length; index_pos is ignored
};

class RawModel {
 public:
  virtual ~RawModel() = default;
  virtual std::unique_ptr<RawCache> NewCache() const = 0;
  virtual Logits Forward(const Tokens& tokens, int64_t index_pos, RawCache& cache,
                         ForwardTrace* trace = nullptr) const = 0;
};

// How the registry builds a backend (every command passes the same to every backend it makes).
struct BackendOptions {
  int threads = 0;  // 0: every core
  // Plugins: the engine's whole lifecycle runs in a child process, so a crash, hang or exit fails
  // a call instead of kvdiff. The default; false (--in-process) trades that for speed.
  bool isolate = true;
  double isolate_timeout_seconds = 600;  // with isolate: a call (open included) silent this long
                                         // is killed
};

// What the registry knows about a backend before building one.
struct BackendInfo {
  std::string name;         // what --backends names: "impl", "ref", "ref64"
  std::string description;  // one line for help texts and `kvdiff info`
  std::string dtype;        // the compute dtype: "float32", "float64"
  RawCall raw_call = RawCall::kNone;
  bool in_default_set = false;  // run when no backend is named
  // Sizes at which the backend's code changes path (tiles, row thresholds): the campaign's
  // generators draw lengths around them.
  std::vector<int64_t> interesting_sizes;
  // What K/V are attended in, when narrower than the compute dtype ("f16"): selects a tolerance
  // profile (harness/compare/tolerance_profile.h). Empty for float32 and float64 caches.
  std::string cache_dtype;
  // What the backend's matrix products round their inputs to, when narrower than float32
  // ("bf16": llama.cpp over bf16 weights converts each activation to bf16 for the dot product):
  // selects a compute tolerance profile. Empty: float32 or float64 throughout.
  std::string compute_dtype;
  // "f32" when RoPE angles are computed in float32 (pos · inv_freq rounded to float, as
  // transformers and llama.cpp do): they drift from the exact angles as the position grows, so
  // comparisons with another backend are held to the rope-f32 profile (tolerance_profile.h).
  // Empty: angles computed in double and rounded once (impl, ref64).
  std::string rope_angles;
  // Not empty: the backend reproduces, on purpose, an arithmetic that overflows on demanding
  // models (make-model --scale demanding), and says why; the campaign's demanding cases leave it
  // out (harness/campaign/demanding_part.h). ref: transformers' float32 LlamaRMSNorm.
  std::string overflows_on_demanding_models;
  // What one backend instance holds, where it is less than the model allows (an engine plugin's
  // engine_info; 0: no limit beyond the model): positions a session holds, sessions alive at once
  // (forks included), and tokens one call takes (every item of a batch together). A scenario
  // beyond them is refused before anything runs (ValidateScenarioFor), and the campaign draws
  // within them.
  int64_t max_length = 0, max_sessions = 0, max_batch_tokens = 0;
  // Its matrix products run in a BLAS library chosen at load time (LibTorch's GEMMs), so its speed
  // depends on which one the loader found: `kvdiff bench` names it and warns of netlib's.
  bool gemms_in_blas = false;
  // Its sessions implement BackendSession::Shift: a scenario with shift steps is refused
  // (ValidateScenarioFor) on a backend without it. impl, ref and ref64; a plugin or an engine
  // program when the engine says it shifts (engine.h ABI 3's shift, the protocol's info), known
  // once the engine is open.
  bool shifts = false;
  // It applies config.json's sliding_window (impl with its ring, ref and ref64 by the mask): a
  // model with a window is refused on any other (BackendRegistry::Make), since it would run a
  // different model there (llama.cpp's llama architecture has no window; a plugin says nothing).
  bool sliding_windows = false;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const BackendInfo& Info() const = 0;
  const std::string& Name() const { return Info().name; }
  virtual const format::LlamaConfig& config() const = 0;
  virtual Logits ForwardFull(const Tokens& tokens, ForwardTrace* trace = nullptr) const = 0;
  virtual std::unique_ptr<BackendSession> NewSession() const = 0;
  // One call that appends every item's tokens to its own session, as a serving engine runs many
  // conversations in one forward; returns, per item, the logits of the rows it asked for
  // [output rows, vocab], in token order. The sessions are this backend's and distinct (the replay
  // never passes one twice). Bad input (no items, a session twice, an empty item, flags that do
  // not match the tokens, a token out of range, an item past max_position_embeddings) is refused
  // with an InputError before anything runs, changing nothing; any other throw leaves the items'
  // sessions in an unspecified state. The default appends the items one after another through
  // their sessions and keeps the rows asked for: the semantic reference, which every backend runs
  // unless it has a batched forward.
  virtual std::vector<Logits> AppendBatch(const std::vector<BatchItem>& items) const;
  // The raw call, present exactly when Info().raw_call != kNone.
  virtual const RawModel* Raw() const { return nullptr; }
};

}  // namespace kvdiff::harness
