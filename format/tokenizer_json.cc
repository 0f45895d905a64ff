#include "format/tokenizer_json.h"

#include "format/input_file.h"
#include "format/json_document.h"
#include "format/json_field.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <fmt/format.h>
#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <unordered_map>
#include <vector>

#include "format/error.h"

namespace kvdiff::format {
namespace {

using nlohmann::json;

// ---- UTF-8 ------------------------------------------------------------------------------------

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

// GPT-2's bytes_to_unicode: printable bytes stand for themselves, the other 68 are moved to
// U+0100.. in byte order, so every byte string is a printable string.
struct ByteMap {
  std::string to_char[256];  // byte -> UTF-8 of its stand-in character
  std::unordered_map<std::string, unsigned char> to_byte;
  ByteMap() {
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      to_char[b] = CodepointToUtf8(printable ? b : next++);
      to_byte[to_char[b]] = static_cast<unsigned char>(b);
    }
  }
};
const ByteMap& Bytes() {
  static const ByteMap map;
  return map;
}

// ---- PCRE2 ------------------------------------------------------------------------------------

// A compiled pattern with UTF and Unicode properties (\s, \p{L}, (?i) as Unicode defines them).
class Regex {
 public:
  Regex(const std::string& pattern, const std::string& where) {
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
    code_.reset(code, pcre2_code_free);
  }

  // Every non-empty, non-overlapping match, left to right, as [begin, end) byte offsets.
  std::vector<std::pair<size_t, size_t>> FindAll(const std::string& s) const {
    std::vector<std::pair<size_t, size_t>> found;
    std::unique_ptr<pcre2_match_data, void (*)(pcre2_match_data*)> data(
        pcre2_match_data_create_from_pattern(code_.get(), nullptr), pcre2_match_data_free);
    size_t at = 0;
    while (at <= s.size()) {
      const int rc = pcre2_match(code_.get(), reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), at,
                                 0, data.get(), nullptr);
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

 private:
  std::shared_ptr<pcre2_code> code_;
};

// A "pattern" field: {"String": "..."} (literal) or {"Regex": "..."}.
struct Pattern {
  std::string literal;
  std::shared_ptr<Regex> regex;

  static Pattern Read(const json& j, const std::string& where) {
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

  std::vector<std::pair<size_t, size_t>> FindAll(const std::string& s) const {
    if (regex) return regex->FindAll(s);
    std::vector<std::pair<size_t, size_t>> found;
    for (size_t at = s.find(literal); at != std::string::npos;
         at = s.find(literal, at + literal.size())) {
      found.emplace_back(at, at + literal.size());
    }
    return found;
  }

  std::string ReplaceAll(const std::string& s, const std::string& content) const {
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
};

// ---- small JSON readers with messages that name the field ------------------------------------

const json& Field(const json& j, const char* key, const std::string& where) {
  return RequiredJsonField(j, key, where);
}
std::string String(const json& j, const char* key, const std::string& where) {
  return RequiredJsonString(j, key, where);
}
bool Bool(const json& j, const char* key, bool fallback, const std::string& where) {
  const json* v = OptionalJsonField(j, key);
  return v ? JsonBool(*v, JsonPath(where, key)) : fallback;
}
std::string TypeOf(const json& j, const std::string& where) {
  KVDIFF_CHECK(j.is_object(), "{}: expected an object with a \"type\", got {}", where,
               JsonSnippet(j));
  return String(j, "type", where);
}
// "pre_tokenizer.pretokenizers[1]" -> "pre_tokenizer".
std::string Role(const std::string& where) { return where.substr(0, where.find('.')); }

[[noreturn]] void Unsupported(const std::string& where, const std::string& type,
                              const char* supported) {
  throw InputError(fmt::format("{}: type \"{}\" is not implemented by kvdiff (supported: {})",
                               where, type, supported));
}

}  // namespace

// ---- the pipeline's components ---------------------------------------------------------------

struct HfTokenizer::Impl {
  struct Normalizer {
    enum Kind { kPrepend, kReplace, kNfc } kind;
    std::string text;  // Prepend's prefix, Replace's content
    Pattern pattern;   // Replace's
  };
  struct PreTokenizer {
    enum Kind { kByteLevel, kSplit, kMetaspace, kDigits } kind;
    bool add_prefix_space = false;   // ByteLevel
    bool use_regex = true;           // ByteLevel: split with GPT-2's pattern first
    Pattern pattern;                 // Split
    bool removed = false;            // Split: behavior "Removed" (else "Isolated")
    bool invert = false;             // Split
    std::string replacement;         // Metaspace
    std::string prepend_scheme;      // Metaspace: always, first, never
    bool split = true;               // Metaspace
    bool individual_digits = false;  // Digits
  };
  struct Decoder {
    enum Kind { kByteLevel, kReplace, kByteFallback, kFuse, kStrip, kMetaspace } kind;
    Pattern pattern;             // Replace
    std::string content;         // Replace's content, Strip's character, Metaspace's replacement
    size_t start = 0, stop = 0;  // Strip
    bool prefix_space = true;    // Metaspace: drop the first token's leading space
  };
  struct AddedToken {
    std::string content;
    Token id;
    bool special;
  };

