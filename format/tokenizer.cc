#include "format/tokenizer.h"

#include <fmt/format.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "format/error.h"
#include "format/input_file.h"
#include "format/json_document.h"

namespace kvdiff::format {
namespace {

// llama2.c fixes the layout of the low ids: 0 <unk>, 1 BOS, 2 EOS, 3..258 the 256 byte tokens.
constexpr int kByteTokenOffset = 3;
constexpr int kNumByteTokens = 256;

std::string BytePiece(int byte) { return fmt::format("<0x{:02X}>", byte); }

// "<0xNN>" (two upper- or lower-case hex digits) -> NN, else -1.
int ParseBytePiece(const std::string& piece) {
  if (piece.size() != 6 || piece.compare(0, 3, "<0x") != 0 || piece[5] != '>') return -1;
  int value = 0;
  for (int i = 3; i < 5; ++i) {
    char c = piece[i];
    int digit = (c >= '0' && c <= '9')   ? c - '0'
                : (c >= 'A' && c <= 'F') ? c - 'A' + 10
                : (c >= 'a' && c <= 'f') ? c - 'a' + 10
                                         : -1;
    if (digit < 0) return -1;
    value = value * 16 + digit;
  }
  return value;
}

bool IsContinuationByte(unsigned char c) { return (c & 0xC0) == 0x80; }

bool IsValidUtf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      if (!IsContinuationByte(static_cast<unsigned char>(s[i + k]))) return false;
    }
    i += n;
  }
  return true;
}

std::string ReadWholeFile(const std::filesystem::path& path) {
  return ReadInputFile(path, "tokenizer file");
}

}  // namespace

Tokenizer::Tokenizer(std::vector<Entry> entries, int32_t max_token_length, Token bos_id,
                     Token eos_id)
    : entries_(std::move(entries)),
      max_token_length_(max_token_length),
      bos_id_(bos_id),
      eos_id_(eos_id) {
  const int64_t n = VocabSize();
  KVDIFF_CHECK(
      n >= kByteTokenOffset + kNumByteTokens,
      "tokenizer: expected at least {} tokens (<unk>, BOS, EOS and 256 byte tokens), got {}",
      kByteTokenOffset + kNumByteTokens, n);
  KVDIFF_CHECK(max_token_length > 0, "tokenizer: max_token_length must be positive, got {}",
               max_token_length);
  KVDIFF_CHECK(bos_id >= 0 && bos_id < n,
               "tokenizer: bos_token_id {} outside the vocabulary [0, {})", bos_id, n);
  KVDIFF_CHECK(eos_id >= 0 && eos_id < n,
               "tokenizer: eos_token_id {} outside the vocabulary [0, {})", eos_id, n);
  // Byte fallback computes ids as byte + 3 and decoding reads "<0xNN>" pieces: both must agree.
  for (int b = 0; b < kNumByteTokens; ++b) {
    const std::string& piece = entries_[b + kByteTokenOffset].piece;
    KVDIFF_CHECK(ParseBytePiece(piece) == b,
                 "tokenizer: token {} must be the byte token {}, got \"{}\"", b + kByteTokenOffset,
                 BytePiece(b), piece);
  }
  index_.reserve(entries_.size());
  for (int64_t id = 0; id < n; ++id) {
    const std::string& piece = entries_[id].piece;
    KVDIFF_CHECK(static_cast<int64_t>(piece.size()) <= max_token_length,
                 "tokenizer: token {} is {} bytes long, longer than max_token_length {}", id,
                 piece.size(), max_token_length);
    auto [it, inserted] = index_.emplace(piece, static_cast<Token>(id));
    KVDIFF_CHECK(inserted, "tokenizer: tokens {} and {} have the same piece \"{}\"", it->second, id,
                 piece);
  }
}

