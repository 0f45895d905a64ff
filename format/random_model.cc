// The models kvdiff makes itself (model_files.h): the presets' configs, the scale knob
// (RandomModelScale) and the deterministic random weights behind `kvdiff make-model`. Loading and
// saving checkpoints is in model_files.cc.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "format/affixes.h"
#include "format/error.h"
#include "format/machine_memory.h"
#include "format/model_files.h"
#include "format/prng.h"

namespace kvdiff::format {
namespace {

// --- random weights ------------------------------------------------------------------------------
//
// Why these scales. The harness must see every cache or position bug as a large change in logits
// (the gate is 1e-4), so the random model must be far from uniform everywhere:
//  * Every sublayer reads RMSNorm(x) * w with w = 1 + 0.1 z: a vector with unit RMS (the noise
//    makes a wrong norm weight visible).
//  * q, k: entries N(0, (2/sqrt(hidden))^2), so each q and k component has variance
//    hidden * 4/hidden = 4, and the score q.k/sqrt(d) has standard deviation 4 * sqrt(d)/sqrt(d)
//    = 4 (up to 2 layers; tempered with depth, see ScalesFor). Scores spread over several units
//    make softmax peaked: a few keys carry the attention, so one stale or mis-rotated key moves
//    the output by O(1). RoPE rotates q and k (norm-preserving),
//    so relative positions change the scores by the same O(1) amounts.
//  * v: N(0, 1/hidden) gives unit-variance values; o: N(0, r^2/q_dim) gives each attention branch
//    output variance about r^2, where r is the embedding scale (the residual's unit).
//  * gate, up: N(0, 1/hidden), so their outputs are ~N(0, 1) and E[silu(g)^2 u^2] ~ 0.356 (by
//    quadrature); down: N(0, r^2/(0.356 intermediate)) gives each MLP branch variance about r^2.
//  * The residual therefore grows from r^2 to about (1 + 2 layers) r^2 in variance: std 2.2 r for
//    tiny, 7.8 r for 30 layers. Deliberately not scaled down per layer: the context (attention)
//    must dominate the token's own embedding, or a tied head just predicts the input token again.
//  * Head: untied, embedding N(0, 1) and lm_head N(0, 9/hidden): the final normalized state has
//    unit RMS, so logits have standard deviation 3 (a spread of ~15 over 256 tokens). Tied, the
//    embedding is the head, so it is N(0, 9/hidden) itself and r = 3/sqrt(hidden); logits again
//    have std ~3. Deep models get smaller logits (see ScalesFor): float32 rounding at the logits
//    grows with their size and with depth, and must stay far below the 1e-4 gate.
// tests/format/model_files_test.cc measures the score and logit statistics.
struct WeightScales {
  double embed, norm_noise, v, o, gate_up, down, lm_head;
  double qk, qk_deep;  // q_proj, k_proj: in the first kDemandingScoreLayers layers, and past them
  double final_norm;   // model.norm.weight's factor (1 + noise, times this)
};

// The scale knob (RandomModelScale) multiplies these: `scores` the product of the q and k scales
// (sqrt on each), `activations` every tensor that writes the residual stream (embedding, o_proj,
// down_proj: the residual unit r), `logits` the head. A tied head is the embedding, so there the
// final norm's weight carries logits / activations instead (RMSNorm's output times that weight,
// times the embedding scaled by activations, gives logits scaled by `logits`).
WeightScales ScalesFor(const LlamaConfig& c, const RandomModelScale& k) {
  const double hidden = static_cast<double>(c.hidden_size);
  WeightScales s{};
  const double layers = static_cast<double>(c.num_hidden_layers);
  // Logit standard deviation 3 up to 4 layers, tempered with depth like the scores below: float32
  // noise at the logits is proportional to their size, and 30 layers accumulate more of it. At
  // std 3 the smollm2-135m preset had prompts where transformers' own float32 path (ref) was
  // 1.2e-4 from float64 (ref64); at std 3 * sqrt(4/30) = 1.1 (spread ~10 over the vocabulary) a
  // one-ulp change of every embedding moves its logits by at most 2.1e-5 (measured with impl).
  const double logit_std = 3.0 * std::min(1.0, std::sqrt(4.0 / layers));
  s.embed = c.tie_word_embeddings ? logit_std / std::sqrt(hidden) : 1.0;
  const double r = s.embed;
  s.norm_noise = 0.1;
  // Score standard deviation 4 for shallow models, tempered with depth: peaked attention in every
  // one of 30 layers makes the random network chaotic, so float32 summation-order noise (cached vs
  // uncached) grows to 1.8e-4 at the logits of the smollm2-135m preset, over the 1e-4 gate. With
  // std 4 * sqrt(2 / layers) (1.03 for 30 layers) that noise is 4.5e-5 on a 16-token prompt while a
  // position bug still moves logits by 7 (measured with impl on seed 3).
  const double score_std = 4.0 * std::min(1.0, std::sqrt(2.0 / layers));
  s.qk = std::sqrt(score_std / hidden);
  s.v = 1.0 / std::sqrt(hidden);
  s.o = r / std::sqrt(static_cast<double>(c.QDim()));
  s.gate_up = 1.0 / std::sqrt(hidden);
  s.down = r / std::sqrt(0.356 * static_cast<double>(c.intermediate_size));
  s.lm_head = logit_std / std::sqrt(hidden);
  // A scaled model's first layers: the shallow model's std 4 times the factor, whatever the depth
  // (std 100 for demanding, past float32 exp's overflow at 88.7 in every prompt); the deeper
  // layers keep the tempered default (RandomModelScale, kDemandingScoreLayers).
  s.qk_deep = s.qk;
  if (k.scores != 1) s.qk = std::sqrt(4.0 * k.scores / hidden);
  s.embed *= k.activations;
  s.o *= k.activations;
  s.down *= k.activations;
  s.lm_head *= k.logits;
  s.final_norm = c.tie_word_embeddings ? k.logits / k.activations : 1.0;
  return s;
}

// l of "model.layers.{l}.…" (every tensor ExpectedTensors names inside a layer).
int64_t LayerOf(const std::string& name) {
  const std::string prefix = "model.layers.";
  KVDIFF_CHECK(StartsWith(name, prefix), "LayerOf: \"{}\" is not a layer's", name);
  return std::stoll(name.substr(prefix.size()));
}

// A config passes Validate() with every dimension below 2^31, so its tensors' product can ask for
// terabytes from a 300-byte scenario; the weights are written whole before anything runs. Refused
// when the float32 tensors alone need more than this machine's memory, naming the sizes.
void CheckRandomWeightsFitInMemory(const LlamaConfig& c) {
  double floats = 0;  // double: exact enough, and no overflow for 2^31-sized dimensions
  for (const TensorSpec& spec : ExpectedTensors(c)) {
    double n = 1;
    for (int64_t d : spec.shape) n *= static_cast<double>(d);
    floats += n;
  }
  const double bytes = 4 * floats;
  const double memory = PhysicalMemoryBytes();
  KVDIFF_CHECK(memory <= 0 || bytes <= memory,
               "config: a random model of hidden_size {}, intermediate_size {}, {} layers and "
               "vocab_size {} has {:.3g} parameters, {:.3g} GB of float32 weights, more than this "
               "machine's memory ({:.3g} GB)",
               c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.vocab_size, floats,
               bytes / 1e9, memory / 1e9);
}

// std::sqrt is correctly rounded by IEEE 754 (unlike exp or log), so these scales are the same
// everywhere; with -ffp-contract=off (CMakeLists.txt) so is every product below.
void FillRandom(Tensor& t, const std::string& name, uint64_t seed, double scale, double offset) {
  Xoshiro256 rng = Xoshiro256::ForStream(seed, name);
  for (float& value : t.data) {
    const double z = rng.Normal();
    value = static_cast<float>(offset + z * scale);
  }
}

}  // namespace

std::vector<std::string> PresetNames() { return {"tiny", "tiny-swa", "smollm2-135m"}; }

LlamaConfig PresetConfig(const std::string& preset) {
  LlamaConfig c;
  if (preset == "tiny" || preset == "tiny-swa") {
    // Small enough for thousands of forwards per test run; 2 KV heads for 4 query heads exercise
    // GQA, head_dim 16 exercises RoPE pairs, and the head is untied so lm_head is read.
    c.hidden_size = 64;
    c.intermediate_size = 128;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 16;
    c.vocab_size = 256;
    c.max_position_embeddings = 512;
    c.rope_theta = 10000.0;
    c.rms_norm_eps = 1e-5;
    c.tie_word_embeddings = false;
    c.bos_token_id = 1;
    c.eos_token_id = 2;
    c.torch_dtype = "float32";
    // tiny-swa: tiny with a sliding window of 32 positions, so that cases of a few hundred
    // positions fill, wrap and rewrite the ring many times (prompts of a few tokens to the 512
    // of the context).
    if (preset == "tiny-swa") c.sliding_window = 32;
  } else if (preset == "smollm2-135m") {
    // HuggingFaceTB/SmolLM2-135M-Instruct's config.json, built in (the file is not needed at run
    // time; tests/format compares the two when the shared data is present).
    c.hidden_size = 576;
    c.intermediate_size = 1536;
    c.num_hidden_layers = 30;
    c.num_attention_heads = 9;
    c.num_key_value_heads = 3;
    c.head_dim = 64;
    c.vocab_size = 49152;
    c.max_position_embeddings = 8192;
    c.rope_theta = 100000.0;
    c.rms_norm_eps = 1e-5;
    c.tie_word_embeddings = true;
    c.bos_token_id = 1;
    c.eos_token_id = 2;
    c.torch_dtype = "bfloat16";
  } else {
    throw InputError(fmt::format("unknown preset \"{}\" (known presets: {})", preset,
                                 fmt::join(PresetNames(), ", ")));
  }
  c.Validate();
  return c;
}

RandomModelScale RandomModelScale::Demanding() {
  RandomModelScale s;
  s.scores = 25;
  s.activations = 1e19;
  s.logits = 300;
  return s;
}

std::string RandomModelScale::ToString() const {
  if (IsDefault()) return "default";
  if (*this == Demanding()) return "demanding";
  std::vector<std::string> parts;
  if (scores != 1) parts.push_back(fmt::format("scores={}", scores));
  if (activations != 1) parts.push_back(fmt::format("activations={}", activations));
  if (logits != 1) parts.push_back(fmt::format("logits={}", logits));
  return fmt::format("{}", fmt::join(parts, ","));
}

namespace {
// Beyond 1e30 a factor pushes some weight or product out of float32's range (3.4e38) for any
// model shape; the limit is a plain bound, not a promise that everything below it is finite.
constexpr double kMaxScaleFactor = 1e30;

void CheckFactor(double value, const std::string& what, const char* name) {
  KVDIFF_CHECK(std::isfinite(value) && value > 0 && value <= kMaxScaleFactor,
               "{}: {} must be a finite number > 0 and <= 1e30, got {}", what, name, value);
}
}  // namespace

void ValidateRandomModelScale(const RandomModelScale& scale, const std::string& what) {
  CheckFactor(scale.scores, what, "scores");
  CheckFactor(scale.activations, what, "activations");
  CheckFactor(scale.logits, what, "logits");
}

RandomModelScale ParseRandomModelScale(const std::string& text, const std::string& what) {
  if (text == "default") return {};
  if (text == "demanding") return RandomModelScale::Demanding();
  const std::string expected =
      "expected \"default\", \"demanding\" or factors like "
      "\"scores=25,activations=1e19,logits=300\"";
  KVDIFF_CHECK(!text.empty(), "{}: {}, got an empty string", what, expected);
  RandomModelScale scale;
  std::set<std::string> seen;
  size_t begin = 0;
  while (begin <= text.size()) {
    const size_t end = std::min(text.find(',', begin), text.size());
    const std::string part = text.substr(begin, end - begin);
    const size_t eq = part.find('=');
    KVDIFF_CHECK(eq != std::string::npos, "{}: {}, got \"{}\" in \"{}\"", what, expected, part,
                 text);
    const std::string name = part.substr(0, eq), value_text = part.substr(eq + 1);
    double* field = name == "scores"        ? &scale.scores
                    : name == "activations" ? &scale.activations
                    : name == "logits"      ? &scale.logits
                                            : nullptr;
    KVDIFF_CHECK(field != nullptr,
                 "{}: unknown factor \"{}\" (known: scores, activations, logits) in \"{}\"", what,
                 name, text);
    KVDIFF_CHECK(seen.insert(name).second, "{}: factor \"{}\" given twice in \"{}\"", what, name,
                 text);
    size_t used = 0;
    try {
      *field = std::stod(value_text, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    KVDIFF_CHECK(used == value_text.size() && used > 0,
                 "{}: {} must be a number, got \"{}\" in \"{}\"", what, name, value_text, text);
    CheckFactor(*field, what, name.c_str());
    begin = end + 1;
  }
  return scale;
}

ModelWeights MakeRandomModel(const LlamaConfig& config, uint64_t seed,
                             const RandomModelScale& scale) {
  config.Validate();
  ValidateRandomModelScale(scale, "MakeRandomModel: scale");
  CheckRandomWeightsFitInMemory(config);
  const WeightScales s = ScalesFor(config, scale);
  ModelWeights model;
  model.config = config;
  model.dtype_on_disk = DType::kF32;
  for (const TensorSpec& spec : ExpectedTensors(config)) {
    Tensor t;
    t.shape = spec.shape;
    size_t n = 1;
    for (int64_t d : spec.shape) n *= static_cast<size_t>(d);
    t.data.resize(n);
    const std::string& name = spec.name;
    double scale = 0, offset = 0;
    if (EndsWith(name, "norm.weight")) {  // input_layernorm, post_attention_layernorm, model.norm
      scale = s.norm_noise;
      offset = 1.0;
      if (name == "model.norm.weight") {
        scale *= s.final_norm;
        offset *= s.final_norm;
      }
    } else if (name == "model.embed_tokens.weight") {
      scale = s.embed;
    } else if (name == "lm_head.weight") {
      scale = s.lm_head;
    } else if (EndsWith(name, "q_proj.weight") || EndsWith(name, "k_proj.weight")) {
      scale = LayerOf(name) < kDemandingScoreLayers ? s.qk : s.qk_deep;
    } else if (EndsWith(name, "v_proj.weight")) {
      scale = s.v;
    } else if (EndsWith(name, "o_proj.weight")) {
      scale = s.o;
    } else if (EndsWith(name, "gate_proj.weight") || EndsWith(name, "up_proj.weight")) {
      scale = s.gate_up;
    } else if (EndsWith(name, "down_proj.weight")) {
      scale = s.down;
    } else {
      throw InputError(fmt::format("MakeRandomModel: no scale for tensor \"{}\"", name));
    }
    FillRandom(t, name, seed, scale, offset);
    model.tensors.emplace(name, std::move(t));
  }
  return model;
}

}  // namespace kvdiff::format
