// The chat template's values (Jinja's truthiness and equality) and Python's str semantics on UTF-8.
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

const char* KindName(const Value& v) {
  switch (v.kind) {
    case Value::kUndefined:
      return "undefined";
    case Value::kNone:
      return "none";
    case Value::kBool:
      return "boolean";
    case Value::kInt:
      return "integer";
    case Value::kString:
      return "string";
    case Value::kList:
      return "list";
    case Value::kDict:
      return "dict";
  }
  return "?";
}

bool Truthy(const Value& v) {
  switch (v.kind) {
    case Value::kUndefined:
    case Value::kNone:
      return false;
    case Value::kBool:
      return v.b;
    case Value::kInt:
      return v.i != 0;
    case Value::kString:
      return !v.s.empty();
    case Value::kList:
      return !v.list->empty();
    case Value::kDict:
      return !v.dict->empty();
  }
  return false;
}

bool Equal(const Value& a, const Value& b) {
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Value::kUndefined:
    case Value::kNone:
      return true;
    case Value::kBool:
      return a.b == b.b;
    case Value::kInt:
      return a.i == b.i;
    case Value::kString:
      return a.s == b.s;
    case Value::kList:
      if (a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k) {
        if (!Equal((*a.list)[k], (*b.list)[k])) return false;
      }
      return true;
    case Value::kDict:
      if (a.dict->size() != b.dict->size()) return false;
      for (size_t k = 0; k < a.dict->size(); ++k) {
        if ((*a.dict)[k].first != (*b.dict)[k].first ||
            !Equal((*a.dict)[k].second, (*b.dict)[k].second)) {
          return false;
        }
      }
      return true;
  }
  return false;
}

// ---- UTF-8 helpers (Python's str semantics: code points, str.isspace) ---------------------------

// Where each code point of `s` starts, then s.size(): code point k is s[at[k], at[k + 1]).
std::vector<size_t> CodePointStarts(const std::string& s) {
  std::vector<size_t> at;
  for (size_t i = 0; i < s.size();) {
    at.push_back(i);
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80           ? 1
                     : (c >> 5) == 0x6  ? 2
                     : (c >> 4) == 0xE  ? 3
                     : (c >> 3) == 0x1E ? 4
                                        : 1;
    i += std::min(n, s.size() - i);
  }
  at.push_back(s.size());
  return at;
}

bool IsPySpace(const std::string& ch) {
  static const std::vector<std::string> kSpaces = {
      " ",      "\t",     "\n",     "\v",     "\f",     "\r",     "\x1c",   "\x1d",
      "\x1e",   "\x1f",   "\u0085", "\u00a0", "\u1680", "\u2000", "\u2001", "\u2002",
      "\u2003", "\u2004", "\u2005", "\u2006", "\u2007", "\u2008", "\u2009", "\u200a",
      "\u2028", "\u2029", "\u202f", "\u205f", "\u3000"};
  for (const auto& sp : kSpaces) {
    if (ch == sp) return true;
  }
  return false;
}

std::string Strip(const std::string& s, bool left, bool right) {
  const std::vector<size_t> at = CodePointStarts(s);
  auto code_point = [&](size_t k) { return s.substr(at[k], at[k + 1] - at[k]); };
  size_t begin = 0, end = at.size() - 1;
  while (left && begin < end && IsPySpace(code_point(begin))) ++begin;
  while (right && end > begin && IsPySpace(code_point(end - 1))) --end;
  return s.substr(at[begin], at[end] - at[begin]);
}

bool IsAscii(const std::string& s) {
  for (char c : s) {
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  }
  return true;
}

}  // namespace kvdiff::format::chat_template_detail