Tokenizer Tokenizer::ReadLlama2c(const std::filesystem::path& path, int64_t vocab_size) {
  const std::string data = ReadWholeFile(path);
  const std::string name = path.string();
  size_t offset = 0;
  // Reads `size` bytes at the cursor, or throws naming what was being read.
  auto take = [&](void* out, size_t size, const std::string& what) {
    KVDIFF_CHECK(
        data.size() - offset >= size,
        "tokenizer {}: truncated while reading {}: expected {} bytes at offset {}, the file "
        "has {} bytes ({} left)",
        name, what, size, offset, data.size(), data.size() - offset);
    std::memcpy(out, data.data() + offset, size);
    offset += size;
  };
  int32_t max_token_length = 0;
  take(&max_token_length, sizeof(max_token_length), "the header (int32 max_token_length)");
  KVDIFF_CHECK(max_token_length > 0, "tokenizer {}: max_token_length must be positive, got {}",
               name, max_token_length);

  std::vector<Entry> entries;
  for (int64_t id = 0; vocab_size < 0 ? offset < data.size() : id < vocab_size; ++id) {
    Entry entry;
    int32_t length = 0;
    take(&entry.score, sizeof(float), fmt::format("the score of token {}", id));
    take(&length, sizeof(int32_t), fmt::format("the length of token {}", id));
    KVDIFF_CHECK(length >= 0 && length <= max_token_length,
                 "tokenizer {}: token {} has length {}, expected 0..{} (max_token_length)", name,
                 id, length, max_token_length);
    // Check the bytes are there before allocating them: a corrupt length must not allocate.
    const std::string what = fmt::format("the {} bytes of token {}", length, id);
    KVDIFF_CHECK(data.size() - offset >= static_cast<size_t>(length),
                 "tokenizer {}: truncated while reading {}: expected {} bytes at offset {}, the "
                 "file has {} bytes ({} left)",
                 name, what, length, offset, data.size(), data.size() - offset);
    entry.piece.assign(data.data() + offset, static_cast<size_t>(length));
    offset += length;
    entries.push_back(std::move(entry));
  }
  KVDIFF_CHECK(offset == data.size(),
               "tokenizer {}: expected {} bytes for {} tokens, the file has {} bytes", name, offset,
               vocab_size, data.size());
  try {
    return Tokenizer(std::move(entries), max_token_length);
  } catch (const InputError& e) {
    throw InputError(fmt::format("{}: {}", name, e.what()));
  }
}

std::string Tokenizer::ToJson() const {
  KVDIFF_CHECK(!hf_, "a tokenizer.json tokenizer is not written as {}", kTokenizerFileName);
  // One piece per line: the file stays diffable and readable (index in "pieces" = token id).
  nlohmann::ordered_json head;
  head["format"] = kTokenizerFormatName;
  head["version"] = 1;
  head["max_token_length"] = max_token_length_;
  head["bos_token_id"] = bos_id_;
  head["eos_token_id"] = eos_id_;
  std::string out = "{\n";
  for (const auto& [key, value] : head.items()) {
    out += fmt::format(" {}: {},\n", nlohmann::json(key).dump(), value.dump());
  }
  out += " \"pieces\": [\n";
  for (size_t id = 0; id < entries_.size(); ++id) {
    const Entry& entry = entries_[id];
    nlohmann::ordered_json item;
    if (IsValidUtf8(entry.piece)) {
      item["piece"] = entry.piece;
    } else {
      std::vector<int> bytes;
      for (char c : entry.piece) bytes.push_back(static_cast<unsigned char>(c));
      item["bytes"] = bytes;
    }
    item["score"] = entry.score;
    out += "  " + item.dump() + (id + 1 < entries_.size() ? ",\n" : "\n");
  }
  out += " ]\n}\n";
  return out;
}

void Tokenizer::Save(const std::filesystem::path& path) const {
  KVDIFF_CHECK(!hf_, "a tokenizer.json tokenizer is not written as {}", kTokenizerFileName);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  KVDIFF_CHECK(out.good(), "cannot write tokenizer file {}", path.string());
  out << ToJson();
  out.close();
  KVDIFF_CHECK(out.good(), "failed writing tokenizer file {}", path.string());
}

