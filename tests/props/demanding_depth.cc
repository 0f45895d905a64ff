// How float32 error grows with depth on demanding models (make-model --scale demanding), measured
// against ref64 (LibTorch, float64): the evidence behind RandomModelScale::Demanding()'s score
// layers (format/model_files.h) and the demanding part's gate (harness/campaign/demanding_part.h).
//
//   demanding_depth [--preset smollm2-135m|tiny] [--prompt N] [--seeds K] [--example PATH]
//
// For each depth (2..30 layers, the preset's widths) and for two ways of scaling the attention
// scores — every layer's depth-tempered scores times 25 (what kvdiff did before) and the first
// layers' to a standard deviation of 100 (what it does now) — it prints the worst max |a-b| / max
// |logit| over the rows of one prompt for four float32 computations held to ref64: impl's
// ForwardFull, impl's cached rows (the prompt fed in chunks), the example engine (a C Llama of its
// own) and the scalar model of the properties (scalar_llama.h, float32 values, float64 sums). Then,
// for the deepest model, impl's hidden state after each layer against ref64's, relative to its
// size: where the error grows. Not a test: a table for the docs ("The demanding part"),
// reproducible with this command.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "format/model_files.h"
#include "format/prng.h"
#include "harness/backend/registry.h"
#include "harness/compare/compare.h"
#include "tests/props/scalar_llama.h"

