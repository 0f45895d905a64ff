// `kvdiff tokenize`: the ids a model directory's tokenizer gives for a text or a chat (the ids
// generate, scenarios and repro will use), and the text of given ids. Needs only the tokenizer
// files (tokenizer.kvdiff.json, or tokenizer.json + tokenizer_config.json), no weights.
#include <fmt/format.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "cli/cli_util.h"
#include "cli/commands.h"
#include "format/chat_template.h"
#include "format/error.h"
#include "format/input_file.h"
#include "format/tokenizer.h"

namespace kvdiff::cli {
namespace {

std::string ReadTextFile(const std::string& path) { return format::ReadInputFile(path, "--chat"); }

// Text for a JSON value: bytes that are not UTF-8 (a partial character) become U+FFFD there only.
nlohmann::json JsonText(const std::string& bytes) {
  return nlohmann::json::parse(
      nlohmann::json(bytes).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

}  // namespace

void AddTokenizeCommand(CLI::App& app, int& exit_code) {
  struct Options {
    std::string model;
    std::optional<std::string> text, chat, decode;
    bool no_special = false;
    bool no_generation_prompt = false;
    bool json = false;
  };
  auto opts = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "tokenize",
      "Print the token ids of a text (--text) or of a chat rendered with the model's chat template "
      "(--chat), or the text of ids (--decode), with the model directory's tokenizer "
      "(tokenizer.kvdiff.json, else tokenizer.json)");
  cmd->add_option("--model", opts->model, "model directory (only its tokenizer files are read)")
      ->required()
      ->check(CLI::ExistingDirectory);
  auto* text = cmd->add_option("--text", opts->text,
                               "text to encode, with the tokenizer's special tokens (BOS) added");
  auto* chat = cmd->add_option("--chat", opts->chat,
                               "file of messages: a JSON array of {\"role\", \"content\"} or "
                               "lines \"role: text\"; rendered with tokenizer_config.json's "
                               "chat_template and encoded without added special tokens")
                   ->check(CLI::ExistingFile);
  auto* decode = cmd->add_option("--decode", opts->decode,
                                 "token ids to decode (e.g. \"1,15043\"); special tokens are kept");
  text->excludes(chat)->excludes(decode);
  chat->excludes(text)->excludes(decode);
  decode->excludes(text)->excludes(chat);
  cmd->add_flag("--no-special", opts->no_special, "--text: do not add special tokens (BOS)");
  cmd->add_flag("--no-generation-prompt", opts->no_generation_prompt,
                "--chat: render without add_generation_prompt");
  cmd->add_flag("--json", opts->json,
                "print {\"ids\": [...], \"text\": ...} (and \"prompt\" for --chat) as JSON");

  cmd->callback([opts, &exit_code] {
    KVDIFF_CHECK(opts->text || opts->chat || opts->decode,
                 "tokenize: give --text TEXT, --chat FILE or --decode IDS");
    const std::optional<format::Tokenizer> tokenizer =
        format::Tokenizer::LoadFromModelDir(opts->model);
    KVDIFF_CHECK(tokenizer, "{} has no tokenizer ({} or {})", opts->model,
                 format::kTokenizerFileName, format::kHfTokenizerFileName);

    Tokens ids;
    std::optional<std::string> prompt;
    if (opts->decode) {
      ids = ParseTokenIds("--decode", *opts->decode, tokenizer->VocabSize());
    } else if (opts->text) {
      ids = tokenizer->Encode(*opts->text, /*add_bos=*/!opts->no_special);
    } else {
      prompt.emplace();
      ids = format::EncodeChat(opts->model, *tokenizer,
                               format::ParseChatMessages(ReadTextFile(*opts->chat)),
                               !opts->no_generation_prompt, &*prompt);
    }
    // Whole-sequence decoding where the tokenizer has it (tokenizer.json), else token by token.
    const std::string decoded =
        tokenizer->Hf() ? tokenizer->Hf()->Decode(ids, false) : tokenizer->DecodeAll(ids, -1);
    if (opts->json) {
      nlohmann::json out = {{"ids", ids}, {"text", JsonText(decoded)}};
      if (prompt) out["prompt"] = *prompt;
      fmt::print("{}\n", out.dump());
    } else if (opts->decode) {
      std::fwrite(decoded.data(), 1, decoded.size(), stdout);
      fmt::print("\n");
    } else {
      fmt::print("{}\n", fmt::join(ids, " "));
    }
    exit_code = 0;
  });
}

}  // namespace kvdiff::cli
