// `kvdiff generate`: greedy decoding from a prompt, through a cached Session or by recomputing the
// whole history each step (--uncached, the cross-check).
#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>

#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/engine_guard.h"
#include "format/chat_template.h"
#include "format/error.h"
#include "format/input_file.h"
#include "format/model_files.h"
#include "format/tokenizer.h"
#include "harness/backend/backend.h"
#include "harness/backend/registry.h"
#include "harness/compare/compare.h"
#include "harness/replay/replay.h"

namespace kvdiff::cli {
namespace {

std::string ReadChatFile(const std::string& path) { return format::ReadInputFile(path, "--chat"); }

}  // namespace

void AddGenerateCommand(CLI::App& app, int& exit_code) {
  struct Options {
    std::string model;
    std::optional<std::string> prompt;
    std::optional<std::string> tokens;
    std::optional<std::string> chat;
    int64_t n = 32;
    std::string backend = "impl";
    bool cached = false;
    bool uncached = false;
    bool ids = false;
    bool ignore_eos = false;
    int threads = 0;
  };
  auto opts = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "generate",
      "Greedy generation. Prints the prompt's text, then each generated token's text as it comes; "
      "stops after -n tokens, at the model's context length, or when the model emits BOS or EOS "
      "(the stop token is generated but has no text; with --ids it is the last id printed)");
  cmd->add_option("--model", opts->model, "model directory (config.json, model.safetensors)")
      ->required()
      ->check(CLI::ExistingDirectory);
  auto* prompt = cmd->add_option("--prompt", opts->prompt,
                                 "prompt text, encoded with DIR/tokenizer.kvdiff.json (else "
                                 "DIR/tokenizer.json) with a BOS first (\"\" = BOS alone)");
  auto* tokens = cmd->add_option("--tokens", opts->tokens,
                                 "prompt token ids, used as given (e.g. \"1\" or \"1,403,407\")");
  auto* chat = cmd->add_option("--chat", opts->chat,
                               "file of chat messages (JSON [{\"role\", \"content\"}] or lines "
                               "\"role: text\"), rendered with DIR/tokenizer_config.json's "
                               "chat_template and a generation prompt")
                   ->check(CLI::ExistingFile);
  prompt->excludes(tokens)->excludes(chat);
  tokens->excludes(prompt)->excludes(chat);
  chat->excludes(prompt)->excludes(tokens);
  cmd->add_option("-n", opts->n, "number of tokens to generate")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--backend", opts->backend,
                  "Backend: " + harness::BackendRegistry::Global().HelpText())
      ->capture_default_str();
  auto* cached =
      cmd->add_flag("--cached", opts->cached, "one Session, one Append per token (default)");
  auto* uncached = cmd->add_flag("--uncached", opts->uncached,
                                 "recompute ForwardFull over the whole history every step");
  cached->excludes(uncached);
  uncached->excludes(cached);
  cmd->add_flag("--ids", opts->ids,
                "print the generated token ids (not the prompt's) on one line instead of text");
  cmd->add_flag("--ignore-eos", opts->ignore_eos, "keep going past BOS/EOS");
  cmd->add_option("--threads", opts->threads, "threads for the backend (0 = all cores)")
      ->check(CLI::NonNegativeNumber);

  cmd->callback([opts, &exit_code] {
    SeparateReportFromEngines();  // what an engine prints is not the report
    KVDIFF_CHECK(opts->prompt || opts->tokens || opts->chat,
                 "generate: give --prompt TEXT, --chat FILE or --tokens IDS");
    auto weights = std::make_shared<const format::ModelWeights>(format::LoadModel(opts->model));
    const format::LlamaConfig& config = weights->config;
    std::optional<format::Tokenizer> tokenizer = format::Tokenizer::LoadFromModelDir(opts->model);
    if (tokenizer) tokenizer->CheckFitsVocabulary(config.vocab_size, opts->model);
    KVDIFF_CHECK(tokenizer || (opts->tokens && opts->ids),
                 "{} has no {} or {}: --prompt, --chat and text output need one (convert with "
                 "--tokenizer), or use --tokens IDS --ids",
                 opts->model, format::kTokenizerFileName, format::kHfTokenizerFileName);

    const Tokens prompt_tokens =
        opts->prompt ? tokenizer->Encode(*opts->prompt, /*add_bos=*/true)
        : opts->chat ? format::EncodeChat(opts->model, *tokenizer,
                                          format::ParseChatMessages(ReadChatFile(*opts->chat)),
                                          /*add_generation_prompt=*/true)
                     : ParseTokenIds("--tokens", *opts->tokens, config.vocab_size);
    KVDIFF_CHECK(!prompt_tokens.empty(), "generate: the prompt encodes to no tokens");
    const int64_t capacity = config.max_position_embeddings;
    KVDIFF_CHECK(static_cast<int64_t>(prompt_tokens.size()) <= capacity,
                 "generate: the prompt has {} tokens, the model's context is {} "
                 "(max_position_embeddings)",
                 prompt_tokens.size(), capacity);

    auto backend = harness::MakeBackend(opts->backend, weights, opts->threads);

    // Echo the prompt's text (not BOS/EOS, which have no text), as llama2.c does.
    auto is_stop = [&](Token t) { return t == config.bos_token_id || t == config.eos_token_id; };
    Token prev = -1;
    if (!opts->ids) {
      std::string text;
      for (Token t : prompt_tokens) {
        if (!is_stop(t)) text += tokenizer->Decode(t, prev);
        prev = t;
      }
      std::fwrite(text.data(), 1, text.size(), Report());
      std::fflush(Report());
    } else {
      prev = prompt_tokens.back();
    }

    // The prompt's rows, then one row per token fed: cached (one Append per token) or not
    // (ForwardFull of the whole history, --uncached); the last row chooses the next token.
    Tokens history = prompt_tokens;
    std::unique_ptr<harness::BackendSession> session;
    Logits logits;  // (rows, vocab)
    auto forward = [&](const Tokens& fed) {
      if (opts->uncached) {
        logits = backend->ForwardFull(history);
      } else {
        logits = session->Append(fed);
      }
      // The NaN/inf policy: a non-finite logit fails the backend (exit 1), it never picks a token.
      const std::string bad = harness::DescribeNonFiniteLogits(
          backend->Name(),
          fmt::format(", the call from position {}", history.size() - logits.rows()), logits.data(),
          logits.rows(), logits.cols());
      if (!bad.empty()) throw EngineError(bad);
      return logits.row(logits.rows() - 1).data();
    };
    if (opts->n > 0 && static_cast<int64_t>(history.size()) >= capacity) {
      fmt::print(stderr, "\nkvdiff: stopped at the model's context length {} after 0 tokens\n",
                 capacity);
    }
    if (opts->n == 0 || static_cast<int64_t>(history.size()) >= capacity) {
      fmt::print(Report(), "\n");
      exit_code = 0;
      return;
    }
    if (!opts->uncached) session = backend->NewSession();
    const float* row = forward(prompt_tokens);
    int64_t generated = 0;
    bool first_id = true;
    harness::Greedy(row, config.vocab_size, opts->n, [&](Token next) -> const float* {
      history.push_back(next);
      ++generated;
      const bool stop = !opts->ignore_eos && is_stop(next);
      if (opts->ids) {
        fmt::print(Report(), "{}{}", first_id ? "" : " ", next);
        first_id = false;
      } else if (!stop) {
        const std::string piece = tokenizer->Decode(next, prev);
        std::fwrite(piece.data(), 1, piece.size(), Report());
      }
      std::fflush(Report());
      prev = next;
      if (stop || generated == opts->n) return nullptr;
      if (static_cast<int64_t>(history.size()) >= capacity) {
        fmt::print(stderr, "\nkvdiff: stopped at the model's context length {} after {} tokens\n",
                   capacity, generated);
        return nullptr;
      }
      return forward({next});
    });
    fmt::print(Report(), "\n");
    exit_code = 0;
  });
}

}  // namespace kvdiff::cli
