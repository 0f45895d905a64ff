#include "format/json_document.h"

#include <fmt/format.h>

#include <set>
#include <vector>

#include "format/error.h"

namespace kvdiff::format {
namespace {

using json = nlohmann::json;

// The byte offset where nesting first exceeds kMaxJsonDepth, or npos. Brackets inside strings do
// not count; escapes inside strings are skipped. The text need not be valid JSON: the parser
// judges the rest.
size_t FindTooDeep(std::string_view text) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth) return i;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return std::string_view::npos;
}

std::string Cut(std::string s, size_t max_chars) {
  if (s.size() <= max_chars) return s;
  s.resize(max_chars);
  // Never end inside a UTF-8 sequence.
  while (!s.empty() && (static_cast<unsigned char>(s.back()) & 0xC0) == 0x80) s.pop_back();
  if (!s.empty() && static_cast<unsigned char>(s.back()) >= 0xC0) s.pop_back();
  return s + "...";
}

// Appends `value` to `out` until out holds more than `limit` characters. Recursion is bounded by
// the depth of a parsed document (kMaxJsonDepth) and stops as soon as the budget is spent.
void AppendSnippet(const json& value, size_t limit, std::string& out) {
  if (out.size() > limit) return;
  if (value.is_string()) {
    // Only the part that can be shown is quoted.
    const std::string& s = value.get_ref<const std::string&>();
    const std::string head = s.size() > limit ? s.substr(0, limit + 1) : s;
    out += json(head).dump(-1, ' ', false, json::error_handler_t::replace);
  } else if (value.is_array()) {
    out += '[';
    bool first = true;
    for (const auto& item : value) {
      if (out.size() > limit) return;
      if (!first) out += ',';
      first = false;
      AppendSnippet(item, limit, out);
    }
    out += ']';
  } else if (value.is_object()) {
    out += '{';
    bool first = true;
    for (auto it = value.begin(); it != value.end(); ++it) {
      if (out.size() > limit) return;
      if (!first) out += ',';
      first = false;
      AppendSnippet(json(it.key()), limit, out);
      out += ':';
      AppendSnippet(it.value(), limit, out);
    }
    out += '}';
  } else {
    out += value.dump();
  }
}

// nlohmann's DOM builder, refusing a duplicate key in one object (the last would silently win).
// Not json::parse with a parser_callback_t: after every object that callback parser scans the
// whole enclosing array or object for values to discard, so an array of n objects cost n^2/2
// steps (10^6 empty objects, 3 MB, ran for minutes). This keeps one set of keys per open object
// and does nothing per value: reading is linear in the text.
class UniqueKeysDom : public nlohmann::detail::json_sax_dom_parser<json> {
 public:
  UniqueKeysDom(json& root, const std::string& what) : json_sax_dom_parser(root), what_(what) {}
  bool start_object(size_t size) {
    keys_.emplace_back();
    return json_sax_dom_parser::start_object(size);
  }
  bool key(std::string& key) {
    KVDIFF_CHECK(keys_.back().insert(key).second, "{}: invalid JSON: duplicate key {} in an object",
                 what_, JsonSnippet(json(key)));
    return json_sax_dom_parser::key(key);
  }
  bool end_object() {
    keys_.pop_back();
    return json_sax_dom_parser::end_object();
  }

 private:
  const std::string& what_;
  std::vector<std::set<std::string>> keys_;  // the keys of each open object, innermost last
};

}  // namespace

json ParseJsonDocument(std::string_view text, const std::string& what) {
  const size_t deep = FindTooDeep(text);
  KVDIFF_CHECK(deep == std::string_view::npos,
               "{}: invalid JSON: nesting deeper than {} levels (arrays and objects) at byte {}",
               what, kMaxJsonDepth, deep);
  json document;
  UniqueKeysDom dom(document, what);
  try {
    json::sax_parse(text.begin(), text.end(), &dom);
    return document;
  } catch (const json::exception& e) {
    // parse_error (syntax, with the byte), out_of_range (a number like 1e400): the same message.
    std::string detail = e.what();
    const size_t tag = detail.find("] ");
    if (detail.rfind("[json.exception.", 0) == 0 && tag != std::string::npos) {
      detail = detail.substr(tag + 2);
    }
    throw InputError(fmt::format("{}: invalid JSON: {}", what, Cut(detail, 300)));
  }
}

std::string JsonSnippet(const json& value, size_t max_chars) {
  std::string out;
  AppendSnippet(value, max_chars, out);
  return Cut(std::move(out), max_chars);
}

}  // namespace kvdiff::format
