// The tokenizer.json tokenizer at work: encoding (added tokens, normalizer, pre-tokenizer, model,
// post-processor) and decoding, over the pipeline tokenizer_json_read.cc builds
// (tokenizer_json_detail.h).
#include "format/tokenizer_json.h"

#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <vector>

#include "format/error.h"
#include "format/tokenizer_json_detail.h"

namespace kvdiff::format {

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
