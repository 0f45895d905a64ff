// Reading a HuggingFace tokenizer.json into the pipeline (HfTokenizer::Impl): every component
// kvdiff implements, each refusal naming the field; what is not implemented is refused, never
// approximated.
#include <fmt/format.h>

#include <map>
#include <string>

#include "format/input_file.h"
#include "format/json_field.h"
#include "format/tokenizer_json_detail.h"

namespace kvdiff::format {
namespace {

using nlohmann::json;

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

}  // namespace kvdiff::format
