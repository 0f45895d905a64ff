// The Eigen backend ("impl"): impl::Model behind the Backend interface. Its session is
// impl::Session (the checked API); its raw call is impl::Model::Forward(tokens, index_pos, cache),
// candle's llama.rs semantics, on the same model (no second copy of the weights).
#include <fmt/format.h>

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "format/error.h"
#include "harness/backend/model_backend.h"
#include "harness/backend/registry.h"
#include "impl/batch_fault.h"
#include "impl/kernels.h"
#include "impl/kv_cache.h"
#include "impl/model.h"
#include "impl/session.h"

namespace kvdiff::harness {
namespace {

// impl's session is impl::Session, which keeps its own cache; the raw call's cache is a KvCache.
struct ImplOps {
  using Model = impl::Model;
  using Session = impl::Session;
  using Cache = impl::KvCache;
  static Session NewSession(const Model& model) { return model.NewSession(); }
  static Logits Append(const Model&, Session& session, const Tokens& tokens, ForwardTrace* trace) {
    return session.Append(tokens, trace);
  }
  static int64_t Length(const Session& session) { return session.Length(); }
  static void Truncate(Session& session, int64_t length) { session.Truncate(length); }
  static Session Fork(const Session& session) { return session.Fork(); }
  static void Reset(Session& session) { session.Reset(); }
  static void Shift(const Model&, Session& session, int64_t keep, int64_t discard) {
    session.Shift(keep, discard);
  }
  static Cache NewCache(const Model& model) { return model.NewCache(); }
  static int64_t Length(const Cache& cache) { return cache.Length(); }
  static void Crop(Cache& cache, int64_t length) { cache.SetLength(length); }
  static void Clear(Cache& cache) { cache.Clear(); }
  static Cache Fork(const Cache& cache) { return cache.Fork(); }
  static Logits Forward(const Model& model, const Tokens& tokens, int64_t index_pos, Cache& cache,
                        ForwardTrace* trace) {
    return model.Forward(tokens, index_pos, cache, trace);
  }
  // impl's batched forward: every item's rows through the same matrix products.
  static constexpr bool kBatched = true;
  static std::vector<Logits> AppendBatch(const Model&, const std::vector<Session*>& sessions,
                                         const std::vector<BatchItem>& items) {
    std::vector<impl::Session::BatchAppend> appends;
    std::vector<bool> output;
    for (size_t i = 0; i < items.size(); ++i) {
      appends.push_back({sessions[i], &items[i].tokens});
      for (size_t r = 0; r < items[i].tokens.size(); ++r) output.push_back(items[i].Outputs(r));
    }
    const Logits rows = impl::Session::AppendBatch(appends, output);
    std::vector<Logits> out;
    int64_t begin = 0;
    for (const BatchItem& item : items) {
      out.push_back(rows.middleRows(begin, item.OutputRows()));
      begin += item.OutputRows();
    }
    return out;
  }
};
using ImplBackend = ModelBackend<ImplOps>;

}  // namespace

namespace {

// impl's options: "impl?weights=auto|f32" says how the model keeps its matrices
// (impl::WeightStorage); "impl?fault=NAME" is TEST-ONLY, a serving engine's bug in impl's batched
// forward (impl/batch_fault.h). Items separated by '&' (or ',').
struct ImplOptions {
  impl::WeightStorage storage = impl::WeightStorage::kAuto;
  impl::BatchFault fault = impl::BatchFault::kNone;
};

// "a=1&b=2" (as --backends writes several options: ',' separates backends there) or "a=1,b=2".
std::vector<std::string> SplitOptionItems(const std::string& text) {
  std::vector<std::string> items;
  size_t begin = 0;
  for (size_t end; (end = text.find_first_of(",&", begin)) != std::string::npos; begin = end + 1)
    items.push_back(text.substr(begin, end - begin));
  items.push_back(text.substr(begin));
  return items;
}

ImplOptions ParseImplOptions(const std::string& name) {
  ImplOptions options;
  const size_t q = name.find('?');
  if (q == std::string::npos) return options;
  std::set<std::string> keys;
  for (const std::string& item : SplitOptionItems(name.substr(q + 1))) {
    const size_t eq = item.find('=');
    const std::string key = item.substr(0, eq);
    KVDIFF_CHECK(keys.insert(key).second,
                 "backend '{}': option \"{}\" is given twice (expected each key at most once)",
                 name, key);
    const std::string value = eq == std::string::npos ? "" : item.substr(eq + 1);
    if (key == "weights" && value == "auto") {
      options.storage = impl::WeightStorage::kAuto;
    } else if (key == "weights" && value == "f32") {
      options.storage = impl::WeightStorage::kF32;
    } else if (key == "fault") {
      try {
        options.fault = impl::ParseBatchFault(value);
      } catch (const InputError& e) {
        throw InputError(fmt::format("backend '{}': {}", name, e.what()));
      }
    } else {
      throw InputError(fmt::format(
          "backend '{}': expected impl?weights=auto or impl?weights=f32 (or the test-only "
          "impl?fault=NAME), found option '{}'",
          name, item));
    }
  }
  return options;
}

std::pair<BackendInfo, BackendFactory> ImplEntry(const std::string& name) {
  const ImplOptions impl_options = ParseImplOptions(name);
  BackendInfo info;
  info.name = name;
  info.description = impl_options.storage == impl::WeightStorage::kF32
                         ? "Eigen, float32, kvdiff's own, weights widened to float32 at load"
                         : "Eigen, float32, kvdiff's own";
  if (impl_options.fault != impl::BatchFault::kNone)
    info.description +=
        fmt::format(", TEST-ONLY fault {}", impl::BatchFaultName(impl_options.fault));
  info.dtype = "float32";
  info.raw_call = RawCall::kTakesPosition;
  info.shifts = true;
  info.sliding_windows = true;
  info.in_default_set = name == "impl";
  // Where impl's kernels change path: LinearRows up to kLinearRowsMax rows, then the GEMM;
  // attention in query tiles of kAttentionQueryTile rows.
  info.interesting_sizes = {impl::kLinearRowsMax, impl::kAttentionQueryTile};
  BackendFactory make = [impl_options](const BackendInfo& info,
                                       std::shared_ptr<const format::ModelWeights> weights,
                                       const BackendOptions& options) -> std::unique_ptr<Backend> {
    auto model =
        std::make_shared<impl::Model>(std::move(weights), options.threads, impl_options.storage);
    model->InjectBatchFault(impl_options.fault);
    return std::make_unique<ImplBackend>(info, std::move(model));
  };
  return {std::move(info), std::move(make)};
}

}  // namespace

void RegisterImplBackend(BackendRegistry& registry) {
  // impl keeps a bf16/f16 checkpoint's matrices in 16 bits (bit-identical logits, half the bytes);
  // impl?weights=f32 widens them at load.
  auto [info, make] = ImplEntry("impl");
  registry.Register(std::move(info), std::move(make));
  registry.RegisterFamily("impl?", ImplEntry);
}

}  // namespace kvdiff::harness
