// kvdiff make-model: a random Llama model directory, byte-identical for the same arguments.
#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "format/error.h"
#include "format/model_files.h"

namespace kvdiff::cli {
namespace {

struct MakeModelOptions {
  std::string preset;
  std::string config_path;
  uint64_t seed = 0;
  std::string out;
  std::string dtype = "f32";
  bool tied = false;
  bool untied = false;
  std::string scale = "default";
  int64_t sliding_window = 0;  // 0: as the preset or config says
  bool sliding_window_given = false;
};

format::DType DTypeFromFlag(const std::string& flag) {
  if (flag == "f32") return format::DType::kF32;
  if (flag == "bf16") return format::DType::kBF16;
  if (flag == "f16") return format::DType::kF16;
  throw InputError(fmt::format("--dtype: expected f32, bf16 or f16, found \"{}\"", flag));
}

// float16 holds magnitudes up to 65504 and down to 6e-8: a scaled model's weights may not fit,
// and a weight rounded to inf or 0 on disk would be a different model, not a scaled one.
void CheckFitsFloat16(const format::ModelWeights& model, const std::string& scale) {
  for (const auto& [name, t] : model.tensors) {
    for (float v : t.data) {
      const float a = std::fabs(v);
      KVDIFF_CHECK(a <= 65504.0f && (a == 0 || a >= 6e-8f),
                   "--dtype f16: --scale {} gives {} a weight of {}, outside float16's range "
                   "(6e-8 to 65504); use --dtype f32 or bf16",
                   scale, name, v);
    }
  }
}

void RunMakeModel(const MakeModelOptions& o) {
  KVDIFF_CHECK(o.preset.empty() != o.config_path.empty(),
               "make-model: give exactly one of --preset ({}) or --config FILE",
               fmt::join(format::PresetNames(), "|"));
  format::LlamaConfig config =
      o.preset.empty() ? format::LoadConfig(o.config_path) : format::PresetConfig(o.preset);
  if (o.tied) config.tie_word_embeddings = true;
  if (o.untied) config.tie_word_embeddings = false;
  if (o.sliding_window_given) {
    KVDIFF_CHECK(o.sliding_window >= 1,
                 "--sliding-window: expected a window of at least 1 position, found {}",
                 o.sliding_window);
    config.sliding_window = o.sliding_window;
    config.Validate();  // a window larger than the context is refused, naming both numbers
  }
  const format::DType dtype = DTypeFromFlag(o.dtype);

  const format::RandomModelScale scale = format::ParseRandomModelScale(o.scale, "--scale");
  const format::ModelWeights model = format::MakeRandomModel(config, o.seed, scale);
  if (dtype == format::DType::kF16) CheckFitsFloat16(model, o.scale);
  const std::filesystem::path dir = o.out;
  format::SaveModel(dir, model, dtype);
  const auto bytes = std::filesystem::file_size(dir / "model.safetensors");
  fmt::print(
      "wrote {} and {}: {} seed {}{}, {}, {} layers, hidden {}, vocab {}, {} head, "
      "{} parameters, {} bytes\n",
      (dir / "config.json").string(), (dir / "model.safetensors").string(),
      o.preset.empty() ? "config " + o.config_path + "," : "preset " + o.preset + ",", o.seed,
      scale.IsDefault() ? std::string() : ", scale " + scale.ToString(), format::DTypeName(dtype),
      config.num_hidden_layers, config.hidden_size, config.vocab_size,
      config.tie_word_embeddings ? "tied" : "untied", model.NumParameters(), bytes);
}

}  // namespace

void AddMakeModelCommand(CLI::App& app, int& exit_code) {
  auto options = std::make_shared<MakeModelOptions>();
  CLI::App* cmd = app.add_subcommand(
      "make-model",
      "Write a random Llama model (config.json + model.safetensors), the same bytes for the same "
      "arguments on every machine");
  auto* preset =
      cmd->add_option("--preset", options->preset, "Model shape: tiny, tiny-swa or smollm2-135m")
          ->check(CLI::IsMember(format::PresetNames()));
  auto* config = cmd->add_option("--config", options->config_path,
                                 "Model shape from a HuggingFace config.json instead of a preset")
                     ->check(CLI::ExistingFile);
  preset->excludes(config);
  cmd->add_option("--seed", options->seed, "Seed of the random weights")->capture_default_str();
  cmd->add_option("--out", options->out, "Output directory (created if needed)")->required();
  cmd->add_option("--dtype", options->dtype, "Dtype on disk (config.json's torch_dtype follows)")
      ->check(CLI::IsMember({"f32", "bf16", "f16"}))
      ->capture_default_str();
  cmd->add_option("--scale", options->scale,
                  "Push the numbers beyond the defaults: \"demanding\" (attention scores x25, "
                  "hidden states x1e19, logits x300) or factors "
                  "\"scores=F,activations=F,logits=F\" (docs/models-and-text.md)")
      ->capture_default_str();
  auto* tied = cmd->add_flag("--tied", options->tied, "Tie lm_head to the embedding");
  auto* untied = cmd->add_flag("--untied", options->untied, "Store a separate lm_head.weight");
  tied->excludes(untied);
  cmd->add_option("--sliding-window", options->sliding_window,
                  "Sliding-window attention in every layer: each query sees the last N positions "
                  "(config.json's sliding_window, written as a Mistral model)")
      ->each([options](const std::string&) { options->sliding_window_given = true; });
  cmd->callback([options, &exit_code] {
    RunMakeModel(*options);
    exit_code = 0;
  });
}

}  // namespace kvdiff::cli
