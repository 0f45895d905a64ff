// The machinery of format/tokenizer_json.cc shared by its files (internal: include only from
// format/tokenizer_*.cc): UTF-8 and GPT-2's byte map, regex patterns, and the tokenizer's
// pipeline (HfTokenizer::Impl). tokenizer_text.cc defines the text helpers, tokenizer_json_read.cc
// reads a tokenizer.json into an Impl, tokenizer_json.cc runs it.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "format/affixes.h"
#include "format/error.h"
#include "format/json_document.h"
#include "format/tokenizer_json.h"

namespace kvdiff::format {

// ---- UTF-8 ------------------------------------------------------------------------------------

// The length of the UTF-8 character starting at s[i], or 0 when the bytes there are not one.
size_t Utf8CharLength(const std::string& s, size_t i);
// The byte offset of the first byte that does not start a valid UTF-8 character, or npos. Checked
// with utf8proc, which also refuses overlong forms and surrogates.
size_t InvalidUtf8At(const std::string& s);
std::vector<std::string> Utf8Chars(const std::string& s);
std::string CodepointToUtf8(uint32_t cp);
std::string Nfc(const std::string& s);

// GPT-2's bytes_to_unicode: printable bytes stand for themselves, the other 68 are moved to
// U+0100.. in byte order, so every byte string is a printable string.
struct ByteMap {
  std::string to_char[256];  // byte -> UTF-8 of its stand-in character
  std::unordered_map<std::string, unsigned char> to_byte;
  ByteMap();
};
const ByteMap& Bytes();

// ---- PCRE2 ------------------------------------------------------------------------------------

// A compiled pattern with UTF and Unicode properties (\s, \p{L}, (?i) as Unicode defines them).
class Regex {
 public:
  Regex(const std::string& pattern, const std::string& where);
  // Every non-empty, non-overlapping match, left to right, as [begin, end) byte offsets.
  std::vector<std::pair<size_t, size_t>> FindAll(const std::string& s) const;

 private:
  std::shared_ptr<void> code_;  // the pcre2_code, freed by pcre2_code_free
};

// A "pattern" field: {"String": "..."} (literal) or {"Regex": "..."}.
struct Pattern {
  std::string literal;
  std::shared_ptr<Regex> regex;

  static Pattern Read(const nlohmann::json& j, const std::string& where);
  std::vector<std::pair<size_t, size_t>> FindAll(const std::string& s) const;
  std::string ReplaceAll(const std::string& s, const std::string& content) const;
};

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
                     JsonSnippet(nlohmann::json(ch)));
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
              for (size_t k = 0; k < d.start && StartsWith(t, d.content); ++k) {
                t.erase(0, d.content.size());
              }
            }
            for (size_t k = 0; k < d.stop && EndsWith(t, d.content); ++k) {
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

}  // namespace kvdiff::format
