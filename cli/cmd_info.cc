// kvdiff info: what a model directory holds, validated against its config.json.
#include <fmt/format.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "format/chat_template.h"
#include "format/error.h"
#include "format/model_files.h"
#include "format/tokenizer.h"

namespace kvdiff::cli {
namespace {

std::string HumanBytes(uint64_t bytes) {
  if (bytes >= (uint64_t{1} << 30)) return fmt::format("{:.2f} GiB", bytes / double(1 << 30));
  if (bytes >= (uint64_t{1} << 20)) return fmt::format("{:.1f} MiB", bytes / double(1 << 20));
  if (bytes >= 1024) return fmt::format("{:.1f} KiB", bytes / 1024.0);
  return fmt::format("{} B", bytes);
}

// The tokenizer LoadFromModelDir picks and the chat template, both parsed in full (so a file
// kvdiff would refuse at generate time is refused here) and checked against config.json.
void PrintTokenizer(const std::string& dir, const format::LlamaConfig& c) {
  const std::optional<format::Tokenizer> tokenizer = format::Tokenizer::LoadFromModelDir(dir);
  if (!tokenizer) {
    fmt::print("tokenizer     none ({} or {}): token ids only\n", format::kTokenizerFileName,
               format::kHfTokenizerFileName);
    return;
  }
  tokenizer->CheckFitsVocabulary(c.vocab_size, dir);
  if (tokenizer->Hf()) {
    fmt::print("tokenizer     {}\n", tokenizer->Hf()->Describe());
  } else {
    fmt::print("tokenizer     {}: {} pieces\n", tokenizer->FileName(), tokenizer->VocabSize());
  }
  const std::optional<format::ModelChatTemplate> chat = format::LoadChatTemplate(dir);
  fmt::print("chat template {}\n", chat ? "tokenizer_config.json (parsed)" : "none");
}

void RunInfo(const std::string& dir) {
  const format::ModelFileInfo info = format::InspectModel(dir);
  const format::LlamaConfig& c = info.config;
  std::string rope = "none";
  if (c.rope_scaling) {
    rope = fmt::format("llama3 (factor {}, low {}, high {}, original max positions {})",
                       c.rope_scaling->factor, c.rope_scaling->low_freq_factor,
                       c.rope_scaling->high_freq_factor,
                       c.rope_scaling->original_max_position_embeddings);
  }
  std::vector<std::string> dtypes;
  for (const auto& [name, count] : info.tensors_by_dtype) {
    dtypes.push_back(fmt::format("{} x {}", count, name));
  }
  std::vector<std::string> files;
  for (const auto& path : info.safetensors_files) files.push_back(path.filename().string());

  fmt::print("model         {}\n", dir);
  fmt::print("layers        {}\n", c.num_hidden_layers);
  fmt::print("hidden        {} (intermediate {})\n", c.hidden_size, c.intermediate_size);
  fmt::print("attention     {} heads, {} KV heads, head_dim {}\n", c.num_attention_heads,
             c.num_key_value_heads, c.head_dim);
  fmt::print("vocab         {}\n", c.vocab_size);
  fmt::print("positions     {} max, rope_theta {}, rope_scaling {}\n", c.max_position_embeddings,
             c.rope_theta, rope);
  fmt::print("rms_norm_eps  {}\n", c.rms_norm_eps);
  fmt::print("head          {}\n", c.tie_word_embeddings ? "tied to the embedding" : "untied");
  fmt::print("tokens        bos {}, eos {}\n", c.bos_token_id, c.eos_token_id);
  fmt::print("parameters    {} ({:.1f} M)\n", info.num_parameters, info.num_parameters / 1e6);
  fmt::print("tensors       {} ({})\n", info.num_tensors, fmt::join(dtypes, ", "));
  fmt::print("torch_dtype   {} (config.json)\n", c.torch_dtype);
  fmt::print("on disk       {}: {} bytes ({})\n", fmt::join(files, ", "), info.file_bytes,
             HumanBytes(info.file_bytes));
  fmt::print("in memory     {} (float32)\n",
             HumanBytes(static_cast<uint64_t>(info.num_parameters) * 4));
  if (!info.ignored_tensors.empty()) {
    fmt::print("ignored       {}\n", fmt::join(info.ignored_tensors, ", "));
  }
  PrintTokenizer(dir, c);
}

}  // namespace

void AddInfoCommand(CLI::App& app, int& exit_code) {
  auto dir = std::make_shared<std::string>();
  CLI::App* cmd = app.add_subcommand(
      "info", "Show a model's config, parameter count and size, after validating its files");
  cmd->add_option("--model", *dir, "Model directory (config.json + model.safetensors)")->required();
  cmd->callback([dir, &exit_code] {
    RunInfo(*dir);
    exit_code = 0;
  });
}

}  // namespace kvdiff::cli