  // Model (BPE).
  std::unordered_map<std::string, Token> vocab;  // model vocabulary and added tokens
  std::vector<std::string> id_to_token;          // "" where no token has the id
  std::vector<bool> has_id;
  // Ids are dense: each is below the number of entries (model.vocab and added_tokens), so the id
  // table is as large as the file, not as its largest number.
  size_t id_limit = 0;
  std::unordered_map<uint64_t, std::pair<int32_t, Token>>
      merges;  // (left, right) -> (rank, merged)
  Token unk_id = -1;
  bool byte_fallback = false;
  bool fuse_unk = false;
  bool ignore_merges = false;
  Token byte_ids[256];  // <0xNN> ids when byte_fallback

  std::vector<AddedToken> added;  // longest content first
  std::vector<bool> special;      // by id

  std::vector<Normalizer> normalizers;
  std::vector<PreTokenizer> pre_tokenizers;
  std::vector<Decoder> decoders;
  Tokens prefix, suffix;  // TemplateProcessing's special tokens around a single sequence
  std::map<std::string, std::vector<std::string>> names;  // role -> component types, for Describe()

  static uint64_t PairKey(Token a, Token b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  std::string NormalizeText(std::string s) const {
    for (const Normalizer& n : normalizers) {
      switch (n.kind) {
        case Normalizer::kPrepend:
          if (!s.empty()) s = n.text + s;
          break;
        case Normalizer::kReplace:
          s = n.pattern.ReplaceAll(s, n.text);
          break;
        case Normalizer::kNfc:
          s = Nfc(s);
          break;
      }
    }
    return s;
  }

  // Splits s into [begin, end) segments marking which were matches, covering all of s.
  static std::vector<std::pair<std::string, bool>> Segments(const std::string& s,
                                                            const Pattern& p) {
    std::vector<std::pair<std::string, bool>> out;
    size_t last = 0;
    for (const auto& [begin, end] : p.FindAll(s)) {
      if (begin > last) out.emplace_back(s.substr(last, begin - last), false);
      out.emplace_back(s.substr(begin, end - begin), true);
      last = end;
    }
    if (last < s.size()) out.emplace_back(s.substr(last), false);
    return out;
  }

  std::vector<std::string> PreTokenize(const std::string& text, size_t section_index) const {
    std::vector<std::string> pieces = {text};
    for (const PreTokenizer& p : pre_tokenizers) {
      std::vector<std::string> next;
      for (const std::string& piece : pieces) Apply(p, piece, section_index, next);
      pieces = std::move(next);
    }
    return pieces;
  }

  static void Apply(const PreTokenizer& p, std::string s, size_t section_index,
                    std::vector<std::string>& out) {
    switch (p.kind) {
      case PreTokenizer::kByteLevel: {
        if (p.add_prefix_space && s.compare(0, 1, " ") != 0) s = " " + s;
        static const Pattern gpt2 = [] {
          Pattern pat;
          pat.regex = std::make_shared<Regex>(
              R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)",
              "ByteLevel");
          return pat;
        }();
        std::vector<std::string> words;
        if (p.use_regex) {
          for (const auto& [w, is_match] : Segments(s, gpt2)) words.push_back(w);
        } else {
          words.push_back(s);
        }
        for (const std::string& w : words) {
          std::string mapped;
          for (char c : w) mapped += Bytes().to_char[static_cast<unsigned char>(c)];
          out.push_back(mapped);
        }
        break;
      }
      case PreTokenizer::kSplit:
        for (const auto& [seg, is_match] : Segments(s, p.pattern)) {
          const bool delimiter = is_match != p.invert;
          if (!(p.removed && delimiter)) out.push_back(seg);
        }
        break;
      case PreTokenizer::kMetaspace: {
        std::string r = Pattern{" ", nullptr}.ReplaceAll(s, p.replacement);
        const bool prepend =
            p.prepend_scheme == "always" || (p.prepend_scheme == "first" && section_index == 0);
        if (prepend && r.compare(0, p.replacement.size(), p.replacement) != 0) {
          r = p.replacement + r;
        }
        if (!p.split) {
          out.push_back(r);
          break;
        }
        // Each replacement character starts a new piece (tokenizers' MergedWithNext).
        size_t begin = 0;
        for (size_t at = r.find(p.replacement, 1); at != std::string::npos;
             at = r.find(p.replacement, at + p.replacement.size())) {
          out.push_back(r.substr(begin, at - begin));
          begin = at;
        }
        if (begin < r.size()) out.push_back(r.substr(begin));
        break;
      }
      case PreTokenizer::kDigits: {
        // ASCII digits alone (individual_digits) or in runs; the text between them as it is.
        size_t i = 0;
        while (i < s.size()) {
          const bool digit = s[i] >= '0' && s[i] <= '9';
          size_t j = i + 1;
          if (!(digit && p.individual_digits)) {
            while (j < s.size() && (s[j] >= '0' && s[j] <= '9') == digit) ++j;
          }
          out.push_back(s.substr(i, j - i));
          i = j;
        }
        break;
      }
    }
  }