namespace kvdiff::props {
namespace {

struct Args {
  std::string preset = "smollm2-135m";  // whose widths
  int64_t prompt = 48;
  int seeds = 2;
  std::string example = KVDIFF_EXAMPLE_ENGINE;
};

// max over rows of max |a-b| / max |b| (the demanding gate's measure).
double WorstRelative(const Logits& a, const Logits& b) {
  double worst = 0;
  for (int64_t r = 0; r < b.rows(); ++r) {
    const harness::RowComparison c =
        harness::CompareRows(a.row(r).data(), b.row(r).data(), b.cols(), harness::Tolerance{});
    worst = std::max(worst, c.relative_diff());
  }
  return worst;
}

double RelativeMatrix(const RowMatrix& a, const RowMatrix& b) {
  const double scale = b.cwiseAbs().maxCoeff();
  return (a.cast<double>() - b.cast<double>()).cwiseAbs().maxCoeff() / scale;
}

// Multiplies every layer's q_proj and k_proj by f (its scores by f^2).
void ScaleScores(format::ModelWeights& w, double f) {
  for (int64_t l = 0; l < w.config.num_hidden_layers; ++l) {
    for (const char* proj : {"q_proj", "k_proj"}) {
      auto& t = w.tensors.at(fmt::format("model.layers.{}.self_attn.{}.weight", l, proj));
      for (float& v : t.data) v = static_cast<float>(v * f);
    }
  }
}

// The demanding model of `config`: as kvdiff draws it now, or as it did before (every layer's
// depth-tempered scores times 25).
std::shared_ptr<const format::ModelWeights> DemandingModel(const format::LlamaConfig& config,
                                                           uint64_t seed, bool every_layer) {
  format::RandomModelScale scale = format::RandomModelScale::Demanding();
  if (!every_layer) {
    return std::make_shared<const format::ModelWeights>(
        format::MakeRandomModel(config, seed, scale));
  }
  const double factor = scale.scores;
  scale.scores = 1;
  format::ModelWeights w = format::MakeRandomModel(config, seed, scale);
  ScaleScores(w, std::sqrt(factor));
  return std::make_shared<const format::ModelWeights>(std::move(w));
}

Logits Cached(const harness::Backend& backend, const Tokens& tokens) {
  auto session = backend.NewSession();
  Logits out(static_cast<int64_t>(tokens.size()), backend.config().vocab_size);
  int64_t done = 0;
  for (int64_t chunk : {1, 5, 2, 11, 3, 1000}) {
    const int64_t n = std::min<int64_t>(chunk, static_cast<int64_t>(tokens.size()) - done);
    if (n <= 0) break;
    out.middleRows(done, n) =
        session->Append(Tokens(tokens.begin() + done, tokens.begin() + done + n));
    done += n;
  }
  return out;
}

int Main(const Args& args) {
  const std::vector<int64_t> depths = {2, 3, 4, 8, 16, 24, 30};
  fmt::print(
      "float32 against ref64 on demanding models of {}'s widths, {}-token prompts, {} model "
      "seeds; worst max |a-b| / max |logit| of a row\n",
      args.preset, args.prompt, args.seeds);
  fmt::print("{:>6}  {:<22} {:>10} {:>10} {:>10} {:>10}\n", "layers", "scores scaled in", "impl",
             "impl cached", "example", "scalar");
  for (int64_t layers : depths) {
    for (bool every_layer : {true, false}) {
      std::vector<double> worst(4, 0);
      for (int s = 0; s < args.seeds; ++s) {
        format::LlamaConfig config = format::PresetConfig(args.preset);
        config.num_hidden_layers = layers;
        const auto weights = DemandingModel(config, 7 + s, every_layer);
        format::Xoshiro256 rng = format::Xoshiro256::ForStream(100 + s, "prompt");
        Tokens tokens(static_cast<size_t>(args.prompt));
        for (Token& t : tokens) t = static_cast<Token>(rng.Next() % config.vocab_size);
        const auto ref64 = harness::MakeBackend("ref64", weights);
        const auto impl = harness::MakeBackend("impl", weights);
        const auto example = harness::MakeBackend("plugin:" + args.example, weights);
        const auto scalar = MakeScalarBackend(weights);
        const Logits oracle = ref64->ForwardFull(tokens);
        const double r[4] = {WorstRelative(impl->ForwardFull(tokens), oracle),
                             WorstRelative(Cached(*impl, tokens), oracle),
                             WorstRelative(example->ForwardFull(tokens), oracle),
                             WorstRelative(scalar->ForwardFull(tokens), oracle)};
        for (int k = 0; k < 4; ++k) worst[k] = std::max(worst[k], r[k]);
      }
      fmt::print("{:>6}  {:<22} {:>10.1e} {:>10.1e} {:>10.1e} {:>10.1e}\n", layers,
                 every_layer ? "every layer, x25" : "first layers, std 100", worst[0], worst[1],
                 worst[2], worst[3]);
    }
  }
  // Layer by layer on the deepest model: impl's hidden state after each layer against ref64's.
  const int64_t layers = depths.back();
  fmt::print("\nimpl against ref64 after each layer ({} layers, seed 7): max |a-b| / max |h|\n",
             layers);
  for (bool every_layer : {true, false}) {
    format::LlamaConfig config = format::PresetConfig(args.preset);
    config.num_hidden_layers = layers;
    const auto weights = DemandingModel(config, 7, every_layer);
    format::Xoshiro256 rng = format::Xoshiro256::ForStream(100, "prompt");
    Tokens tokens(static_cast<size_t>(args.prompt));
    for (Token& t : tokens) t = static_cast<Token>(rng.Next() % config.vocab_size);
    ForwardTrace ti, tr;
    harness::MakeBackend("impl", weights)->ForwardFull(tokens, &ti);
    harness::MakeBackend("ref64", weights)->ForwardFull(tokens, &tr);
    std::string line = every_layer ? "every layer:" : "first layers:";
    for (int64_t l = 0; l < layers; ++l) {
      line +=
          fmt::format(" {:.0e}", RelativeMatrix(ti.layers[l].after_mlp, tr.layers[l].after_mlp));
    }
    fmt::print("{}\n", line);
  }
  return 0;
}

}  // namespace
}  // namespace kvdiff::props

int main(int argc, char** argv) {
  kvdiff::props::Args args;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--preset") {
      args.preset = argv[i + 1];
    } else if (flag == "--prompt") {
      args.prompt = std::atoll(argv[i + 1]);
    } else if (flag == "--seeds") {
      args.seeds = std::atoi(argv[i + 1]);
    } else if (flag == "--example") {
      args.example = argv[i + 1];
    } else {
      std::cerr << "demanding_depth: unknown flag " << flag
                << " (known: --preset NAME, --prompt N, --seeds K, --example PATH)\n";
      return 2;
    }
  }
  try {
    return kvdiff::props::Main(args);
  } catch (const std::exception& e) {
    std::cerr << "demanding_depth: " << e.what() << "\n";
    return 2;
  }
}
