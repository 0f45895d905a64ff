#include "format/chat_template.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <utility>

#include "format/chat_template_syntax.h"
#include "format/error.h"
#include "format/input_file.h"
#include "format/json_document.h"
#include "format/tokenizer.h"

namespace kvdiff::format {

using chat_template_detail::Dict;
using chat_template_detail::List;
using chat_template_detail::Value;

ChatTemplate::ChatTemplate(const std::string& source) {
  auto root = std::make_shared<Node>();
  root->kind = Node::kIf;  // an always-true if holding the template's nodes
  root->body = chat_template_detail::ParseTemplate(chat_template_detail::Lex(source));
  root_ = root;
}

std::string ChatTemplate::Render(const std::vector<ChatMessage>& messages,
                                 bool add_generation_prompt, const std::string& bos_token,
                                 const std::string& eos_token) const {
  List list;
  for (const ChatMessage& m : messages) {
    list.push_back(
        Value::MakeDict({{"role", Value::Str(m.role)}, {"content", Value::Str(m.content)}}));
  }
  return chat_template_detail::RenderTemplate(
      root_->body, {{"messages", Value::MakeList(std::move(list))},
                    {"add_generation_prompt", Value::Bool(add_generation_prompt)},
                    {"bos_token", Value::Str(bos_token)},
                    {"eos_token", Value::Str(eos_token)}});
}

std::vector<ChatMessage> ParseChatMessages(const std::string& text) {
  std::vector<ChatMessage> messages;
  size_t first = text.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && text[first] == '[') {
    const nlohmann::json j = ParseJsonDocument(text, "chat messages");
    for (size_t i = 0; i < j.size(); ++i) {
      const auto& m = j[i];
      KVDIFF_CHECK(m.is_object() && m.contains("role") && m["role"].is_string() &&
                       m.contains("content") && m["content"].is_string(),
                   "chat messages[{}]: expected {{\"role\": string, \"content\": string}}, got {}",
                   i, JsonSnippet(m));
      messages.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
    }
  } else {
    size_t line_no = 0;
    size_t begin = 0;
    while (begin <= text.size()) {
      size_t end = text.find('\n', begin);
      if (end == std::string::npos) end = text.size();
      std::string line = text.substr(begin, end - begin);
      ++line_no;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      size_t k = 0;
      while (k < line.size() &&
             (std::isalnum(static_cast<unsigned char>(line[k])) || line[k] == '_'))
        ++k;
      if (k > 0 && k < line.size() && line[k] == ':') {
        std::string content = line.substr(k + 1);
        if (!content.empty() && content[0] == ' ') content.erase(0, 1);
        messages.push_back({line.substr(0, k), content});
      } else if (!(end == text.size() && line.empty())) {
        KVDIFF_CHECK(!messages.empty(),
                     "chat messages line {}: expected \"role: text\" (e.g. \"user: Hello\"), got "
                     "{}",
                     line_no, JsonSnippet(nlohmann::json(line)));
        messages.back().content += "\n" + line;
      }
      begin = end + 1;
    }
  }
  KVDIFF_CHECK(!messages.empty(), "chat messages: none given");
  return messages;
}

std::optional<ModelChatTemplate> LoadChatTemplate(const std::filesystem::path& dir) {
  const auto path = dir / "tokenizer_config.json";
  if (!std::filesystem::exists(path)) return std::nullopt;
  const nlohmann::json config =
      ParseJsonDocument(ReadInputFile(path, "tokenizer config"), path.string());
  if (!config.is_object() || !config.contains("chat_template") ||
      config["chat_template"].is_null()) {
    return std::nullopt;
  }
  KVDIFF_CHECK(config["chat_template"].is_string(),
               "{}: chat_template is a {}; only a single template (a string) is implemented",
               path.string(), config["chat_template"].type_name());
  std::string tokens[2];
  const char* keys[2] = {"bos_token", "eos_token"};
  for (int k = 0; k < 2; ++k) {
    if (!config.contains(keys[k]) || config[keys[k]].is_null()) continue;
    const auto& v = config[keys[k]];
    const auto& content = v.is_object() && v.contains("content") ? v["content"] : v;
    KVDIFF_CHECK(content.is_string(), "{}: {} must be a string or {{\"content\": ...}}",
                 path.string(), keys[k]);
    tokens[k] = content.get<std::string>();
  }
  try {
    return ModelChatTemplate{ChatTemplate(config["chat_template"].get<std::string>()), tokens[0],
                             tokens[1]};
  } catch (const InputError& e) {
    throw InputError(fmt::format("{}: chat_template: {}", path.string(), e.what()));
  }
}

Tokens EncodeChat(const std::filesystem::path& dir, const Tokenizer& tokenizer,
                  const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                  std::string* prompt) {
  const std::optional<ModelChatTemplate> chat = LoadChatTemplate(dir);
  KVDIFF_CHECK(chat, "{} has no chat template (tokenizer_config.json with a \"chat_template\")",
               dir.string());
  const std::string text =
      chat->chat_template.Render(messages, add_generation_prompt, chat->bos_token, chat->eos_token);
  if (prompt != nullptr) *prompt = text;
  return tokenizer.Encode(text, /*add_bos=*/false);
}

}  // namespace kvdiff::format
