// RapidCheck generators for the properties: small random Llama models, prompts, chunk splits.
// Every generator shrinks towards the smallest, plainest case (one layer, one head, short prompt,
// one chunk), so a failure is reported on the smallest model and input that still fail.
#pragma once

#include <rapidcheck.h>

#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "format/config.h"
#include "format/model_files.h"
#include "format/tensor.h"

namespace kvdiff::props {

// A model to test: a config plus the seed of its random weights (format::MakeRandomModel).
// Two ModelCases that print the same describe the same weights.
struct ModelCase {
  format::LlamaConfig config;
  uint64_t seed = 0;
  std::string preset;              // "" for a generated shape, else the preset name
  format::RandomModelScale scale;  // GenDemandingModel: RandomModelScale::Demanding()

  int64_t Capacity() const { return config.max_position_embeddings; }
  std::shared_ptr<const format::ModelWeights> MakeWeights() const;
};
std::ostream& operator<<(std::ostream& os, const ModelCase& model);

// A small random Llama: layers 1-3, kv heads 1-2 dividing 1-3x as many query heads, head_dim in
// {4, 8, 16} doubled until heads * head_dim >= harness::kMinShapeWidth (32; even, as RoPE's
// rotate-half needs; hidden = heads * head_dim), vocab 32-512,
// tied or untied head, with or without llama3 rope scaling (original context 8-32, so the scaled
// and the kept frequency bands both occur at the positions a test reaches), capacity 8-32
// positions. One case runs in ms. A subset of what `check --shapes random` draws
// (harness/campaign/shape_generator.h: GQA ratios up to 8, head_dim up to 128, longer contexts),
// kept smaller so that the properties' hundreds of cases per test stay fast and shrink well.
rc::Gen<ModelCase> GenSmallModel();
// GenSmallModel's shapes with the demanding scale (make-model --scale demanding): attention scores
// in the hundreds, hidden states whose float32 sum of squares overflows, logits in the thousands.
// Compare on them with a relative gate (properties.h, kDemandingRtol).
rc::Gen<ModelCase> GenDemandingModel();
// A fixed preset ("tiny", "smollm2-135m") with random weights from a generated seed.
rc::Gen<ModelCase> GenPresetModel(const std::string& preset);

// Uniform over [lo, hi) whatever the case size (gen::inRange starts at lo and widens with the
// size, which suits shapes but not choices or token ids); shrinks towards lo.
rc::Gen<int64_t> GenUniform(int64_t lo, int64_t hi);

// length tokens in [0, vocab).
rc::Gen<Tokens> GenTokens(int64_t vocab, int64_t length);
// A prompt of 1..max_length tokens (shrinks to one token 0).
rc::Gen<Tokens> GenPrompt(int64_t vocab, int64_t max_length);

// A random composition of n (chunk sizes, all >= 1, summing to n): all ones, one chunk, and
// everything between, each about a third of the time. Shrinks towards one chunk.
rc::Gen<std::vector<int64_t>> GenChunks(int64_t n);

// Splits tokens into consecutive pieces of the given sizes.
std::vector<Tokens> SplitTokens(const Tokens& tokens, const std::vector<int64_t>& chunks);

}  // namespace kvdiff::props

namespace rc {
// So a ModelCase can be a property argument and RapidCheck prints it in counterexamples.
template <>
struct Arbitrary<kvdiff::props::ModelCase> {
  static Gen<kvdiff::props::ModelCase> arbitrary() { return kvdiff::props::GenSmallModel(); }
};
}  // namespace rc
