// The llama2.c tokenizer: tok512.bin parsing, encode against a scalar re-implementation kept here,
// round trips, the tie rule, our JSON file, and refusal of malformed files.
#include "format/tokenizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <typeinfo>
#include <vector>

#include "format/error.h"
#include "tests/test_support.h"

namespace kvdiff::format {
namespace {

using ::testing::HasSubstr;

std::string ReadBytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}
void WriteBytes(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
}
template <typename T>
void Append(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof(T));
}

// A minimal vocabulary in llama2.c's id layout plus `extra` pieces with their scores.
Tokenizer SmallTokenizer(const std::vector<std::pair<std::string, float>>& extra) {
  std::vector<Tokenizer::Entry> entries = {{"<unk>", 0}, {"\n<s>\n", 0}, {"\n</s>\n", 0}};
  for (int b = 0; b < 256; ++b) entries.push_back({fmt::format("<0x{:02X}>", b), 0});
  for (const auto& [piece, score] : extra) entries.push_back({piece, score});
  return Tokenizer(entries, 8);
}

// The scalar, obviously-correct encoder: strings instead of ids, linear search instead of a map.
std::vector<std::string> NaiveEncodePieces(const Tokenizer& tok, const std::string& text) {
  auto in_vocab = [&](const std::string& s) {
    for (int64_t id = 0; id < tok.VocabSize(); ++id) {
      if (tok.At(static_cast<Token>(id)).piece == s) return static_cast<Token>(id);
    }
    return Token{-1};
  };
  std::vector<std::string> pieces;
  auto add = [&](const std::string& s) {
    if (in_vocab(s) >= 0) {
      pieces.push_back(s);
    } else {
      for (unsigned char c : s) pieces.push_back(fmt::format("<0x{:02X}>", c));
    }
  };
  if (text.empty()) return pieces;
  add(" ");
  std::string current;
  for (size_t i = 0; i < text.size(); ++i) {
    current += text[i];
    const bool next_continues =
        i + 1 < text.size() && (static_cast<unsigned char>(text[i + 1]) & 0xC0) == 0x80;
    if (next_continues && current.size() < 4) continue;
    add(current);
    current.clear();
  }
  for (;;) {
    int best = -1;
    float best_score = 0;
    for (size_t k = 0; k + 1 < pieces.size(); ++k) {
      Token id = in_vocab(pieces[k] + pieces[k + 1]);
      if (id >= 0 && (best < 0 || tok.At(id).score > best_score)) {
        best = static_cast<int>(k);
        best_score = tok.At(id).score;
      }
    }
    if (best < 0) return pieces;
    pieces[best] += pieces[best + 1];
    pieces.erase(pieces.begin() + best + 1);
  }
}

std::vector<std::string> PiecesOf(const Tokenizer& tok, const Tokens& tokens) {
  std::vector<std::string> out;
  for (Token t : tokens) out.push_back(tok.At(t).piece);
  return out;
}

// Strings covering ASCII, punctuation, multibyte UTF-8, bytes the vocabulary lacks, and malformed
// UTF-8 (a lone continuation byte, a truncated lead byte, five continuation bytes in a row).
const std::vector<std::string> kSamples = {
    "Once upon a time, there was a little girl named Lily.",
    "Hello world",
    "  two leading spaces and trailing  ",
    "tab\tnew\nline",
    "caf\xC3\xA9 na\xC3\xAFve",
    "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E",  // 日本語
    "emoji \xF0\x9F\x98\x80!",
    std::string("\x01\x02\x7f", 3),
    std::string("nul\0byte", 8),
    "\x80 lone continuation",
    "truncated \xE6\x97",
    "\xC3\x80\x80\x80\x80\x80 long run",
    "The dog",
    "a",
    " ",
};

