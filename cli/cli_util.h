// Argument parsing shared by the subcommands.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "format/model_files.h"
#include "format/tensor.h"
#include "harness/backend/backend.h"

namespace CLI {
class App;
}

namespace kvdiff::cli {

// "1,2,3" or "1 2 3" -> {1, 2, 3}. Every item must be a whole non-negative integer: "1,x,3",
// "1,,3", "1.5" are refused (InputError) naming the flag and the offending item.
std::vector<int64_t> ParseIntList(const std::string& flag, const std::string& text);

// ParseIntList, then every id checked against the vocabulary when vocab_size >= 0.
Tokens ParseTokenIds(const std::string& flag, const std::string& text, int64_t vocab_size = -1);

// The backends named, built by the registry over one set of weights.
struct BackendSet {
  std::vector<std::unique_ptr<harness::Backend>> owned;
  std::vector<const harness::Backend*> all;  // the same, in order, as RunScenario takes them
};
BackendSet MakeBackends(const std::vector<std::string>& names,
                        std::shared_ptr<const format::ModelWeights> weights,
                        const harness::BackendOptions& options);

// Plugin backends run their engine in a child process by default, so a crash, hang or exit fails
// the call it happened in (exit 1, the signal named) instead of killing kvdiff and its report;
// --in-process opts out, --isolate (the default) is still accepted, --isolate-timeout bounds a
// call.
void AddIsolateFlag(CLI::App* cmd, harness::BackendOptions& options);
// `options` with its thread count set.
inline harness::BackendOptions WithThreads(harness::BackendOptions options, int threads) {
  options.threads = threads;
  return options;
}

// "Comma-separated backends: impl (Eigen, float32, ...), ref (...)" from the registry.
std::string BackendsHelp(const std::string& defaults_note);

}  // namespace kvdiff::cli
