// Helpers for the repro tests: models (the tiny preset, a converted stories260K, a model that does
// not see positions) and the kvdiff binary (RunKvdiff from the harness tests).
#pragma once

#include <filesystem>
#include <memory>
#include <string>

#include "format/llama2c.h"
#include "format/model_files.h"
#include "format/tensor.h"
#include "tests/harness/harness_test_util.h"

namespace kvdiff::testing {

inline std::shared_ptr<const format::ModelWeights> TinyWeights(uint64_t seed = 3) {
  return std::make_shared<const format::ModelWeights>(
      format::MakeRandomModel(format::PresetConfig("tiny"), seed));
}

// The tiny preset with q_proj and k_proj zeroed: every attention score is 0 whatever the positions
// (RoPE rotates zero vectors), so a wrong index_pos changes nothing and pos0 cannot reproduce.
inline format::ModelWeights PositionBlindTiny(uint64_t seed = 3) {
  format::ModelWeights w = format::MakeRandomModel(format::PresetConfig("tiny"), seed);
  for (auto& [name, tensor] : w.tensors) {
    if (name.find("q_proj") != std::string::npos || name.find("k_proj") != std::string::npos) {
      std::fill(tensor.data.begin(), tensor.data.end(), 0.0f);
    }
  }
  return w;
}

// stories260K converted into dir (config.json, model.safetensors, tokenizer.kvdiff.json).
inline void ConvertStories(const std::filesystem::path& data, const std::filesystem::path& dir) {
  format::ConvertLlama2c(data / "stories260K" / "stories260K.bin",
                         data / "stories260K" / "tok512.bin", dir);
}

}  // namespace kvdiff::testing