Tokenizer Tokenizer::Parse(const std::string& json_text) {
  const nlohmann::json doc = ParseJsonDocument(json_text, "tokenizer");
  KVDIFF_CHECK(doc.is_object(), "tokenizer: expected a JSON object, got {}", doc.type_name());
  auto field = [&](const char* key) -> const nlohmann::json& {
    KVDIFF_CHECK(doc.contains(key), "tokenizer: missing field \"{}\"", key);
    return doc.at(key);
  };
  auto integer = [&](const char* key) -> int64_t {
    const auto& v = field(key);
    KVDIFF_CHECK(v.is_number_integer(), "tokenizer: field \"{}\" must be an integer, got {}", key,
                 v.dump());
    return v.get<int64_t>();
  };
  const auto& format = field("format");
  KVDIFF_CHECK(format.is_string() && format.get<std::string>() == kTokenizerFormatName,
               "tokenizer: field \"format\" must be \"{}\", got {}", kTokenizerFormatName,
               format.dump());
  KVDIFF_CHECK(integer("version") == 1, "tokenizer: unsupported version {}, expected 1",
               integer("version"));
  const int64_t max_len = integer("max_token_length");
  KVDIFF_CHECK(max_len > 0 && max_len <= INT32_MAX,
               "tokenizer: max_token_length must be in 1..{}, got {}", INT32_MAX, max_len);
  const int64_t bos = integer("bos_token_id");
  const int64_t eos = integer("eos_token_id");
  const auto& pieces = field("pieces");
  KVDIFF_CHECK(pieces.is_array(), "tokenizer: field \"pieces\" must be an array, got {}",
               pieces.type_name());
  KVDIFF_CHECK(bos >= 0 && bos < static_cast<int64_t>(pieces.size()) && eos >= 0 &&
                   eos < static_cast<int64_t>(pieces.size()),
               "tokenizer: bos_token_id {} and eos_token_id {} must be in [0, {})", bos, eos,
               pieces.size());
  std::vector<Entry> entries;
  entries.reserve(pieces.size());
  for (size_t id = 0; id < pieces.size(); ++id) {
    const auto& item = pieces[id];
    KVDIFF_CHECK(item.is_object(), "tokenizer: pieces[{}] must be an object, got {}", id,
                 item.dump());
    Entry entry;
    if (item.contains("piece") && item["piece"].is_string()) {
      entry.piece = item["piece"].get<std::string>();
    } else if (item.contains("bytes") && item["bytes"].is_array()) {
      for (const auto& b : item["bytes"]) {
        KVDIFF_CHECK(b.is_number_integer() && b.get<int64_t>() >= 0 && b.get<int64_t>() <= 255,
                     "tokenizer: pieces[{}].bytes must hold integers 0..255, got {}", id, b.dump());
        entry.piece.push_back(static_cast<char>(b.get<int>()));
      }
    } else {
      throw InputError(fmt::format(
          "tokenizer: pieces[{}] needs a string \"piece\" or a byte array \"bytes\", got {}", id,
          item.dump()));
    }
    KVDIFF_CHECK(item.contains("score") && item["score"].is_number(),
                 "tokenizer: pieces[{}] needs a numeric \"score\", got {}", id, item.dump());
    entry.score = item["score"].get<float>();
    entries.push_back(std::move(entry));
  }
  return Tokenizer(std::move(entries), static_cast<int32_t>(max_len), static_cast<Token>(bos),
                   static_cast<Token>(eos));
}

Tokenizer Tokenizer::Load(const std::filesystem::path& path) {
  try {
    return Parse(ReadWholeFile(path));
  } catch (const InputError& e) {
    throw InputError(fmt::format("{}: {}", path.string(), e.what()));
  }
}

void Tokenizer::CheckFitsVocabulary(int64_t vocab_size, const std::string& dir) const {
  if (hf_) {
    KVDIFF_CHECK(VocabSize() <= vocab_size,
                 "{}/{} has token ids up to {}, but config.json says vocab_size {}", dir,
                 FileName(), VocabSize() - 1, vocab_size);
  } else {
    KVDIFF_CHECK(VocabSize() == vocab_size, "{}/{} has {} tokens, config.json says vocab_size {}",
                 dir, FileName(), VocabSize(), vocab_size);
  }
}

std::optional<Tokenizer> Tokenizer::LoadFromModelDir(const std::filesystem::path& dir) {
  const auto ours = dir / kTokenizerFileName;
  if (std::filesystem::exists(ours)) return Load(ours);
  const auto hf = dir / kHfTokenizerFileName;
  if (!std::filesystem::exists(hf)) return std::nullopt;
  HfTokenizer tokenizer = HfTokenizer::Load(hf);
  // tokenizer_config.json names BOS/EOS as a string or as {"content": ...} (an AddedToken).
  Token ids[2] = {-1, -1};
  const auto config_path = dir / "tokenizer_config.json";
  if (std::filesystem::exists(config_path)) {
    const nlohmann::json config =
        ParseJsonDocument(ReadInputFile(config_path, "tokenizer config"), config_path.string());
    const char* keys[2] = {"bos_token", "eos_token"};
    for (int k = 0; k < 2; ++k) {
      if (!config.is_object() || !config.contains(keys[k]) || config[keys[k]].is_null()) continue;
      const nlohmann::json& v = config[keys[k]];
      const nlohmann::json& content = v.is_object() && v.contains("content") ? v["content"] : v;
      KVDIFF_CHECK(content.is_string(), "{}: {} must be a string or {{\"content\": ...}}, got {}",
                   config_path.string(), keys[k], v.dump());
      ids[k] = tokenizer.Lookup(content.get<std::string>());
      KVDIFF_CHECK(ids[k] >= 0, "{}: {} {} is not a token of {}", config_path.string(), keys[k],
                   content.dump(), hf.string());
    }
  }
  return FromHf(std::move(tokenizer), ids[0], ids[1]);
}

