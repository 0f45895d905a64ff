// The Eigen Llama: the model of record. Float32, GQA, tied or untied head, llama3 RoPE scaling.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <vector>

#include "format/model_files.h"
#include "format/tensor.h"
#include "impl/batch_fault.h"
#include "impl/kv_cache.h"

namespace kvdiff::impl {

class Session;

// One part of a forward call: `tokens` at RoPE positions index_pos.., their K/V appended to
// `cache` at its length (the two agree but in the raw call's misuses).
struct ForwardPart {
  const Tokens* tokens = nullptr;
  int64_t index_pos = 0;
  KvCache* cache = nullptr;
};

// How the model keeps its weight matrices. kAuto: in the checkpoint's own 16-bit dtype when it is
// bf16 or f16 (and every value is exactly one of that dtype: true of anything loaded from such a
// checkpoint), widened to float32 inside the kernels: half the bytes per decode step and logits
// bit-identical to kF32. kF32: every matrix in float32 (the weights as loaded, no copy).
enum class WeightStorage { kAuto, kF32 };

// Holds the weights by shared_ptr and reads them in place (no copy; a tied head is the embedding
// matrix itself; with 16-bit storage, one 16-bit copy of each matrix), plus the RoPE tables, a
// thread pool and the scratch buffers of a forward call. Forward calls on one Model are serialized
// (they share the pool and the scratch); Sessions refer to their Model, which must outlive them.
class Model {
 public:
  // threads: 0 means every core of the machine. Throws InputError when the weights do not match
  // their config (a missing tensor, a wrong shape).
  explicit Model(std::shared_ptr<const format::ModelWeights> weights, int threads = 0,
                 WeightStorage storage = WeightStorage::kAuto);
  static Model Load(const std::filesystem::path& dir, int threads = 0,
                    WeightStorage storage = WeightStorage::kAuto);
  ~Model();
  Model(Model&&) noexcept;

  const format::LlamaConfig& config() const;
  int Threads() const;  // the thread count in use (0 resolved to the machine's)
  // "float32", "bfloat16" or "float16": how the weight matrices are held (see WeightStorage).
  const char* StorageName() const;

  // No cache: logits [n, vocab] for every position of tokens (positions 0..n-1).
  Logits ForwardFull(const Tokens& tokens, ForwardTrace* trace = nullptr) const;

  // The raw candle llama.rs call, UNCHECKED ON PURPOSE (it exists to reproduce porting bugs):
  // RoPE rows from index_pos, causal mask sized (s, index_pos + s) and skipped when s == 1, K/V
  // always appended to whatever the cache holds. When the mask does not fit the scores
  // (s, cache.Length() + s) it throws ShapeError with candle's message:
  // "cannot broadcast [s, s'] to [1, nh, s, P+s]" (and, unlike candle, leaves the cache as it
  // was). Only memory safety is checked: token ids, index_pos within the RoPE table, and the
  // cache capacity (InputError). Use Session instead.
  Logits Forward(const Tokens& tokens, int64_t index_pos, KvCache& cache,
                 ForwardTrace* trace = nullptr) const;

  // A serving engine's call: several caches (conversations) advance in ONE forward. The rows of
  // every part go through the same matrix products; RoPE, the cache append and attention are
  // each part's own (its positions start at its cache's length; it attends to its cache only).
  // Returns the logits of the rows flagged in `output` (one flag per row of all parts, in order;
  // empty: every row). Checked before anything runs (InputError): tokens, capacities, a cache
  // named twice, index_pos == the cache's length. A part's rows are the rows it would get alone
  // up to the order of the sums: the matrix products change kernel with the row count
  // (kLinearRowsMax), so its logits agree with its own call's within float32 rounding.
  Logits ForwardBatch(const std::vector<ForwardPart>& parts,
                      const std::vector<bool>& output = {}) const;

  // TEST-ONLY: a serving engine's bug in ForwardBatch's calls of more than one part
  // (impl/batch_fault.h), to prove that kvdiff's batch steps catch it. Not thread-safe: call it
  // before the model is shared.
  void InjectBatchFault(BatchFault fault);
  BatchFault InjectedFault() const;

  KvCache NewCache(int64_t capacity = 0) const;
  // A checked session owning its cache and position; capacity 0 means max_position_embeddings.
  Session NewSession(int64_t capacity = 0) const;

  // Throws InputError on an empty input or an id outside [0, vocab_size), naming id and index.
  void CheckTokens(const Tokens& tokens) const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace kvdiff::impl
