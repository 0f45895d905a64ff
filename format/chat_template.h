// Chat templates: tokenizer_config.json's "chat_template" (Jinja) rendered for a list of messages,
// as transformers' apply_chat_template(messages, add_generation_prompt=...) renders it.
//
// A small interpreter of the Jinja subset that Llama-family templates use (SmolLM2's ChatML,
// Llama 2's, Llama 3's): text, {{ expr }}, {% set %}, {% if/elif/else %}, {% for x in xs %} with
// loop.index/index0/first/last/length, {# comments #}, whitespace control (-), and Jinja's
// trim_blocks + lstrip_blocks as transformers enables them. Expressions: literals, variables,
// ['key'] and .attr, [i] and [a:b:c] slices, + - * % ~, == != < > <= >=, in / not in, and/or/not,
// "x if c else y", is [not] defined/none/string/number, filters trim length upper lower first last
// default string, methods strip lstrip rstrip upper lower startswith endswith get, and
// raise_exception(message). Anything else is an InputError naming the construct, never a prompt.
// What a template may ask for is bounded (an InputError beyond): nesting 100 levels deep, a
// million rendering steps, texts of 4 MiB and 128 MiB of them in all, lists of 2^20 items.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "format/tensor.h"

namespace kvdiff::format {

class Tokenizer;

struct ChatMessage {
  std::string role;
  std::string content;
};

// Messages from a file's text: a JSON array of {"role": ..., "content": ...} objects, or lines
// "role: text" (role a word of letters, digits and _; a line that starts otherwise continues the
// previous message after a "\n"). Throws InputError naming the line or element.
std::vector<ChatMessage> ParseChatMessages(const std::string& text);

class ChatTemplate {
 public:
  // Parses the whole template: a syntax error or an unsupported construct throws InputError with
  // the construct and its line.
  explicit ChatTemplate(const std::string& source);

  // Renders with the variables messages, add_generation_prompt, bos_token and eos_token. Throws
  // InputError for raise_exception (with its message) and for a type error at run time.
  std::string Render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                     const std::string& bos_token, const std::string& eos_token) const;

  struct Node;

 private:
  std::shared_ptr<const Node> root_;
};

// A model directory's chat template and the BOS/EOS strings it is rendered with.
struct ModelChatTemplate {
  ChatTemplate chat_template;
  std::string bos_token, eos_token;  // "" when tokenizer_config.json does not name them
};

// DIR/tokenizer_config.json's "chat_template" (a string) and bos_token/eos_token; std::nullopt
// when the file or the field is absent. A list of named templates is refused (InputError).
std::optional<ModelChatTemplate> LoadChatTemplate(const std::filesystem::path& dir);

// The ids of DIR's chat template rendered for the messages, encoded without adding special tokens
// (the template writes BOS itself), as apply_chat_template(tokenize=True) does. The rendered text
// goes to *prompt when given. InputError when DIR has no chat template.
Tokens EncodeChat(const std::filesystem::path& dir, const Tokenizer& tokenizer,
                  const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                  std::string* prompt = nullptr);

}  // namespace kvdiff::format