TEST(TokenizerTest, ReadsTok512) {
  KVDIFF_REQUIRE_SHARED_DATA(data);
  Tokenizer tok = Tokenizer::ReadLlama2c(data / "stories260K" / "tok512.bin");
  EXPECT_EQ(tok.VocabSize(), 512);
  EXPECT_EQ(tok.MaxTokenLength(), 7);
  EXPECT_EQ(tok.At(0).piece, "<unk>");
  EXPECT_EQ(tok.At(1).piece, "\n<s>\n");
  EXPECT_EQ(tok.At(2).piece, "\n</s>\n");
  EXPECT_EQ(tok.At(3 + 'A').piece, "<0x41>");
  // With the vocabulary size given, exactly that many records must be there.
  EXPECT_EQ(Tokenizer::ReadLlama2c(data / "stories260K" / "tok512.bin", 512).VocabSize(), 512);
}

TEST(TokenizerTest, EncodeMatchesScalarReimplementationOnTok512) {
  KVDIFF_REQUIRE_SHARED_DATA(data);
  Tokenizer tok = Tokenizer::ReadLlama2c(data / "stories260K" / "tok512.bin");
  for (const std::string& text : kSamples) {
    Tokens tokens = tok.Encode(text, /*add_bos=*/false);
    EXPECT_EQ(PiecesOf(tok, tokens), NaiveEncodePieces(tok, text)) << "text: " << text;
  }
  // Random strings over an alphabet mixing frequent letters, spaces, and multibyte characters.
  const std::vector<std::string> alphabet = {
      "a",    "e",   "t", " ", "h", "o", "n", "s", ".", ",", "L", "\xC3\xA9", "\xE2\x82\xAC",
      "\x01", "\xFF"};
  std::mt19937 rng(6);
  for (int trial = 0; trial < 200; ++trial) {
    std::string text;
    const int len = static_cast<int>(rng() % 24);
    for (int i = 0; i < len; ++i) text += alphabet[rng() % alphabet.size()];
    EXPECT_EQ(PiecesOf(tok, tok.Encode(text, false)), NaiveEncodePieces(tok, text))
        << "text: " << text;
  }
}

TEST(TokenizerTest, RoundTripsOnTok512) {
  KVDIFF_REQUIRE_SHARED_DATA(data);
  Tokenizer tok = Tokenizer::ReadLlama2c(data / "stories260K" / "tok512.bin");
  for (const std::string& text : kSamples) {
    Tokens tokens = tok.Encode(text, /*add_bos=*/true);
    ASSERT_FALSE(tokens.empty());
    EXPECT_EQ(tokens[0], 1);
    Tokens body(tokens.begin() + 1, tokens.end());
    // The dummy-prefix space is the leading space dropped after BOS.
    EXPECT_EQ(tok.DecodeAll(body, /*prev_token=*/1), text) << "text: " << text;
  }
}

TEST(TokenizerTest, KnownProperties) {
  KVDIFF_REQUIRE_SHARED_DATA(data);
  Tokenizer tok = Tokenizer::ReadLlama2c(data / "stories260K" / "tok512.bin");
  EXPECT_EQ(tok.Encode("", true), Tokens{1});
  EXPECT_TRUE(tok.Encode("", false).empty());
  // "日" is not a piece of this 512-token vocabulary: its three bytes fall back to byte tokens.
  ASSERT_EQ(tok.Lookup("\xE6\x97\xA5"), -1);
  EXPECT_EQ(tok.Encode("\xE6\x97\xA5", true),
            (Tokens{1, tok.Lookup(" "), 0xE6 + 3, 0x97 + 3, 0xA5 + 3}));
  // Frequent words are single tokens carrying the dummy-prefix space.
  const Token the = tok.Lookup(" the");
  ASSERT_GE(the, 0);
  EXPECT_EQ(tok.Encode("the", false), Tokens{the});
  // Encode with BOS is BOS followed by encode without it.
  for (const std::string& text : kSamples) {
    Tokens with = tok.Encode(text, true);
    Tokens without = tok.Encode(text, false);
    without.insert(without.begin(), 1);
    EXPECT_EQ(with, without) << "text: " << text;
  }
}