  // BPE on one pre-token: characters to ids (or byte fallback, or unk), then the lowest-ranked
  // adjacent merge, leftmost on a tie, until none applies.
  void Bpe(const std::string& word, Tokens& out) const {
    if (ignore_merges) {
      auto it = vocab.find(word);
      if (it != vocab.end()) {
        out.push_back(it->second);
        return;
      }
    }
    Tokens symbols;
    for (const std::string& ch : Utf8Chars(word)) {
      auto it = vocab.find(ch);
      if (it != vocab.end()) {
        symbols.push_back(it->second);
      } else if (byte_fallback && std::all_of(ch.begin(), ch.end(), [&](char c) {
                   return byte_ids[static_cast<unsigned char>(c)] >= 0;
                 })) {
        for (char c : ch) symbols.push_back(byte_ids[static_cast<unsigned char>(c)]);
      } else {
        KVDIFF_CHECK(unk_id >= 0,
                     "tokenizer.json: the character {} is not in the vocabulary and the model "
                     "has no unk_token",
                     JsonSnippet(json(ch)));
        if (!(fuse_unk && !symbols.empty() && symbols.back() == unk_id)) symbols.push_back(unk_id);
      }
    }
    while (symbols.size() > 1) {
      int32_t best_rank = std::numeric_limits<int32_t>::max();
      size_t best_at = 0;
      Token best_id = -1;
      for (size_t k = 0; k + 1 < symbols.size(); ++k) {
        auto it = merges.find(PairKey(symbols[k], symbols[k + 1]));
        if (it != merges.end() && it->second.first < best_rank) {
          best_rank = it->second.first;
          best_id = it->second.second;
          best_at = k;
        }
      }
      if (best_id < 0) break;
      symbols[best_at] = best_id;
      symbols.erase(symbols.begin() + static_cast<std::ptrdiff_t>(best_at) + 1);
    }
    out.insert(out.end(), symbols.begin(), symbols.end());
  }

  // The decoder chain over token strings (bytes). at_start: the first string starts the text.
  std::string RunDecoders(std::vector<std::string> tokens, const std::vector<bool>& is_added,
                          bool at_start) const {
    std::vector<bool> added_flags = is_added;
    for (const Decoder& d : decoders) {
      std::vector<std::string> next;
      std::vector<bool> next_flags;
      switch (d.kind) {
        case Decoder::kByteLevel: {
          // As transformers.js: added tokens pass as they are; runs of others map back to bytes
          // (a token with a character outside the map keeps its own bytes, as tokenizers does).
          for (size_t i = 0; i < tokens.size(); ++i) {
            if (added_flags[i]) {
              next.push_back(tokens[i]);
              continue;
            }
            std::string bytes;
            bool mapped = true;
            for (const std::string& ch : Utf8Chars(tokens[i])) {
              auto it = Bytes().to_byte.find(ch);
              if (it == Bytes().to_byte.end()) {
                mapped = false;
                break;
              }
              bytes += static_cast<char>(it->second);
            }
            next.push_back(mapped ? bytes : tokens[i]);
          }
          next_flags = added_flags;
          break;
        }
        case Decoder::kReplace:
          for (const std::string& t : tokens) next.push_back(d.pattern.ReplaceAll(t, d.content));
          next_flags = added_flags;
          break;
        case Decoder::kByteFallback:
          for (size_t i = 0; i < tokens.size(); ++i) {
            const std::string& t = tokens[i];
            int value = -1;
            if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>') {
              value = static_cast<int>(std::strtol(t.substr(3, 2).c_str(), nullptr, 16));
              if (!std::isxdigit(static_cast<unsigned char>(t[3])) ||
                  !std::isxdigit(static_cast<unsigned char>(t[4]))) {
                value = -1;
              }
            }
            next.push_back(value >= 0 ? std::string(1, static_cast<char>(value)) : t);
          }
          next_flags = added_flags;
          break;
        case Decoder::kFuse: {
          std::string all;
          for (const std::string& t : tokens) all += t;
          next = {all};
          next_flags = {false};
          break;
        }
        case Decoder::kStrip:
          for (size_t i = 0; i < tokens.size(); ++i) {
            std::string t = tokens[i];
            if (at_start) {
              for (size_t k = 0; k < d.start && t.compare(0, d.content.size(), d.content) == 0;
                   ++k) {
                t.erase(0, d.content.size());
              }
            }
            for (size_t k = 0;
                 k < d.stop && t.size() >= d.content.size() &&
                 t.compare(t.size() - d.content.size(), d.content.size(), d.content) == 0;
                 ++k) {
              t.erase(t.size() - d.content.size());
            }
            next.push_back(t);
          }
          next_flags = added_flags;
          break;
        case Decoder::kMetaspace:
          for (size_t i = 0; i < tokens.size(); ++i) {
            std::string t = Pattern{d.content, nullptr}.ReplaceAll(tokens[i], " ");
            if (d.prefix_space && i == 0 && at_start && t.compare(0, 1, " ") == 0) t.erase(0, 1);
            next.push_back(t);
          }
          next_flags = added_flags;
          break;
      }
      tokens = std::move(next);
      added_flags = std::move(next_flags);
    }
    std::string out;
    for (const std::string& t : tokens) out += t;
    return out;
  }

