// A small, scalar, obviously-correct Llama forward with a KV cache (float32 storage, double
// accumulation), written from ../shared/spec/llama-forward.md line by line, with one switch per
// fault the mutation tests need. It is the test's own model: the unmutated version must pass every
// property and agree with impl's ForwardFull within 1e-4 (scalar_llama_prop_test.cc proves it), so
// a mutant that fails a property fails because of its fault, not because of this file.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "format/model_files.h"
#include "format/tensor.h"
#include "harness/backend/backend.h"

namespace kvdiff::props {

enum class Fault {
  kNone,
  kMaskSeesNextKey,      // causal mask off by one: row i also sees key i+1 (one future key)
  kMaskHidesLastCached,  // the most recent cached key (position P-1) is hidden from the new rows
  kRopeAtCacheLength,    // every new token rotated at the cache length P instead of P+i
  kDoubleAppend,         // a re-fed single token (a decode step) has its K/V appended twice
  kKvHeadModulo,         // query head h reads KV head h % nkv instead of h / n_rep
  // Faults past a size P (ScalarLlama's `at`; 0 takes the default named here), the kinds that hide
  // outside short scenarios:
  kDecodeDropsKeysPastP,  // a decode step does not see cached keys at positions >= P (240)
  kMaskSecondTile,        // a call's rows past the first query tile of P (128) rows are masked
                          // as if their tile started at the call's first position
  kRopeWrapsAtP,          // the RoPE table has P (160) rows: position p is rotated as p % P
  kReallocLosesRows,      // the cache grows by doubling from P (96) rows, copying only the
                          // first P: rows P..2P-1 are lost (zeroed) at the second growth
  kSoftmaxWithoutMax,     // softmax in float32 as exp(s) / sum exp(s), without subtracting the
                          // row max: right while scores are small, inf/NaN once one passes ~88
  kNaiveFloat32RmsNorm,   // RMSNorm's sum of squares in float32: right while hidden states are
                          // O(1), inf (a row of zeros) once the sum passes 3.4e38
  // Faults of a serving engine's batched call (Backend::AppendBatch); a single append is right:
  kBatchMaskOfItemZero,     // every item's causal mask is item 0's, broadcast (candle#3582)
  kBatchSharedPositions,    // every item is rotated at item 0's positions (one position vector)
  kBatchRowsAfterSplit,     // past a micro-batch of 4 tokens, two output rows change places
                            // (llama.cpp#14853: logits mis-mapped after a ubatch split)
  kBatchSeesOtherSequence,  // an item also attends to the newest key of the item before it (a
                            // cell of another sequence left visible in a unified cache)
};
std::string FaultName(Fault fault);

// Post-RoPE keys and values of every layer. rows == position except under kDoubleAppend.
struct ScalarCache {
  std::vector<std::vector<float>> keys;    // per layer: (rows, kv_dim), row-major
  std::vector<std::vector<float>> values;  // per layer: (rows, kv_dim), row-major
  int64_t rows = 0;                        // cached key rows
  int64_t position = 0;                    // tokens fed so far = the position of the next token
  int64_t capacity = 0;                    // kReallocLosesRows: the rows allocated
};

// How one item of a batched call sees the call (the batch faults read it).
struct BatchContext {
  int64_t item = 0;                       // this item's index in the call
  int64_t first_position = 0;             // item 0's position before the call
  int64_t first_size = 0;                 // item 0's number of tokens
  const ScalarCache* previous = nullptr;  // the cache of the item before this one (run already)
};

class ScalarLlama {
 public:
  ScalarLlama(std::shared_ptr<const format::ModelWeights> weights, Fault fault = Fault::kNone,
              int64_t at = 0);

  const format::LlamaConfig& config() const { return weights_->config; }
  ScalarCache NewCache() const;
  // Tokens at positions cache.position.., appended to the cache; logits (n, vocab).
  Logits Forward(const Tokens& tokens, ScalarCache& cache,
                 const BatchContext* batch = nullptr) const;
  Fault fault() const { return fault_; }
  Logits ForwardFull(const Tokens& tokens) const {
    ScalarCache cache = NewCache();
    return Forward(tokens, cache);
  }

 private:
  struct LayerWeights {
    const float* input_norm;  // (hidden)
    const float* wq;          // (nh*d, hidden)
    const float* wk;          // (nkv*d, hidden)
    const float* wv;          // (nkv*d, hidden)
    const float* wo;          // (hidden, nh*d)
    const float* post_norm;   // (hidden)
    const float* w_gate;      // (ffn, hidden)
    const float* w_up;        // (ffn, hidden)
    const float* w_down;      // (hidden, ffn)
  };
  using Vec = std::vector<float>;

  Vec RmsNorm(const Vec& x, const float* weight) const;
  void Rope(float* x, int64_t position) const;  // one head of head_dim values, in place
  // The attention block of one layer for the new rows x (s, hidden); appends to the cache.
  std::vector<Vec> Attention(const LayerWeights& w, int64_t layer, const std::vector<Vec>& x,
                             ScalarCache& cache, const BatchContext* batch) const;
  Vec Mlp(const LayerWeights& w, const Vec& x) const;
  // kReallocLosesRows: grows the cache's capacity to hold `rows`, faultily.
  void Grow(ScalarCache& cache, int64_t rows) const;

  std::shared_ptr<const format::ModelWeights> weights_;
  Fault fault_;
  int64_t at_;  // the P of the faults past a size
  std::vector<LayerWeights> layers_;
  const float* embed_;            // (vocab, hidden)
  const float* final_norm_;       // (hidden)
  const float* lm_head_;          // (vocab, hidden)
  std::vector<double> inv_freq_;  // (head_dim / 2), llama3-scaled when the config says so
};

// The scalar model as a harness backend ("scalar" or "scalar:<fault>"): checked sessions that own
// their cache, so every property runs on it exactly as on impl. `at`: as ScalarLlama's.
std::unique_ptr<harness::Backend> MakeScalarBackend(
    std::shared_ptr<const format::ModelWeights> weights, Fault fault = Fault::kNone,
    int64_t at = 0);

}  // namespace kvdiff::props
