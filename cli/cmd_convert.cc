// `kvdiff convert llama2c`: a llama2.c checkpoint (+ tokenizer.bin) to an HF layout directory.
// `kvdiff convert gguf`: an HF layout directory to one GGUF file for llama.cpp.
#include <fmt/format.h>

#include <filesystem>
#include <memory>
#include <string>
#include <variant>

#include "cli/commands.h"
#include "format/error.h"
#include "format/gguf.h"
#include "format/llama2c.h"
#include "format/model_files.h"
#include "format/tokenizer.h"

namespace kvdiff::cli {

void AddConvertCommand(CLI::App& app, int& exit_code) {
  CLI::App* convert =
      app.add_subcommand("convert", "Convert a model from another format to HF layout");
  convert->require_subcommand(1);

  struct Options {
    std::string checkpoint;
    std::string tokenizer;
    std::string out;
  };
  auto opts = std::make_shared<Options>();
  CLI::App* llama2c = convert->add_subcommand(
      "llama2c",
      "llama2.c checkpoint (version 0 .bin, e.g. stories260K.bin) -> DIR/config.json, "
      "DIR/model.safetensors (wq/wk permuted to the rotate-half RoPE layout) and "
      "DIR/tokenizer.kvdiff.json");
  llama2c->add_option("--checkpoint", opts->checkpoint, "llama2.c checkpoint file")
      ->required()
      ->check(CLI::ExistingFile);
  llama2c
      ->add_option("--tokenizer", opts->tokenizer,
                   "llama2.c tokenizer.bin (e.g. tok512.bin); without it the model has no "
                   "tokenizer and `generate` needs --tokens")
      ->check(CLI::ExistingFile);
  llama2c->add_option("--out", opts->out, "output model directory (created)")->required();
  llama2c->callback([opts, &exit_code] {
    format::ConvertLlama2c(opts->checkpoint, opts->tokenizer, opts->out);
    const format::LlamaConfig config =
        format::LoadConfig(std::filesystem::path(opts->out) / "config.json");
    fmt::print(
        "wrote {}: config.json, model.safetensors (hidden {}, layers {}, heads {}/{} kv, "
        "vocab {}, context {}, {} classifier){}\n",
        opts->out, config.hidden_size, config.num_hidden_layers, config.num_attention_heads,
        config.num_key_value_heads, config.vocab_size, config.max_position_embeddings,
        config.tie_word_embeddings ? "tied" : "untied",
        opts->tokenizer.empty() ? "" : std::string(", ") + format::kTokenizerFileName);
    exit_code = 0;
  });

  struct GgufOptions {
    std::string model;
    std::string out;
    std::string dtype = "f32";
  };
  auto gopts = std::make_shared<GgufOptions>();
  CLI::App* gguf = convert->add_subcommand(
      "gguf",
      "HF Llama directory -> one GGUF file for llama.cpp (llama.* keys, q/k rows permuted to the "
      "interleaved RoPE layout, the vocabulary of DIR/tokenizer.kvdiff.json or \"none\")");
  gguf->add_option("--model", gopts->model, "HF model directory (config.json + model.safetensors)")
      ->required()
      ->check(CLI::ExistingDirectory);
  gguf->add_option("--out", gopts->out, "output .gguf file (written atomically)")->required();
  gguf->add_option("--dtype", gopts->dtype,
                   "dtype of the matrices: f32, f16 or bf16 (norms stay f32)")
      ->capture_default_str();
  gguf->callback([gopts, &exit_code] {
    format::DType dtype = format::DType::kF32;
    if (gopts->dtype == "f16") {
      dtype = format::DType::kF16;
    } else if (gopts->dtype == "bf16") {
      dtype = format::DType::kBF16;
    } else if (gopts->dtype != "f32") {
      throw InputError(
          fmt::format("--dtype: expected f32, f16 or bf16, found \"{}\"", gopts->dtype));
    }
    format::ConvertHfToGguf(gopts->model, gopts->out, dtype);
    const format::GgufHeader header = format::ReadGgufHeader(gopts->out);
    const format::GgufKv* vocab = header.Find("tokenizer.ggml.model");
    fmt::print("wrote {}: GGUF v{}, {} tensors ({}), {} metadata keys, tokenizer \"{}\"\n",
               gopts->out, header.version, header.tensors.size(), gopts->dtype,
               header.metadata.size(), vocab ? std::get<std::string>(vocab->value) : "?");
    exit_code = 0;
  });
}

}  // namespace kvdiff::cli