  const std::string& TokenString(Token id) const {
    KVDIFF_CHECK(id >= 0 && id < static_cast<Token>(id_to_token.size()) && has_id[id],
                 "token id {} is not in the tokenizer's vocabulary (ids 0..{})", id,
                 static_cast<int64_t>(id_to_token.size()) - 1);
    return id_to_token[id];
  }
};

namespace {

using Impl = HfTokenizer::Impl;

size_t EntryCount(const json& j, const char* key) {
  return j.is_object() && j.contains(key) ? j[key].size() : 0;
}

// A token id read at `where`, checked against Impl::id_limit (not truncated to 32 bits).
Token TokenId(const json& j, const Impl& impl, const std::string& where) {
  KVDIFF_CHECK(j.is_number_integer(), "{}: expected an integer id, got {}", where, JsonSnippet(j));
  KVDIFF_CHECK(j.is_number_unsigned() && j.get<uint64_t>() < impl.id_limit,
               "{}: id {} is out of range: expected an id below {}, the number of entries in "
               "model.vocab and added_tokens",
               where, j.dump(), impl.id_limit);
  return static_cast<Token>(j.get<uint64_t>());
}

void ReadNormalizer(const json& j, const std::string& where, Impl& impl) {
  if (j.is_null()) return;
  const std::string type = TypeOf(j, where);
  impl.names[Role(where)].push_back(type);
  if (type == "Sequence") {
    const json& list = Field(j, "normalizers", where);
    KVDIFF_CHECK(list.is_array(), "{}.normalizers: expected an array", where);
    for (size_t i = 0; i < list.size(); ++i) {
      ReadNormalizer(list[i], fmt::format("{}.normalizers[{}]", where, i), impl);
    }
  } else if (type == "Prepend") {
    impl.normalizers.push_back({Impl::Normalizer::kPrepend, String(j, "prepend", where), {}});
  } else if (type == "Replace") {
    impl.normalizers.push_back({Impl::Normalizer::kReplace, String(j, "content", where),
                                Pattern::Read(Field(j, "pattern", where), where + ".pattern")});
  } else if (type == "NFC") {
    impl.normalizers.push_back({Impl::Normalizer::kNfc, "", {}});
  } else {
    Unsupported(where, type, "Sequence, Prepend, Replace, NFC");
  }
}

void ReadPreTokenizer(const json& j, const std::string& where, Impl& impl) {
  if (j.is_null()) return;
  const std::string type = TypeOf(j, where);
  impl.names[Role(where)].push_back(type);
  Impl::PreTokenizer p{};
  if (type == "Sequence") {
    const json& list = Field(j, "pretokenizers", where);
    KVDIFF_CHECK(list.is_array(), "{}.pretokenizers: expected an array", where);
    for (size_t i = 0; i < list.size(); ++i) {
      ReadPreTokenizer(list[i], fmt::format("{}.pretokenizers[{}]", where, i), impl);
    }
    return;
  } else if (type == "ByteLevel") {
    p.kind = Impl::PreTokenizer::kByteLevel;
    p.add_prefix_space = Bool(j, "add_prefix_space", true, where);
    p.use_regex = Bool(j, "use_regex", true, where);
  } else if (type == "Split") {
    p.kind = Impl::PreTokenizer::kSplit;
    p.pattern = Pattern::Read(Field(j, "pattern", where), where + ".pattern");
    const std::string behavior = String(j, "behavior", where);
    KVDIFF_CHECK(behavior == "Isolated" || behavior == "Removed",
                 "{}.behavior: \"{}\" is not implemented by kvdiff (supported: Isolated, Removed)",
                 where, behavior);
    p.removed = behavior == "Removed";
    p.invert = Bool(j, "invert", false, where);
  } else if (type == "Metaspace") {
    p.kind = Impl::PreTokenizer::kMetaspace;
    p.replacement = String(j, "replacement", where);
    KVDIFF_CHECK(Utf8Chars(p.replacement).size() == 1, "{}.replacement: expected one character",
                 where);
    if (j.contains("prepend_scheme") && !j["prepend_scheme"].is_null()) {
      p.prepend_scheme = String(j, "prepend_scheme", where);
      KVDIFF_CHECK(p.prepend_scheme == "always" || p.prepend_scheme == "first" ||
                       p.prepend_scheme == "never",
                   "{}.prepend_scheme: expected always, first or never, got \"{}\"", where,
                   p.prepend_scheme);
    } else {
      p.prepend_scheme = Bool(j, "add_prefix_space", true, where) ? "always" : "never";
    }
    p.split = Bool(j, "split", true, where);
  } else if (type == "Digits") {
    p.kind = Impl::PreTokenizer::kDigits;
    p.individual_digits = Bool(j, "individual_digits", false, where);
  } else {
    Unsupported(where, type, "Sequence, ByteLevel, Split, Metaspace, Digits");
  }
  impl.pre_tokenizers.push_back(std::move(p));
}

void ReadDecoder(const json& j, const std::string& where, Impl& impl) {
  if (j.is_null()) return;
  const std::string type = TypeOf(j, where);
  impl.names[Role(where)].push_back(type);
  Impl::Decoder d{};
  if (type == "Sequence") {
    const json& list = Field(j, "decoders", where);
    KVDIFF_CHECK(list.is_array(), "{}.decoders: expected an array", where);
    for (size_t i = 0; i < list.size(); ++i) {
      ReadDecoder(list[i], fmt::format("{}.decoders[{}]", where, i), impl);
    }
    return;
  } else if (type == "ByteLevel") {
    d.kind = Impl::Decoder::kByteLevel;
  } else if (type == "Replace") {
    d.kind = Impl::Decoder::kReplace;
    d.pattern = Pattern::Read(Field(j, "pattern", where), where + ".pattern");
    d.content = String(j, "content", where);
  } else if (type == "ByteFallback") {
    d.kind = Impl::Decoder::kByteFallback;
  } else if (type == "Fuse") {
    d.kind = Impl::Decoder::kFuse;
  } else if (type == "Strip") {
    d.kind = Impl::Decoder::kStrip;
    d.content = String(j, "content", where);
    for (const char* key : {"start", "stop"}) {
      KVDIFF_CHECK(Field(j, key, where).is_number_unsigned(),
                   "{}.{}: expected a non-negative integer", where, key);
    }
    d.start = j["start"].get<size_t>();
    d.stop = j["stop"].get<size_t>();
  } else if (type == "Metaspace") {
    d.kind = Impl::Decoder::kMetaspace;
    d.content = String(j, "replacement", where);
    if (j.contains("prepend_scheme") && !j["prepend_scheme"].is_null()) {
      d.prefix_space = String(j, "prepend_scheme", where) != "never";
    } else {
      d.prefix_space = Bool(j, "add_prefix_space", true, where);
    }
  } else {
    Unsupported(where, type, "Sequence, ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace");
  }
  impl.decoders.push_back(std::move(d));
}

void ReadPostProcessor(const json& j, const std::string& where, Impl& impl, bool& has_template) {
  if (j.is_null()) return;
  const std::string type = TypeOf(j, where);
  impl.names[Role(where)].push_back(type);
  if (type == "Sequence") {
    const json& list = Field(j, "processors", where);
    KVDIFF_CHECK(list.is_array(), "{}.processors: expected an array", where);
    for (size_t i = 0; i < list.size(); ++i) {
      ReadPostProcessor(list[i], fmt::format("{}.processors[{}]", where, i), impl, has_template);
    }
  } else if (type == "ByteLevel") {
    // Only adjusts offsets; ids are unchanged.
  } else if (type == "TemplateProcessing") {
    KVDIFF_CHECK(!has_template, "{}: more than one TemplateProcessing", where);
    has_template = true;
    const json& single = Field(j, "single", where);
    const json& specials = Field(j, "special_tokens", where);
    KVDIFF_CHECK(single.is_array(), "{}.single: expected an array", where);
    bool seen_sequence = false;
    for (size_t i = 0; i < single.size(); ++i) {
      const std::string w = fmt::format("{}.single[{}]", where, i);
      const json& item = single[i];
      if (item.is_object() && item.contains("Sequence")) {
        KVDIFF_CHECK(!seen_sequence && String(item["Sequence"], "id", w) == "A",
                     "{}: expected one Sequence \"A\" in a single-sequence template", w);
        seen_sequence = true;
      } else if (item.is_object() && item.contains("SpecialToken")) {
        const std::string name = String(item["SpecialToken"], "id", w);
        KVDIFF_CHECK(specials.is_object() && specials.contains(name),
                     "{}: special token \"{}\" is not in special_tokens", w, name);
        const json& ids = Field(specials[name], "ids", w);
        KVDIFF_CHECK(ids.is_array() && !ids.empty(),
                     "{}: special_tokens[\"{}\"].ids must be a non-empty array", w, name);
        for (const json& id : ids) {
          (seen_sequence ? impl.suffix : impl.prefix)
              .push_back(TokenId(id, impl, fmt::format("{}: special_tokens[\"{}\"].ids", w, name)));
        }
      } else {
        throw InputError(
            fmt::format("{}: expected {{\"SpecialToken\": ...}} or {{\"Sequence\": ...}}, got {}",
                        w, JsonSnippet(item)));
      }
    }
    KVDIFF_CHECK(seen_sequence, "{}.single: has no Sequence \"A\"", where);
  } else {
    Unsupported(where, type, "Sequence, ByteLevel, TemplateProcessing");
  }
}

void SetToken(Impl& impl, Token id, const std::string& token) {
  if (static_cast<size_t>(id) >= impl.id_to_token.size()) {
    impl.id_to_token.resize(static_cast<size_t>(id) + 1);
    impl.has_id.resize(static_cast<size_t>(id) + 1, false);
  }
  impl.id_to_token[id] = token;
  impl.has_id[id] = true;
}

void ReadModel(const json& m, Impl& impl) {
  const std::string where = "model";
  std::string type = m.is_object() && m.contains("type") ? String(m, "type", where) : "BPE";
  KVDIFF_CHECK(type == "BPE", "model: type \"{}\" is not implemented by kvdiff (supported: BPE)",
               type);
  impl.names["model"].push_back("BPE");
  KVDIFF_CHECK(!m.contains("dropout") || m["dropout"].is_null() ||
                   (m["dropout"].is_number() && m["dropout"].get<double>() == 0.0),
               "model.dropout: BPE dropout is random; kvdiff implements only null or 0");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    KVDIFF_CHECK(!m.contains(key) || m[key].is_null() ||
                     (m[key].is_string() && m[key].get<std::string>().empty()),
                 "model.{}: {} is not implemented by kvdiff (only null)", key, JsonSnippet(m[key]));
  }
  impl.byte_fallback = Bool(m, "byte_fallback", false, where);
  impl.fuse_unk = Bool(m, "fuse_unk", false, where);
  impl.ignore_merges = Bool(m, "ignore_merges", false, where);

