// The chat template's lexer: @huggingface/jinja's preprocessing, then tokens.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "format/chat_template_syntax.h"
#include "format/error.h"

namespace kvdiff::format::chat_template_detail {
namespace {

bool IsWs(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

// @huggingface/jinja's preprocess (transformers renders with trim_blocks and lstrip_blocks): drop
// one trailing newline; remove spaces/tabs from a line's start up to "{%" "{#" "{-"; remove the
// newline right after "%}" "#}" "-}".
std::string Preprocess(std::string s) {
  if (!s.empty() && s.back() == '\n') s.pop_back();
  std::string out;
  size_t line_start = 0;
  for (size_t i = 0; i <= s.size(); ++i) {
    if (i == s.size() || s[i] == '\n') {
      std::string line = s.substr(line_start, i - line_start);
      size_t k = 0;
      while (k < line.size() && (line[k] == ' ' || line[k] == '\t')) ++k;
      if (k + 1 < line.size() && line[k] == '{' &&
          (line[k + 1] == '#' || line[k + 1] == '%' || line[k + 1] == '-')) {
        line.erase(0, k);
      }
      out += line;
      if (i < s.size()) out += '\n';
      line_start = i + 1;
    }
  }
  std::string trimmed;
  for (size_t i = 0; i < out.size(); ++i) {
    trimmed += out[i];
    if (out[i] == '}' && i > 0 && (out[i - 1] == '#' || out[i - 1] == '%' || out[i - 1] == '-') &&
        i + 1 < out.size() && out[i + 1] == '\n') {
      ++i;  // drop the newline
    }
  }
  return trimmed;
}

}  // namespace

std::vector<Tok> Lex(const std::string& source) {
  const std::string src = Preprocess(source);
  std::vector<Tok> toks;
  size_t pos = 0;
  int line = 1;
  auto advance = [&](size_t n) {
    for (size_t k = 0; k < n && pos < src.size(); ++k, ++pos) {
      if (src[pos] == '\n') ++line;
    }
  };
  auto strip_trailing = [&] {
    if (!toks.empty() && toks.back().kind == Tok::kText) {
      std::string& t = toks.back().text;
      while (!t.empty() && IsWs(t.back())) t.pop_back();
      if (t.empty()) toks.pop_back();
    }
  };
  auto skip_ws = [&] {
    while (pos < src.size() && IsWs(src[pos])) advance(1);
  };
  auto starts = [&](const char* p) { return src.compare(pos, std::strlen(p), p) == 0; };
  bool in_tag = false;
  bool open_is_stmt = false;
  while (pos < src.size()) {
    if (!in_tag) {
      const int text_line = line;
      std::string text;
      while (pos < src.size() &&
             !(src[pos] == '{' && pos + 1 < src.size() &&
               (src[pos + 1] == '%' || src[pos + 1] == '{' || src[pos + 1] == '#'))) {
        text += src[pos];
        advance(1);
      }
      if (!text.empty()) toks.push_back({Tok::kText, text, text_line});
      if (pos >= src.size()) break;
      if (starts("{#")) {
        const int comment_line = line;
        advance(2);
        const bool strip_before = pos < src.size() && src[pos] == '-';
        const size_t end = src.find("#}", pos);
        KVDIFF_CHECK(end != std::string::npos, "chat template line {}: a {{# comment is not closed",
                     comment_line);
        const bool strip_after = end > pos && src[end - 1] == '-';
        if (strip_before) strip_trailing();
        advance(end + 2 - pos);
        if (strip_after) skip_ws();
        continue;
      }
      const bool stmt = starts("{%");
      const int open_line = line;
      advance(2);
      if (pos < src.size() && src[pos] == '-') {
        strip_trailing();
        advance(1);
      }
      toks.push_back({stmt ? Tok::kOpenStmt : Tok::kOpenExpr, stmt ? "{%" : "{{", open_line});
      in_tag = true;
      open_is_stmt = stmt;
      continue;
    }
    skip_ws();
    KVDIFF_CHECK(pos < src.size(), "chat template line {}: a tag is not closed", line);
    const int tok_line = line;
    if (starts("-%}") || starts("-}}") || starts("%}") || starts("}}")) {
      const bool dash = src[pos] == '-';
      const bool stmt = src[pos + (dash ? 1 : 0)] == '%';
      KVDIFF_CHECK(stmt == open_is_stmt,
                   "chat template line {}: \"{}\" closes a tag opened by \"{}\"", tok_line,
                   stmt ? "%}" : "}}", open_is_stmt ? "{%" : "{{");
      advance(dash ? 3 : 2);
      toks.push_back({stmt ? Tok::kCloseStmt : Tok::kCloseExpr, stmt ? "%}" : "}}", tok_line});
      if (dash) skip_ws();
      in_tag = false;
      continue;
    }
    const char c = src[pos];
    if (c == '\'' || c == '"') {
      advance(1);
      std::string value;
      while (true) {
        KVDIFF_CHECK(pos < src.size(), "chat template line {}: a string is not closed", tok_line);
        const char d = src[pos];
        if (d == c) break;
        if (d == '\\') {
          KVDIFF_CHECK(pos + 1 < src.size(), "chat template line {}: a string is not closed",
                       tok_line);
          const char e = src[pos + 1];
          static const std::map<char, char> kEscapes = {{'n', '\n'},  {'t', '\t'}, {'r', '\r'},
                                                        {'b', '\b'},  {'f', '\f'}, {'v', '\v'},
                                                        {'\'', '\''}, {'"', '"'},  {'\\', '\\'}};
          auto it = kEscapes.find(e);
          KVDIFF_CHECK(it != kEscapes.end(),
                       "chat template line {}: the escape \\{} is not implemented", tok_line, e);
          value += it->second;
          advance(2);
          continue;
        }
        value += d;
        advance(1);
      }
      advance(1);
      toks.push_back({Tok::kString, value, tok_line});
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      std::string digits;
      while (pos < src.size() && std::isdigit(static_cast<unsigned char>(src[pos]))) {
        digits += src[pos];
        advance(1);
      }
      KVDIFF_CHECK(!(pos < src.size() && src[pos] == '.' && pos + 1 < src.size() &&
                     std::isdigit(static_cast<unsigned char>(src[pos + 1]))),
                   "chat template line {}: floating-point numbers are not implemented", tok_line);
      KVDIFF_CHECK(digits.size() <= 18, "chat template line {}: the number {} is too large",
                   tok_line, digits);
      toks.push_back({Tok::kInt, digits, tok_line});
    } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      std::string name;
      while (pos < src.size() &&
             (std::isalnum(static_cast<unsigned char>(src[pos])) || src[pos] == '_')) {
        name += src[pos];
        advance(1);
      }
      toks.push_back({Tok::kName, name, tok_line});
    } else {
      static const char* kOps[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*",
                                   "/",  "%",  "~",  "<",  ">",  "=",  "(", ")", "[",
                                   "]",  "{",  "}",  ",",  ".",  ":",  "|"};
      bool found = false;
      for (const char* op : kOps) {
        if (starts(op)) {
          toks.push_back({Tok::kOp, op, tok_line});
          advance(std::strlen(op));
          found = true;
          break;
        }
      }
      KVDIFF_CHECK(found, "chat template line {}: unexpected character '{}'", tok_line, c);
    }
  }
  KVDIFF_CHECK(!in_tag, "chat template line {}: a tag is not closed at the end", line);
  toks.push_back({Tok::kEnd, "", line});
  return toks;
}

}  // namespace kvdiff::format::chat_template_detail