TEST(TokenizerTest, DecodeRules) {
  Tokenizer tok = SmallTokenizer({{" Once", -1.0f}, {" ", -2.0f}});
  const Token once = tok.Lookup(" Once");
  EXPECT_EQ(tok.Decode(once, /*prev_token=*/1), "Once");  // after BOS the space goes
  EXPECT_EQ(tok.Decode(once, /*prev_token=*/0), " Once");
  EXPECT_EQ(tok.Decode(3 + 0x41, 5), "A");  // <0x41>
  EXPECT_EQ(tok.Decode(3 + 0x20, 1), " ");  // a byte token keeps its space
  EXPECT_EQ(tok.Decode(3 + 0xFF, 5), std::string(1, '\xFF'));
  try {
    tok.Decode(static_cast<Token>(tok.VocabSize()), 0);
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(), HasSubstr("token id 261 outside the vocabulary [0, 261)"));
  }
}

TEST(TokenizerTest, TiesMergeTheFirstPair) {
  // " aba": the pairs "ab" and "ba" both merge; with equal scores the leftmost wins.
  Tokenizer tie = SmallTokenizer({{" ", 0}, {"a", 0}, {"b", 0}, {"ab", -1}, {"ba", -1}});
  EXPECT_EQ(PiecesOf(tie, tie.Encode("aba", false)), (std::vector<std::string>{" ", "ab", "a"}));
  Tokenizer later_wins = SmallTokenizer({{" ", 0}, {"a", 0}, {"b", 0}, {"ab", -2}, {"ba", -1}});
  EXPECT_EQ(PiecesOf(later_wins, later_wins.Encode("aba", false)),
            (std::vector<std::string>{" ", "a", "ba"}));
  // Merges repeat until nothing merges: " ab" + "a" -> " aba".
  Tokenizer chain =
      SmallTokenizer({{" ", 0}, {"a", 0}, {"b", 0}, {" a", -1}, {" ab", -2}, {" aba", -3}});
  EXPECT_EQ(PiecesOf(chain, chain.Encode("aba", false)), (std::vector<std::string>{" aba"}));
}

TEST(TokenizerTest, JsonFileRoundTrips) {
  kvdiff::testing::TempDir dir;
  // "\xFF\xFE" is not UTF-8: it is stored as a byte array.
  Tokenizer tok =
      SmallTokenizer({{" ", -0.5f}, {"he", -1.25f}, {"\xFF\xFE", -3.0f}, {"\xC3\xA9", -7.0f}});
  tok.Save(dir / kTokenizerFileName);
  const std::string text = ReadBytes(dir / kTokenizerFileName);
  EXPECT_THAT(text, HasSubstr("\"format\": \"kvdiff-llama2c-tokenizer\""));
  EXPECT_THAT(text, HasSubstr("\"bytes\""));
  auto loaded = Tokenizer::LoadFromModelDir(dir.path());
  ASSERT_TRUE(loaded.has_value());
  ASSERT_EQ(loaded->VocabSize(), tok.VocabSize());
  for (Token id = 0; id < tok.VocabSize(); ++id) {
    EXPECT_EQ(loaded->At(id).piece, tok.At(id).piece) << "id " << id;
    EXPECT_EQ(loaded->At(id).score, tok.At(id).score) << "id " << id;
  }
  EXPECT_EQ(loaded->ToJson(), text);  // deterministic
  kvdiff::testing::TempDir empty;
  EXPECT_FALSE(Tokenizer::LoadFromModelDir(empty.path()).has_value());
}

TEST(TokenizerTest, RealTokenizerJsonRoundTrips) {
  KVDIFF_REQUIRE_SHARED_DATA(data);
  kvdiff::testing::TempDir dir;
  Tokenizer tok = Tokenizer::ReadLlama2c(data / "stories260K" / "tok512.bin");
  tok.Save(dir / kTokenizerFileName);
  Tokenizer loaded = Tokenizer::Load(dir / kTokenizerFileName);
  for (const std::string& text : kSamples)
    EXPECT_EQ(loaded.Encode(text, true), tok.Encode(text, true));
}

std::string ErrorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no InputError)";
}