  const json& vocab = Field(m, "vocab", where);
  KVDIFF_CHECK(vocab.is_object(), "model.vocab: expected an object of token -> id");
  for (const auto& [token, id] : vocab.items()) {
    const Token v = TokenId(id, impl, fmt::format("model.vocab[{}]", JsonSnippet(json(token))));
    KVDIFF_CHECK(
        static_cast<size_t>(v) >= impl.has_id.size() || !impl.has_id[v],
        "model.vocab[{}]: id {} is already used by {}", JsonSnippet(json(token)), v,
        static_cast<size_t>(v) < impl.has_id.size() ? JsonSnippet(json(impl.id_to_token[v])) : "-");
    impl.vocab[token] = v;
    SetToken(impl, v, token);
  }

  if (m.contains("unk_token") && !m["unk_token"].is_null()) {
    const std::string unk = String(m, "unk_token", where);
    auto it = impl.vocab.find(unk);
    KVDIFF_CHECK(it != impl.vocab.end(), "model.unk_token: \"{}\" is not in model.vocab", unk);
    impl.unk_id = it->second;
  }
  std::fill(std::begin(impl.byte_ids), std::end(impl.byte_ids), -1);
  if (impl.byte_fallback) {
    for (int b = 0; b < 256; ++b) {
      auto it = impl.vocab.find(fmt::format("<0x{:02X}>", b));
      if (it != impl.vocab.end()) impl.byte_ids[b] = it->second;
    }
  }

