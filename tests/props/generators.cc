#include "tests/props/generators.h"

#include <fmt/format.h>

#include "harness/campaign/shape_generator.h"

namespace kvdiff::props {

rc::Gen<int64_t> GenUniform(int64_t lo, int64_t hi) {
  return [lo, hi](const rc::Random& random, int /*size*/) {
    const auto span = static_cast<uint64_t>(hi - lo);
    const int64_t value = lo + static_cast<int64_t>(rc::Random(random).next() % span);
    return rc::shrinkable::shrinkRecur(value,
                                       [lo](int64_t x) { return rc::shrink::towards(x, lo); });
  };
}

namespace {

template <typename T>
T Pick(const std::vector<T>& options) {  // uniform choice, shrinks to options[0]
  return options[*GenUniform(0, static_cast<int64_t>(options.size()))];
}

}  // namespace

std::shared_ptr<const format::ModelWeights> ModelCase::MakeWeights() const {
  return std::make_shared<const format::ModelWeights>(format::MakeRandomModel(config, seed, scale));
}

std::ostream& operator<<(std::ostream& os, const ModelCase& model) {
  if (!model.preset.empty()) os << model.preset << " ";
  os << "model(" << harness::ShapeParams(model.config);
  if (!model.scale.IsDefault()) os << ", scale=" << model.scale.ToString();
  return os << fmt::format(", seed={})", model.seed);
}

rc::Gen<ModelCase> GenSmallModel() {
  return rc::gen::exec([] {
    ModelCase model;
    format::LlamaConfig& c = model.config;
    c.num_hidden_layers = *rc::gen::inRange<int64_t>(1, 4);
    c.num_key_value_heads = Pick<int64_t>({1, 2});
    c.num_attention_heads = c.num_key_value_heads * Pick<int64_t>({1, 2, 3});  // n_rep 1..3
    c.head_dim = Pick<int64_t>({4, 8, 16});
    // At least kMinShapeWidth wide, as check --shapes random draws
    // (harness/campaign/shape_generator.h says why: narrower models are ill-conditioned in
    // float32).
    while (c.num_attention_heads * c.head_dim < harness::kMinShapeWidth) c.head_dim *= 2;
    c.hidden_size = c.num_attention_heads * c.head_dim;
    c.intermediate_size = *rc::gen::inRange<int64_t>(8, 65);
    c.vocab_size = *rc::gen::inRange<int64_t>(32, 513);
    c.max_position_embeddings = *rc::gen::inRange<int64_t>(8, 33);
    c.rope_theta = Pick<double>({10000.0, 500000.0});
    c.tie_word_embeddings = Pick<bool>({false, true});
    if (Pick<bool>({false, true})) {
      format::RopeScaling scaling;
      scaling.factor = Pick<double>({8.0, 2.0});
      scaling.original_max_position_embeddings = *rc::gen::inRange<int64_t>(8, 33);
      c.rope_scaling = scaling;
    }
    c.bos_token_id = 1;
    c.eos_token_id = 2;
    model.seed = *rc::gen::inRange<uint64_t>(0, 1u << 20);
    return model;
  });
}

rc::Gen<ModelCase> GenDemandingModel() {
  return rc::gen::map(GenSmallModel(), [](ModelCase model) {
    model.scale = format::RandomModelScale::Demanding();
    return model;
  });
}

rc::Gen<ModelCase> GenPresetModel(const std::string& preset) {
  return rc::gen::exec([preset] {
    ModelCase model;
    model.preset = preset;
    model.config = format::PresetConfig(preset);
    model.seed = *rc::gen::inRange<uint64_t>(0, 1u << 20);
    return model;
  });
}

rc::Gen<Tokens> GenTokens(int64_t vocab, int64_t length) {
  return rc::gen::exec([vocab, length] {
    Tokens tokens(static_cast<size_t>(length));
    for (auto& token : tokens) token = static_cast<Token>(*GenUniform(0, vocab));
    return tokens;
  });
}

rc::Gen<Tokens> GenPrompt(int64_t vocab, int64_t max_length) {
  return rc::gen::exec([vocab, max_length] {
    const int64_t length = *rc::gen::inRange<int64_t>(1, max_length + 1);
    return *GenTokens(vocab, length);
  });
}

rc::Gen<std::vector<int64_t>> GenChunks(int64_t n) {
  return rc::gen::exec([n] {
    std::vector<int64_t> chunks;
    switch (*GenUniform(0, 3)) {
      case 0:  // one chunk: the whole prompt in one call
        chunks.push_back(n);
        break;
      case 1:  // all ones: token by token, like a decode loop
        chunks.assign(static_cast<size_t>(n), 1);
        break;
      default: {  // cut after each token with probability 1/2
        int64_t current = 1;
        for (int64_t i = 1; i < n; ++i) {
          if (*GenUniform(0, 2) == 1) {
            chunks.push_back(current);
            current = 0;
          }
          ++current;
        }
        chunks.push_back(current);
      }
    }
    return chunks;
  });
}

std::vector<Tokens> SplitTokens(const Tokens& tokens, const std::vector<int64_t>& chunks) {
  std::vector<Tokens> pieces;
  size_t begin = 0;
  for (int64_t size : chunks) {
    pieces.emplace_back(tokens.begin() + begin, tokens.begin() + begin + size);
    begin += static_cast<size_t>(size);
  }
  return pieces;
}

}  // namespace kvdiff::props