TEST(TokenizerTest, RefusesMalformedLlama2cFiles) {
  kvdiff::testing::TempDir dir;
  // A well-formed 260-token file, then damaged copies.
  std::string good;
  Append<int32_t>(good, 6);
  std::vector<std::string> pieces = {"<unk>", "\n<s>\n", "\n</s>\n"};
  for (int b = 0; b < 256; ++b) pieces.push_back(fmt::format("<0x{:02X}>", b));
  pieces.push_back("ab");
  for (const auto& p : pieces) {
    Append<float>(good, 0.0f);
    Append<int32_t>(good, static_cast<int32_t>(p.size()));
    good += p;
  }
  WriteBytes(dir / "good.bin", good);
  EXPECT_EQ(Tokenizer::ReadLlama2c(dir / "good.bin").VocabSize(), 260);

  WriteBytes(dir / "short.bin", good.substr(0, good.size() - 1));
  EXPECT_THAT(ErrorOf([&] { Tokenizer::ReadLlama2c(dir / "short.bin"); }),
              HasSubstr("truncated while reading the 2 bytes of token 259: expected 2 bytes"));

  WriteBytes(dir / "header.bin", "ab");
  EXPECT_THAT(ErrorOf([&] { Tokenizer::ReadLlama2c(dir / "header.bin"); }),
              HasSubstr("expected 4 bytes at offset 0, the file has 2 bytes"));

  EXPECT_THAT(ErrorOf([&] { Tokenizer::ReadLlama2c(dir / "good.bin", 300); }),
              HasSubstr("truncated while reading the score of token 260"));
  EXPECT_THAT(ErrorOf([&] { Tokenizer::ReadLlama2c(dir / "good.bin", 259); }),
              HasSubstr(fmt::format("expected {} bytes for 259 tokens, the file has {} bytes",
                                    good.size() - 4 - 4 - 2, good.size())));

  std::string negative = good;
  const int32_t minus_one = -1;
  std::memcpy(negative.data() + 4 + 4, &minus_one, 4);  // length of token 0
  WriteBytes(dir / "negative.bin", negative);
  EXPECT_THAT(ErrorOf([&] { Tokenizer::ReadLlama2c(dir / "negative.bin"); }),
              HasSubstr("token 0 has length -1, expected 0..6 (max_token_length)"));

  std::string zero_max = good;
  std::memset(zero_max.data(), 0, 4);
  WriteBytes(dir / "zero.bin", zero_max);
  EXPECT_THAT(ErrorOf([&] { Tokenizer::ReadLlama2c(dir / "zero.bin"); }),
              HasSubstr("max_token_length must be positive, got 0"));

  EXPECT_THAT(ErrorOf([&] { Tokenizer::ReadLlama2c(dir / "missing.bin"); }),
              HasSubstr("cannot open tokenizer file"));
}

TEST(TokenizerTest, RefusesInconsistentVocabularies) {
  std::vector<Tokenizer::Entry> entries = {{"<unk>", 0}, {"<s>", 0}, {"</s>", 0}};
  EXPECT_THAT(
      ErrorOf([&] { Tokenizer(entries, 8); }),
      HasSubstr("expected at least 259 tokens (<unk>, BOS, EOS and 256 byte tokens), got 3"));
  for (int b = 0; b < 256; ++b) entries.push_back({fmt::format("<0x{:02X}>", b), 0});
  std::vector<Tokenizer::Entry> swapped = entries;
  std::swap(swapped[3].piece, swapped[4].piece);
  EXPECT_THAT(ErrorOf([&] { Tokenizer(swapped, 8); }),
              HasSubstr("token 3 must be the byte token <0x00>, got \"<0x01>\""));
  std::vector<Tokenizer::Entry> dup = entries;
  dup.push_back({"<unk>", 0});
  EXPECT_THAT(ErrorOf([&] { Tokenizer(dup, 8); }),
              HasSubstr("tokens 0 and 259 have the same piece \"<unk>\""));
  std::vector<Tokenizer::Entry> long_piece = entries;
  long_piece.push_back({"abcdefghi", 0});
  EXPECT_THAT(ErrorOf([&] { Tokenizer(long_piece, 8); }),
              HasSubstr("token 259 is 9 bytes long, longer than max_token_length 8"));
  EXPECT_THAT(ErrorOf([&] { Tokenizer(entries, 8, 1, 9999); }),
              HasSubstr("eos_token_id 9999 outside the vocabulary [0, 259)"));
}