  const json& merges = Field(m, "merges", where);
  KVDIFF_CHECK(merges.is_array(), "model.merges: expected an array");
  impl.merges.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const json& item = merges[i];
    std::string a, b;
    if (item.is_string()) {  // "a b" (tokenizers before 0.20)
      const std::string s = item.get<std::string>();
      const size_t space = s.find(' ');
      KVDIFF_CHECK(space != std::string::npos && space > 0 && space + 1 < s.size() &&
                       s.find(' ', space + 1) == std::string::npos,
                   "model.merges[{}]: expected \"left right\" (two tokens, one space), got {}", i,
                   JsonSnippet(item));
      a = s.substr(0, space);
      b = s.substr(space + 1);
    } else if (item.is_array() && item.size() == 2 && item[0].is_string() && item[1].is_string()) {
      a = item[0].get<std::string>();
      b = item[1].get<std::string>();
    } else {
      throw InputError(
          fmt::format("model.merges[{}]: expected \"left right\" or [\"left\", \"right\"], got {}",
                      i, JsonSnippet(item)));
    }
    auto ia = impl.vocab.find(a), ib = impl.vocab.find(b), iab = impl.vocab.find(a + b);
    KVDIFF_CHECK(ia != impl.vocab.end() && ib != impl.vocab.end() && iab != impl.vocab.end(),
                 "model.merges[{}]: {} + {} -> {}: {} is not in model.vocab", i,
                 JsonSnippet(json(a)), JsonSnippet(json(b)), JsonSnippet(json(a + b)),
                 JsonSnippet(json(ia == impl.vocab.end()   ? a
                                  : ib == impl.vocab.end() ? b
                                                           : a + b)));
    // The first occurrence of a pair is its rank, as in tokenizers.
    impl.merges.emplace(Impl::PairKey(ia->second, ib->second),
                        std::make_pair(static_cast<int32_t>(i), iab->second));
  }
}

void ReadAddedTokens(const json& list, Impl& impl) {
  if (list.is_null()) return;
  KVDIFF_CHECK(list.is_array(), "added_tokens: expected an array");
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string where = fmt::format("added_tokens[{}]", i);
    const json& t = list[i];
    Impl::AddedToken added{String(t, "content", where),
                           TokenId(Field(t, "id", where), impl, where + ".id"),
                           Bool(t, "special", false, where)};
    KVDIFF_CHECK(!added.content.empty(), "{}: empty content", where);
    for (const char* key : {"single_word", "lstrip", "rstrip"}) {
      KVDIFF_CHECK(!Bool(t, key, false, where),
                   "{} ({}): \"{}\": true is not implemented by kvdiff", where,
                   JsonSnippet(json(added.content)), key);
    }
    KVDIFF_CHECK(!Bool(t, "normalized", false, where) || impl.normalizers.empty(),
                 "{} ({}): \"normalized\": true with a normalizer is not implemented by kvdiff",
                 where, JsonSnippet(json(added.content)));
    auto it = impl.vocab.find(added.content);
    KVDIFF_CHECK(it == impl.vocab.end() || it->second == added.id,
                 "{}: {} has id {} here and {} in the vocabulary", where,
                 JsonSnippet(json(added.content)), added.id,
                 it == impl.vocab.end() ? -1 : it->second);
    KVDIFF_CHECK(static_cast<size_t>(added.id) >= impl.has_id.size() || !impl.has_id[added.id] ||
                     impl.id_to_token[added.id] == added.content,
                 "{}: id {} is already the token {}", where, added.id,
                 static_cast<size_t>(added.id) < impl.has_id.size()
                     ? JsonSnippet(json(impl.id_to_token[added.id]))
                     : "-");
    impl.vocab[added.content] = added.id;
    SetToken(impl, added.id, added.content);
    impl.added.push_back(added);
  }
  // Longest first, so at a position the longest token wins.
  std::stable_sort(impl.added.begin(), impl.added.end(), [](const auto& a, const auto& b) {
    return a.content.size() > b.content.size();
  });
}

}  // namespace

