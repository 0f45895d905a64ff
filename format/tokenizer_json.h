// A HuggingFace tokenizers "tokenizer.json" (the file beside a real checkpoint: SmolLM2, Llama 2
// and 3, TinyLlama, Mistral, Qwen), read strictly: every component this file names must be one we
// implement, or loading throws InputError naming it. Encoding follows tokenizers' pipeline:
//
//   text -> added tokens split out (matched first, longest at each position, never normalized)
//        -> normalizer (Sequence, Prepend, Replace, NFC)
//        -> pre-tokenizer (Sequence, ByteLevel, Split, Metaspace, Digits)
//        -> BPE model (merges by rank; byte-level or SentencePiece-style <0xNN> byte fallback)
//        -> post-processor (TemplateProcessing, ByteLevel, Sequence) when add_special_tokens
//
// and decoding runs the file's decoder (ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace,
// Sequence). Decoding returns bytes: a token sequence that ends inside a UTF-8 character gives the
// partial bytes, not U+FFFD, so a streamed generation prints the character when it is complete.
#pragma once

#include <filesystem>
#include <memory>
#include <string>

#include "format/tensor.h"

namespace kvdiff::format {

inline constexpr const char* kHfTokenizerFileName = "tokenizer.json";

class HfTokenizer {
 public:
  // Throws InputError naming the field or the component that is malformed or not implemented.
  static HfTokenizer Parse(const std::string& json_text);
  static HfTokenizer Load(const std::filesystem::path& path);  // the message starts with the path

  // Throws InputError for text that is not valid UTF-8 (naming the byte offset): tokenizers takes
  // a Rust String and transformers.js a JS string, so neither can be given such bytes.
  Tokens Encode(const std::string& text, bool add_special_tokens) const;
  // The decoder chain over the tokens' strings. Special tokens are kept unless skip_special.
  std::string Decode(const Tokens& tokens, bool skip_special) const;
  // One token's bytes for streaming: Decode({token}), except that decoders which act on the start
  // of a sequence (Strip's leading characters, Metaspace's prefix space) act only when prev_token
  // is -1 or a special token.
  std::string DecodeNext(Token token, Token prev_token) const;

  int64_t VocabSize() const;                     // the highest id (model or added token) + 1
  Token Lookup(const std::string& token) const;  // the id of a token string, or -1
  bool IsSpecial(Token id) const;                // an added token marked "special"
  // The ids TemplateProcessing puts before and after a single sequence (BOS/EOS), for display.
  const Tokens& PrefixIds() const;
  const Tokens& SuffixIds() const;
  std::string Describe() const;  // one line: model, normalizer, pre-tokenizer, decoder, vocab

  struct Impl;

 private:
  explicit HfTokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;  // immutable after Parse, so copies share it
};

}  // namespace kvdiff::format
