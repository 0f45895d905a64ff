// The LibTorch reference as a module that kvdiff loads when a ref or ref64 backend is first built
// (harness/backend/reference_backend.cc), so that every other kvdiff process never loads LibTorch:
// its ~290 libraries and their static initialisers cost ~0.6 s and ~150 MB (58 MB of it private)
// at the start of every process, the isolated engine's child and `kvdiff --version` included.
//
// The module (kvdiff_reference_module, built beside kvdiff) holds reference/ and LibTorch; this
// torch-free header is all the two sides share: one entry point, and the reference's model and
// cache as interfaces over ReferenceModel and DynamicCache (reference_model.h: what they do).
// Both sides are built from one tree with one compiler, so C++ types cross: the weights by
// shared_ptr, logits and tokens by value, InputError thrown through.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "format/model_files.h"
#include "format/tensor.h"
#include "reference/reference_model.h"

namespace kvdiff::ref {

// A DynamicCache behind the module's boundary.
class ModuleCache {
 public:
  virtual ~ModuleCache() = default;
  virtual int64_t GetSeqLength() const = 0;
  virtual void Crop(int64_t length) = 0;
  virtual void Reset() = 0;
  virtual std::unique_ptr<ModuleCache> Fork() const = 0;
};

// One conversation's part of a batched forward (BatchPart, with the module's cache).
struct ModuleBatchPart {
  ModuleCache* cache = nullptr;
  const Tokens* tokens = nullptr;
  std::vector<bool> output;
};

// A ReferenceModel behind the module's boundary; a cache it did not make is refused (InputError).
class ModuleModel {
 public:
  virtual ~ModuleModel() = default;
  virtual const format::LlamaConfig& config() const = 0;
  virtual std::unique_ptr<ModuleCache> NewCache() const = 0;
  virtual Logits ForwardFull(const Tokens& tokens, ForwardTrace* trace) const = 0;
  virtual Logits Forward(const Tokens& tokens, ModuleCache& cache, ForwardTrace* trace) const = 0;
  virtual std::vector<Logits> ForwardBatch(const std::vector<ModuleBatchPart>& parts,
                                           BatchPositions positions) const = 0;
  virtual void Shift(ModuleCache& cache, int64_t keep, int64_t discard) const = 0;
};

// Builds a model on `weights` (ReferenceModel's constructor).
using MakeModuleModel = std::unique_ptr<ModuleModel> (*)(
    std::shared_ptr<const format::ModelWeights> weights, Precision precision, int threads);
// The module's one exported symbol: an extern "C" function of no argument that returns its
// MakeModuleModel. Versioned by name: a module of another layout is not found rather than misread.
inline constexpr char kKvdiffReferenceEntry[] = "kvdiff_reference_make_model_v1";

}  // namespace kvdiff::ref
