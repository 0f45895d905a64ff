// The llama2.c / sentencepiece-style tokenizer (a scored vocabulary with byte fallback), read from
// llama2.c's tokenizer.bin (e.g. tok512.bin) and kept beside a converted model in a JSON file of
// ours, "tokenizer.kvdiff.json" (named so it is never mistaken for a HuggingFace tokenizer.json):
//
//   {"format": "kvdiff-llama2c-tokenizer", "version": 1, "max_token_length": 7,
//    "bos_token_id": 1, "eos_token_id": 2,
//    "pieces": [{"piece": "<unk>", "score": 0.0}, ...]}   // index in "pieces" = token id
//
// A piece whose bytes are not valid UTF-8 is written as {"bytes": [b0, b1, ...], "score": s}.
//
// A Tokenizer can also stand for a HuggingFace tokenizer.json (format/tokenizer_json.h): a model
// directory's text goes through LoadFromModelDir, which picks the file, so every caller (generate,
// scenario "text", repro, tokenize) takes the same text to the same ids.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "format/tensor.h"
#include "format/tokenizer_json.h"

namespace kvdiff::format {

inline constexpr const char* kTokenizerFileName = "tokenizer.kvdiff.json";
inline constexpr const char* kTokenizerFormatName = "kvdiff-llama2c-tokenizer";

class Tokenizer {
 public:
  struct Entry {
    std::string piece;  // raw bytes; byte tokens are spelled "<0xNN>"
    float score = 0.0f;
  };

  // Validates: at least 3 tokens (unk, BOS, EOS), pieces no longer than max_token_length, no
  // duplicate piece, bos/eos ids inside the vocabulary. Throws InputError naming what is wrong.
  Tokenizer(std::vector<Entry> entries, int32_t max_token_length, Token bos_id = 1,
            Token eos_id = 2);

  // llama2.c's tokenizer.bin: int32 max_token_length, then per token float32 score, int32 length,
  // bytes. vocab_size < 0 reads records until the end of the file; otherwise exactly vocab_size
  // records must be there and nothing after them. Throws InputError with expected vs actual bytes.
  static Tokenizer ReadLlama2c(const std::filesystem::path& path, int64_t vocab_size = -1);
  // Our JSON file (see the top of this header).
  static Tokenizer Load(const std::filesystem::path& path);
  static Tokenizer Parse(const std::string& json_text);  // throws InputError naming the field
  void Save(const std::filesystem::path& path) const;
  std::string ToJson() const;  // deterministic text

  // DIR/tokenizer.kvdiff.json when present, else DIR/tokenizer.json (HuggingFace; BOS/EOS ids from
  // DIR/tokenizer_config.json's bos_token/eos_token when it names them, else -1), else nullopt.
  static std::optional<Tokenizer> LoadFromModelDir(const std::filesystem::path& dir);
  // A tokenizer.json tokenizer. Encode's add_bos means add_special_tokens (its post-processor);
  // Decode is HfTokenizer::DecodeNext. Save, ToJson and At throw: it has no scored pieces.
  static Tokenizer FromHf(HfTokenizer hf, Token bos_id, Token eos_id);
  const HfTokenizer* Hf() const { return hf_ ? &*hf_ : nullptr; }
  // "tokenizer.kvdiff.json" or "tokenizer.json": the file a model directory's tokenizer came from.
  const char* FileName() const { return hf_ ? kHfTokenizerFileName : kTokenizerFileName; }
  // Whether this tokenizer fits a model of vocab_size rows (throws InputError naming dir, the file
  // and both sizes): our files and llama2.c's cover the vocabulary exactly; a tokenizer.json may
  // cover less, as checkpoints pad their embedding matrix past the last token.
  void CheckFitsVocabulary(int64_t vocab_size, const std::string& dir) const;

  // As llama2.c encodes: optional BOS; a " " dummy prefix when text is non-empty; each UTF-8
  // character (a lead byte and up to 3 continuation bytes) looked up whole, else its bytes as byte
  // tokens (id = byte + 3); then, while some adjacent pair's concatenated pieces are in the
  // vocabulary, merge the pair with the highest score (the first such pair on a tie).
  Tokens Encode(const std::string& text, bool add_bos) const;
  // The bytes of one token: "<0xNN>" pieces give the raw byte; right after BOS (prev_token == BOS)
  // a leading space is dropped. Throws InputError for an id outside the vocabulary.
  std::string Decode(Token token, Token prev_token) const;
  // Concatenated Decode of every token, each with its predecessor (the first with prev_token).
  std::string DecodeAll(const Tokens& tokens, Token prev_token) const;

  int64_t VocabSize() const {
    return hf_ ? hf_->VocabSize() : static_cast<int64_t>(entries_.size());
  }
  int32_t MaxTokenLength() const { return max_token_length_; }
  Token BosId() const { return bos_id_; }
  Token EosId() const { return eos_id_; }
  const Entry& At(Token id) const;  // throws InputError for an id outside the vocabulary
  // The id of a piece, or -1.
  Token Lookup(const std::string& piece) const;

 private:
  Tokenizer() = default;  // FromHf
  std::vector<Entry> entries_;
  std::unordered_map<std::string, Token> index_;
  int32_t max_token_length_ = 0;
  Token bos_id_ = 1;
  Token eos_id_ = 2;
  std::optional<HfTokenizer> hf_;
};

}  // namespace kvdiff::format
