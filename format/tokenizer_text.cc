// The text machinery of the tokenizer.json tokenizer: UTF-8, GPT-2's byte map, PCRE2 patterns.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <fmt/format.h>
#include <pcre2.h>
#include <utf8proc.h>

#include <cstdlib>

#include "format/tokenizer_json_detail.h"

namespace kvdiff::format {

using nlohmann::json;

// The length of the UTF-8 character starting at s[i], or 0 when the bytes there are not one.
size_t Utf8CharLength(const std::string& s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  const size_t n = c < 0x80           ? 1
                   : (c >> 5) == 0x6  ? 2
                   : (c >> 4) == 0xE  ? 3
                   : (c >> 3) == 0x1E ? 4
                                      : 0;
  if (n == 0 || i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return 0;
  }
  return n;
}

// The byte offset of the first byte that does not start a valid UTF-8 character, or npos. Checked
// with utf8proc, which also refuses overlong forms and surrogates.
size_t InvalidUtf8At(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    utf8proc_int32_t cp = 0;
    const auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + i),
                                    static_cast<utf8proc_ssize_t>(s.size() - i), &cp);
    if (n <= 0) return i;
    i += static_cast<size_t>(n);
  }
  return std::string::npos;
}

std::vector<std::string> Utf8Chars(const std::string& s) {
  std::vector<std::string> chars;
  for (size_t i = 0; i < s.size();) {
    size_t n = Utf8CharLength(s, i);
    if (n == 0) n = 1;  // only reached for token strings read from the file
    chars.push_back(s.substr(i, n));
    i += n;
  }
  return chars;
}

std::string CodepointToUtf8(uint32_t cp) {
  utf8proc_uint8_t buf[4];
  const auto n = utf8proc_encode_char(static_cast<utf8proc_int32_t>(cp), buf);
  return std::string(reinterpret_cast<const char*>(buf), static_cast<size_t>(n));
}

std::string Nfc(const std::string& s) {
  utf8proc_uint8_t* out = nullptr;
  const auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                              static_cast<utf8proc_ssize_t>(s.size()), &out,
                              static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  KVDIFF_CHECK(n >= 0, "NFC normalizer: {}", utf8proc_errmsg(n));
  std::string result(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
  std::free(out);
  return result;
}

ByteMap::ByteMap() {
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    to_char[b] = CodepointToUtf8(printable ? b : next++);
    to_byte[to_char[b]] = static_cast<unsigned char>(b);
  }
}

const ByteMap& Bytes() {
  static const ByteMap map;
  return map;
}

namespace {

pcre2_code* Code(const std::shared_ptr<void>& code) { return static_cast<pcre2_code*>(code.get()); }

}  // namespace

Regex::Regex(const std::string& pattern, const std::string& where) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    throw InputError(fmt::format("{}: regex {} does not compile at offset {}: {}", where,
                                 JsonSnippet(json(pattern)), offset,
                                 reinterpret_cast<const char*>(message)));
  }
  code_ =
      std::shared_ptr<void>(code, [](void* c) { pcre2_code_free(static_cast<pcre2_code*>(c)); });
}

std::vector<std::pair<size_t, size_t>> Regex::FindAll(const std::string& s) const {
  std::vector<std::pair<size_t, size_t>> found;
  std::unique_ptr<pcre2_match_data, void (*)(pcre2_match_data*)> data(
      pcre2_match_data_create_from_pattern(Code(code_), nullptr), pcre2_match_data_free);
  size_t at = 0;
  while (at <= s.size()) {
    const int rc = pcre2_match(Code(code_), reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), at, 0,
                               data.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    KVDIFF_CHECK(rc >= 0, "regex match failed with PCRE2 error {}", rc);
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data.get());
    const size_t begin = ovector[0], end = ovector[1];
    if (end > begin) {
      found.emplace_back(begin, end);
      at = end;
    } else {  // an empty match: step over one character
      if (begin >= s.size()) break;
      const size_t n = Utf8CharLength(s, begin);
      at = begin + (n == 0 ? 1 : n);
    }
  }
  return found;
}

Pattern Pattern::Read(const json& j, const std::string& where) {
  KVDIFF_CHECK(j.is_object() && j.size() == 1 && (j.contains("String") || j.contains("Regex")),
               "{}: pattern must be {{\"String\": ...}} or {{\"Regex\": ...}}, got {}", where,
               JsonSnippet(j));
  Pattern p;
  if (j.contains("String")) {
    KVDIFF_CHECK(j["String"].is_string() && !j["String"].get<std::string>().empty(),
                 "{}: pattern.String must be a non-empty string", where);
    p.literal = j["String"].get<std::string>();
  } else {
    KVDIFF_CHECK(j["Regex"].is_string(), "{}: pattern.Regex must be a string", where);
    p.regex = std::make_shared<Regex>(j["Regex"].get<std::string>(), where);
  }
  return p;
}

std::vector<std::pair<size_t, size_t>> Pattern::FindAll(const std::string& s) const {
  if (regex) return regex->FindAll(s);
  std::vector<std::pair<size_t, size_t>> found;
  for (size_t at = s.find(literal); at != std::string::npos;
       at = s.find(literal, at + literal.size())) {
    found.emplace_back(at, at + literal.size());
  }
  return found;
}

std::string Pattern::ReplaceAll(const std::string& s, const std::string& content) const {
  std::string out;
  size_t last = 0;
  for (const auto& [begin, end] : FindAll(s)) {
    out.append(s, last, begin - last);
    out += content;
    last = end;
  }
  out.append(s, last, std::string::npos);
  return out;
}

}  // namespace kvdiff::format