HfTokenizer HfTokenizer::Parse(const std::string& json_text) {
  const json root = ParseJsonDocument(json_text, "tokenizer.json");
  KVDIFF_CHECK(root.is_object(), "tokenizer.json: expected a JSON object at the top");
  for (const char* key : {"truncation", "padding"}) {
    KVDIFF_CHECK(!root.contains(key) || root[key].is_null(),
                 "{}: kvdiff encodes whole texts; a tokenizer.json with {} set is not implemented",
                 key, key);
  }
  auto impl = std::make_shared<Impl>();
  const json& model = Field(root, "model", "tokenizer.json");
  impl->id_limit = EntryCount(model, "vocab") + EntryCount(root, "added_tokens");
  ReadModel(model, *impl);
  ReadNormalizer(root.value("normalizer", json()), "normalizer", *impl);
  ReadAddedTokens(root.value("added_tokens", json()), *impl);
  ReadPreTokenizer(root.value("pre_tokenizer", json()), "pre_tokenizer", *impl);
  bool has_template = false;
  ReadPostProcessor(root.value("post_processor", json()), "post_processor", *impl, has_template);
  ReadDecoder(root.value("decoder", json()), "decoder", *impl);
  impl->special.assign(impl->id_to_token.size(), false);
  for (const auto& a : impl->added) impl->special[a.id] = a.special;
  for (Token id : impl->prefix) impl->TokenString(id);
  for (Token id : impl->suffix) impl->TokenString(id);
  return HfTokenizer(std::move(impl));
}