TEST(TokenizerTest, RefusesMalformedJson) {
  EXPECT_THAT(ErrorOf([] { Tokenizer::Parse("{"); }), HasSubstr("tokenizer: invalid JSON"));
  EXPECT_THAT(ErrorOf([] { Tokenizer::Parse("[]"); }),
              HasSubstr("expected a JSON object, got array"));
  EXPECT_THAT(ErrorOf([] { Tokenizer::Parse(R"({"format": "hf"})"); }),
              HasSubstr("field \"format\" must be \"kvdiff-llama2c-tokenizer\", got \"hf\""));
  const std::string head =
      R"({"format": "kvdiff-llama2c-tokenizer", "version": 1, "max_token_length": 4, )";
  EXPECT_THAT(ErrorOf([&] { Tokenizer::Parse(head + R"("bos_token_id": 1})"); }),
              HasSubstr("missing field \"eos_token_id\""));
  EXPECT_THAT(ErrorOf([&] {
                Tokenizer::Parse(head + R"("bos_token_id": 1, "eos_token_id": 2, "pieces": 3})");
              }),
              HasSubstr("field \"pieces\" must be an array, got number"));
  EXPECT_THAT(ErrorOf([&] {
                Tokenizer::Parse(head + R"("bos_token_id": 0, "eos_token_id": 0,
                                  "pieces": [{"piece": "a"}]})");
              }),
              HasSubstr("pieces[0] needs a numeric \"score\""));
  EXPECT_THAT(ErrorOf([&] {
                Tokenizer::Parse(head + R"("bos_token_id": 0, "eos_token_id": 0,
                                  "pieces": [{"bytes": [300], "score": 0}]})");
              }),
              HasSubstr("pieces[0].bytes must hold integers 0..255, got 300"));
}

// Damaged copies of tok512.bin never crash or allocate wildly: each either loads or throws
// InputError. Seeded, so a failure replays.
TEST(TokenizerTest, CorruptedTok512LoadsOrThrowsInputError) {
  KVDIFF_REQUIRE_SHARED_DATA(data);
  kvdiff::testing::TempDir dir;
  const std::string good = ReadBytes(data / "stories260K" / "tok512.bin");
  std::mt19937 rng(512);
  int refused = 0, trials = 0;
  auto attempt = [&](const std::string& bytes, const std::string& what) {
    WriteBytes(dir / "t.bin", bytes);
    ++trials;
    try {
      Tokenizer tok = Tokenizer::ReadLlama2c(dir / "t.bin", 512);
      tok.Encode("Once upon a time", true);  // a loaded tokenizer is usable
    } catch (const InputError&) {
      ++refused;
    } catch (const std::exception& e) {
      ADD_FAILURE() << what << ": unexpected " << typeid(e).name() << ": " << e.what();
    }
  };
  for (size_t cut = 0; cut < good.size(); cut += 37)
    attempt(good.substr(0, cut), fmt::format("cut at {}", cut));
  for (int t = 0; t < 300; ++t) {
    std::string bytes = good;
    const size_t at = rng() % bytes.size();
    bytes[at] = static_cast<char>(rng());
    // Large values in a length or the header are the dangerous ones: force some.
    if (t % 3 == 0 && at + 4 <= bytes.size()) bytes[at + 3] = static_cast<char>(0x7F);
    attempt(bytes, fmt::format("trial {} byte {}", t, at));
  }
  EXPECT_GE(refused, static_cast<int>(good.size() / 37));  // every truncation is refused
  EXPECT_LT(refused, trials);  // a score or piece byte changed can still load
}

}  // namespace
}  // namespace kvdiff::format
