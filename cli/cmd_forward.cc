// `kvdiff forward`: one forward pass over given token ids, the logits of every position written
// as a safetensors file (one F32 tensor "logits" [n, vocab]); the top-5 of the last position shown.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/engine_guard.h"
#include "format/error.h"
#include "format/model_files.h"
#include "format/safetensors.h"
#include "harness/backend/backend.h"
#include "harness/backend/registry.h"
#include "harness/compare/compare.h"

namespace kvdiff::cli {
namespace {

struct ForwardOptions {
  std::string model;
  std::string tokens;
  std::string backend = "impl";
  bool cached = false;
  std::string chunks;
  int threads = 0;
  std::string out;
};

void PrintTop5(const Logits& logits, const Tokens& tokens) {
  const int64_t last = logits.rows() - 1;
  std::vector<int64_t> order(logits.cols());
  std::iota(order.begin(), order.end(), 0);
  const int64_t k = std::min<int64_t>(5, logits.cols());
  // Ties keep the lower id first, so the listing is deterministic.
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int64_t a, int64_t b) {
    const float x = logits(last, a), y = logits(last, b);
    return x > y || (x == y && a < b);
  });
  fmt::print(Report(), "top-5 after position {} (token {}):\n", last, tokens.back());
  for (int64_t i = 0; i < k; ++i) {
    fmt::print(Report(), "  {:>2}. token {:>6}  logit {:>10.4f}\n", i + 1, order[i],
               logits(last, order[i]));
  }
}

// 0, or 1 when the backend's logits are not all finite (the NaN/inf policy: a failure of its own
// kind, reported after the file is written so it can be inspected).
int RunForward(const ForwardOptions& o) {
  SeparateReportFromEngines();  // what an engine prints is not the report
  auto weights = std::make_shared<const format::ModelWeights>(format::LoadModel(o.model));
  const int64_t vocab = weights->config.vocab_size;
  const Tokens tokens = ParseTokenIds("--tokens", o.tokens, vocab);
  const auto n = static_cast<int64_t>(tokens.size());

  std::vector<int64_t> chunks;
  if (o.cached) {
    if (o.chunks.empty()) {
      chunks.assign(n, 1);  // the decode loop: one token at a time
    } else {
      chunks = ParseIntList("--chunks", o.chunks);
      for (size_t i = 0; i < chunks.size(); ++i) {
        KVDIFF_CHECK(chunks[i] > 0, "--chunks: chunk {} is 0 (every chunk needs a token)", i);
      }
      const int64_t sum = std::accumulate(chunks.begin(), chunks.end(), int64_t{0});
      KVDIFF_CHECK(sum == n, "--chunks add up to {} tokens but --tokens has {}", sum, n);
    }
  }

  auto backend = harness::MakeBackend(o.backend, weights, o.threads);
  Logits logits;
  std::string mode = "uncached (ForwardFull)";
  if (!o.cached) {
    logits = backend->ForwardFull(tokens);
  } else {
    mode = fmt::format("cached (Session, chunks {})", fmt::join(chunks, "+"));
    auto session = backend->NewSession();
    logits.resize(n, vocab);
    int64_t at = 0;
    for (int64_t size : chunks) {
      logits.middleRows(at, size) =
          session->Append(Tokens(tokens.begin() + at, tokens.begin() + at + size));
      at += size;
    }
  }

  format::TensorToWrite tensor;
  tensor.name = "logits";
  tensor.shape = {n, vocab};
  tensor.values.assign(logits.data(), logits.data() + logits.size());  // row-major [n, vocab]
  format::WriteSafetensors(o.out, {tensor},
                           {{"backend", backend->Name()},
                            {"mode", mode},
                            {"tokens", fmt::format("{}", fmt::join(tokens, ","))}});
  fmt::print(Report(), "logits [{}, {}] of backend {}, {}, written to {}\n", n, vocab,
             backend->Name(), mode, o.out);
  const std::string bad =
      harness::DescribeNonFiniteLogits(backend->Name(), "", logits.data(), n, vocab);
  if (!bad.empty()) {
    fmt::print(stderr, "kvdiff: failure: {}\n", bad);
    return 1;
  }
  PrintTop5(logits, tokens);
  return 0;
}

}  // namespace

void AddForwardCommand(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<ForwardOptions>();
  CLI::App* cmd = app.add_subcommand(
      "forward",
      "Run a model over token ids and write the logits of every position to a safetensors file "
      "(one F32 tensor \"logits\" [n, vocab]); prints the top-5 tokens of the last position");
  cmd->add_option("--model", o->model, "model directory (config.json, model.safetensors)")
      ->required();
  cmd->add_option("--tokens", o->tokens, "token ids, comma-separated, e.g. 1,2,3")->required();
  cmd->add_option("--backend", o->backend,
                  "Backend: " + harness::BackendRegistry::Global().HelpText())
      ->capture_default_str();
  auto* cached =
      cmd->add_flag("--cached", o->cached, "feed a Session instead of one uncached ForwardFull");
  cmd->add_option("--chunks", o->chunks,
                  "with --cached: chunk sizes, comma-separated, summing to the token count "
                  "(default: one token at a time)")
      ->needs(cached);
  cmd->add_option("--threads", o->threads, "threads for the backend (0 = all cores)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--out", o->out, "output safetensors file")->required();
  cmd->callback([o, &exit_code] { exit_code = RunForward(*o); });
}

}  // namespace kvdiff::cli