HfTokenizer HfTokenizer::Load(const std::filesystem::path& path) {
  try {
    return Parse(ReadInputFile(path, "tokenizer file"));
  } catch (const InputError& e) {
    throw InputError(fmt::format("{}: {}", path.string(), e.what()));
  }
}

Tokens HfTokenizer::Encode(const std::string& text, bool add_special_tokens) const {
  const size_t bad = InvalidUtf8At(text);
  KVDIFF_CHECK(bad == std::string::npos,
               "text is not valid UTF-8 at byte {} (0x{:02X}); a tokenizer.json tokenizer takes "
               "Unicode text",
               bad, bad == std::string::npos ? 0 : static_cast<unsigned char>(text[bad]));
  const Impl& impl = *impl_;
  // Sections: added tokens (leftmost, longest at a position) and the text between them.
  struct Section {
    std::string text;
    Token added_id;  // -1 for text
  };
  std::vector<Section> sections;
  size_t last = 0;
  for (size_t i = 0; i < text.size();) {
    const Impl::AddedToken* hit = nullptr;
    for (const auto& a : impl.added) {
      if (a.content[0] == text[i] && text.compare(i, a.content.size(), a.content) == 0) {
        hit = &a;
        break;
      }
    }
    if (hit == nullptr) {
      ++i;
      continue;
    }
    sections.push_back({text.substr(last, i - last), -1});
    sections.push_back({hit->content, hit->id});
    i += hit->content.size();
    last = i;
  }
  sections.push_back({text.substr(last), -1});

  Tokens ids;
  if (add_special_tokens) ids = impl.prefix;
  // section_index counts every section, empty ones too, as transformers.js does (Metaspace's
  // prepend_scheme "first" prepends in section 0 only).
  for (size_t s = 0; s < sections.size(); ++s) {
    const Section& section = sections[s];
    if (section.added_id >= 0) {
      ids.push_back(section.added_id);
      continue;
    }
    if (section.text.empty()) continue;
    const std::string normalized = impl.NormalizeText(section.text);
    if (normalized.empty()) continue;
    for (const std::string& word : impl.PreTokenize(normalized, s)) {
      if (!word.empty()) impl.Bpe(word, ids);
    }
  }
  if (add_special_tokens) ids.insert(ids.end(), impl.suffix.begin(), impl.suffix.end());
  return ids;
}

std::string HfTokenizer::Decode(const Tokens& tokens, bool skip_special) const {
  std::vector<std::string> strings;
  std::vector<bool> added;
  for (Token id : tokens) {
    const std::string& s = impl_->TokenString(id);
    if (skip_special && impl_->special[id]) continue;
    strings.push_back(s);
    added.push_back(std::any_of(impl_->added.begin(), impl_->added.end(),
                                [&](const auto& a) { return a.id == id; }));
  }
  return impl_->RunDecoders(std::move(strings), added, /*at_start=*/true);
}

std::string HfTokenizer::DecodeNext(Token token, Token prev_token) const {
  const std::string& s = impl_->TokenString(token);
  const bool is_added = std::any_of(impl_->added.begin(), impl_->added.end(),
                                    [&](const auto& a) { return a.id == token; });
  const bool at_start = prev_token < 0 || IsSpecial(prev_token);
  return impl_->RunDecoders({s}, {is_added}, at_start);
}

int64_t HfTokenizer::VocabSize() const { return static_cast<int64_t>(impl_->id_to_token.size()); }

Token HfTokenizer::Lookup(const std::string& token) const {
  auto it = impl_->vocab.find(token);
  return it == impl_->vocab.end() ? -1 : it->second;
}

bool HfTokenizer::IsSpecial(Token id) const {
  return id >= 0 && id < static_cast<Token>(impl_->special.size()) && impl_->special[id];
}

const Tokens& HfTokenizer::PrefixIds() const { return impl_->prefix; }
const Tokens& HfTokenizer::SuffixIds() const { return impl_->suffix; }

std::string HfTokenizer::Describe() const {
  std::vector<std::string> parts;
  for (const char* role : {"normalizer", "pre_tokenizer", "post_processor", "decoder"}) {
    auto it = impl_->names.find(role);
    parts.push_back(fmt::format(
        "{} {}", role,
        it == impl_->names.end() ? "none" : fmt::format("{}", fmt::join(it->second, " "))));
  }
  return fmt::format("tokenizer.json: BPE, {} ids, {} merges{}, {} added tokens; {}", VocabSize(),
                     impl_->merges.size(), impl_->byte_fallback ? " with byte fallback" : "",
                     impl_->added.size(), fmt::join(parts, "; "));
}

}  // namespace kvdiff::format