Tokenizer Tokenizer::FromHf(HfTokenizer hf, Token bos_id, Token eos_id) {
  Tokenizer t;
  t.bos_id_ = bos_id;
  t.eos_id_ = eos_id;
  t.hf_ = std::move(hf);
  return t;
}

const Tokenizer::Entry& Tokenizer::At(Token id) const {
  KVDIFF_CHECK(!hf_, "a tokenizer.json tokenizer has no scored pieces (At({}))", id);
  KVDIFF_CHECK(id >= 0 && id < VocabSize(), "token id {} outside the vocabulary [0, {})", id,
               VocabSize());
  return entries_[id];
}

Token Tokenizer::Lookup(const std::string& piece) const {
  if (hf_) return hf_->Lookup(piece);
  auto it = index_.find(piece);
  return it == index_.end() ? -1 : it->second;
}

Tokens Tokenizer::Encode(const std::string& text, bool add_bos) const {
  if (hf_) return hf_->Encode(text, /*add_special_tokens=*/add_bos);
  Tokens tokens;
  if (add_bos) tokens.push_back(bos_id_);

  // Appends the id of a piece, or its bytes as byte tokens when the vocabulary lacks it.
  auto push_piece = [&](const std::string& piece) {
    Token id = Lookup(piece);
    if (id >= 0) {
      tokens.push_back(id);
      return;
    }
    for (char c : piece) tokens.push_back(static_cast<unsigned char>(c) + kByteTokenOffset);
  };
  // sentencepiece's dummy prefix: "Hello" is tokenized as " Hello".
  if (!text.empty()) push_piece(" ");

  // One UTF-8 character at a time: a byte and the continuation bytes after it, at most 4 bytes
  // (llama2.c's rule, which also keeps malformed input moving forward one chunk at a time).
  size_t i = 0;
  while (i < text.size()) {
    size_t end = i + 1;
    while (end < text.size() && end - i < 4 &&
           IsContinuationByte(static_cast<unsigned char>(text[end]))) {
      ++end;
    }
    push_piece(text.substr(i, end - i));
    i = end;
  }

  // Merge the best-scoring adjacent pair until none merges. BOS takes part like any other token, as
  // in llama2.c (its piece "\n<s>\n" never starts a vocabulary entry in practice).
  while (true) {
    float best_score = 0.0f;
    Token best_id = -1;
    size_t best_at = 0;
    for (size_t k = 0; k + 1 < tokens.size(); ++k) {
      const std::string merged = entries_[tokens[k]].piece + entries_[tokens[k + 1]].piece;
      Token id = Lookup(merged);
      // Strictly greater: on a tie the first (leftmost) pair wins.
      if (id >= 0 && (best_id < 0 || entries_[id].score > best_score)) {
        best_score = entries_[id].score;
        best_id = id;
        best_at = k;
      }
    }
    if (best_id < 0) break;
    tokens[best_at] = best_id;
    tokens.erase(tokens.begin() + static_cast<std::ptrdiff_t>(best_at) + 1);
  }
  return tokens;
}

std::string Tokenizer::Decode(Token token, Token prev_token) const {
  if (hf_) return hf_->DecodeNext(token, prev_token);
  const std::string& piece = At(token).piece;
  const int byte = ParseBytePiece(piece);
  if (byte >= 0) return std::string(1, static_cast<char>(byte));
  if (prev_token == bos_id_ && !piece.empty() && piece[0] == ' ') return piece.substr(1);
  return piece;
}

std::string Tokenizer::DecodeAll(const Tokens& tokens, Token prev_token) const {
  std::string out;
  for (Token t : tokens) {
    out += Decode(t, prev_token);
    prev_token = t;
  }
  return out;
}

}  // namespace kvdiff::format
