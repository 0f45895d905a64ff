#include "format/gguf.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>

#include "format/error.h"
#include "format/tokenizer.h"

namespace kvdiff::format {
namespace {

static_assert(sizeof(float) == 4, "GGUF stores IEEE float32");

// GGUF metadata value types (gguf.h's enum gguf_type).
enum GgufValueType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};

// ---- writing: everything before the data is built in memory, the data streamed ----

class Bytes {
 public:
  template <typename T>
  void Put(T value) {  // little-endian hosts only (x86-64, aarch64): raw bytes are the encoding
    const char* p = reinterpret_cast<const char*>(&value);
    out_.append(p, sizeof(T));
  }
  void PutString(const std::string& s) {
    Put<uint64_t>(s.size());
    out_ += s;
  }
  void PadTo(uint64_t alignment) {
    while (out_.size() % alignment != 0) out_.push_back('\0');
  }
  const std::string& str() const { return out_; }

 private:
  std::string out_;
};

struct PutValue {
  Bytes& b;
  void operator()(uint32_t v) { b.Put<uint32_t>(kU32), b.Put(v); }
  void operator()(int32_t v) { b.Put<uint32_t>(kI32), b.Put(v); }
  void operator()(float v) { b.Put<uint32_t>(kF32), b.Put(v); }
  void operator()(bool v) { b.Put<uint32_t>(kBool), b.Put<uint8_t>(v ? 1 : 0); }
  void operator()(const std::string& v) { b.Put<uint32_t>(kString), b.PutString(v); }
  void operator()(uint64_t v) { b.Put<uint32_t>(kU64), b.Put(v); }
  void operator()(const std::vector<std::string>& v) {
    b.Put<uint32_t>(kArray), b.Put<uint32_t>(kString), b.Put<uint64_t>(v.size());
    for (const auto& s : v) b.PutString(s);
  }
  void operator()(const std::vector<float>& v) {
    b.Put<uint32_t>(kArray), b.Put<uint32_t>(kF32), b.Put<uint64_t>(v.size());
    for (float x : v) b.Put(x);
  }
  void operator()(const std::vector<int32_t>& v) {
    b.Put<uint32_t>(kArray), b.Put<uint32_t>(kI32), b.Put<uint64_t>(v.size());
    for (int32_t x : v) b.Put(x);
  }
};

// One tensor to write: GGUF name and dims, its values (already permuted) and its ggml type.
struct GgufTensor {
  std::string name;
  std::vector<uint64_t> dims;  // ne[0] first
  const std::vector<float>* values;
  GgmlType type;
  uint64_t Bytes() const { return values->size() * (type == GgmlType::kF32 ? 4 : 2); }
};

uint64_t AlignUp(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

void WriteGguf(const std::filesystem::path& path, const std::vector<GgufKv>& metadata,
               const std::vector<GgufTensor>& tensors) {
  Bytes head;
  head.Put<uint32_t>(0x46554747u);  // "GGUF" read as a little-endian u32
  head.Put<uint32_t>(kGgufVersion);
  head.Put<uint64_t>(tensors.size());
  head.Put<uint64_t>(metadata.size());
  for (const GgufKv& kv : metadata) {
    head.PutString(kv.key);
    std::visit(PutValue{head}, kv.value);
  }
  uint64_t offset = 0;
  for (const GgufTensor& t : tensors) {
    head.PutString(t.name);
    head.Put<uint32_t>(static_cast<uint32_t>(t.dims.size()));
    for (uint64_t d : t.dims) head.Put<uint64_t>(d);
    head.Put<uint32_t>(static_cast<uint32_t>(t.type));
    head.Put<uint64_t>(offset);
    offset = AlignUp(offset + t.Bytes(), kGgufAlignment);
  }
  head.PadTo(kGgufAlignment);

  // A name of this process's own: two processes converting the same model (a cache miss in
  // parallel tests) must not write one temporary file; the rename makes either result the file.
  std::filesystem::path tmp = path;
  tmp += fmt::format(".tmp.{}", static_cast<long>(getpid()));
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    KVDIFF_CHECK(out.good(), "cannot write {}", tmp.string());
    out.write(head.str().data(), static_cast<std::streamsize>(head.str().size()));
    const char zeros[kGgufAlignment] = {};
    std::vector<uint16_t> half;
    for (const GgufTensor& t : tensors) {
      if (t.type == GgmlType::kF32) {
        out.write(reinterpret_cast<const char*>(t.values->data()),
                  static_cast<std::streamsize>(t.values->size() * 4));
      } else {
        half.resize(t.values->size());
        for (size_t i = 0; i < half.size(); ++i) {
          const float v = (*t.values)[i];
          half[i] = t.type == GgmlType::kF16 ? FloatToF16Bits(v) : FloatToBF16Bits(v);
        }
        out.write(reinterpret_cast<const char*>(half.data()),
                  static_cast<std::streamsize>(half.size() * 2));
      }
      out.write(zeros,
                static_cast<std::streamsize>(AlignUp(t.Bytes(), kGgufAlignment) - t.Bytes()));
    }
    out.flush();
    KVDIFF_CHECK(out.good(), "writing {} failed (disk full?)", tmp.string());
  }
  std::filesystem::rename(tmp, path);
}

// Per-dimension RoPE factors for rope_scaling "llama3", as llama.cpp's converter computes them
// into rope_freqs.weight (llama.cpp divides each frequency by its factor).
std::vector<float> Llama3RopeFactors(const LlamaConfig& c) {
  const RopeScaling& rs = *c.rope_scaling;
  const double orig = static_cast<double>(rs.original_max_position_embeddings);
  const double low_wavelen = orig / rs.low_freq_factor, high_wavelen = orig / rs.high_freq_factor;
  std::vector<float> factors;
  for (int64_t i = 0; i < c.head_dim; i += 2) {
    const float freq = 1.0f / std::pow(static_cast<float>(c.rope_theta),
                                       static_cast<float>(i) / static_cast<float>(c.head_dim));
    const double wavelen = 2.0 * M_PI / freq;
    if (wavelen < high_wavelen) {
      factors.push_back(1.0f);
    } else if (wavelen > low_wavelen) {
      factors.push_back(static_cast<float>(rs.factor));
    } else {
      const double smooth =
          (orig / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor);
      factors.push_back(static_cast<float>(1.0 / ((1.0 - smooth) / rs.factor + smooth)));
    }
  }
  return factors;
}

// ---- reading ----

class Reader {
 public:
  Reader(std::ifstream& in, const std::filesystem::path& path, uint64_t size)
      : in_(in), path_(path), size_(size) {}
  template <typename T>
  T Get(const char* what) {
    T value{};
    in_.read(reinterpret_cast<char*>(&value), sizeof(T));
    KVDIFF_CHECK(in_.gcount() == static_cast<std::streamsize>(sizeof(T)),
                 "GGUF {}: truncated while reading {}", path_.string(), what);
    return value;
  }
  std::string GetString(const char* what) {
    const uint64_t n = Get<uint64_t>(what);
    KVDIFF_CHECK(n <= Remaining(), "GGUF {}: {} claims {} bytes, the file has {} left",
                 path_.string(), what, n, Remaining());
    std::string s(n, '\0');
    in_.read(s.data(), static_cast<std::streamsize>(n));
    return s;
  }
  uint64_t Position() { return static_cast<uint64_t>(in_.tellg()); }
  uint64_t Remaining() { return size_ - Position(); }
  void Skip(uint64_t n, const char* what) {
    KVDIFF_CHECK(n <= Remaining(), "GGUF {}: {} runs past the end of the file", path_.string(),
                 what);
    in_.seekg(static_cast<std::streamoff>(n), std::ios::cur);
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::ifstream& in_;
  const std::filesystem::path& path_;
  uint64_t size_;
};

size_t ScalarSize(uint32_t type) {
  switch (type) {
    case kU8:
    case kI8:
    case kBool:
      return 1;
    case kU16:
    case kI16:
      return 2;
    case kU32:
    case kI32:
    case kF32:
      return 4;
    case kU64:
    case kI64:
    case kF64:
      return 8;
    default:
      return 0;
  }
}

// The value of one metadata entry; types we do not model are skipped (std::nullopt).
std::optional<GgufValue> ReadValue(Reader& r, uint32_t type, const std::string& key) {
  switch (type) {
    case kU32:
      return GgufValue(r.Get<uint32_t>(key.c_str()));
    case kI32:
      return GgufValue(r.Get<int32_t>(key.c_str()));
    case kF32:
      return GgufValue(r.Get<float>(key.c_str()));
    case kU64:
      return GgufValue(r.Get<uint64_t>(key.c_str()));
    case kBool:
      return GgufValue(r.Get<uint8_t>(key.c_str()) != 0);
    case kString:
      return GgufValue(r.GetString(key.c_str()));
    case kArray: {
      const uint32_t elem = r.Get<uint32_t>(key.c_str());
      const uint64_t n = r.Get<uint64_t>(key.c_str());
      if (elem == kString) {
        std::vector<std::string> v;
        for (uint64_t i = 0; i < n; ++i) v.push_back(r.GetString(key.c_str()));
        return GgufValue(std::move(v));
      }
      const size_t size = ScalarSize(elem);
      KVDIFF_CHECK(size != 0, "GGUF {}: metadata '{}' is an array of unknown type {}",
                   r.path().string(), key, elem);
      KVDIFF_CHECK(n <= r.Remaining() / size,
                   "GGUF {}: metadata '{}' claims {} elements past the end of the file",
                   r.path().string(), key, n);
      if (elem == kF32 || elem == kI32) {
        std::vector<float> f;
        std::vector<int32_t> i32;
        for (uint64_t i = 0; i < n; ++i) {
          if (elem == kF32)
            f.push_back(r.Get<float>(key.c_str()));
          else
            i32.push_back(r.Get<int32_t>(key.c_str()));
        }
        return elem == kF32 ? GgufValue(std::move(f)) : GgufValue(std::move(i32));
      }
      r.Skip(n * size, key.c_str());
      return std::nullopt;
    }
    default: {
      const size_t size = ScalarSize(type);
      KVDIFF_CHECK(size != 0, "GGUF {}: metadata '{}' has unknown type {}", r.path().string(), key,
                   type);
      r.Skip(size, key.c_str());
      return std::nullopt;
    }
  }
}

}  // namespace

const GgufKv* GgufHeader::Find(const std::string& key) const {
  for (const GgufKv& kv : metadata) {
    if (kv.key == key) return &kv;
  }
  return nullptr;
}

GgufHeader ReadGgufHeader(const std::filesystem::path& path) {
  std::error_code ec;
  const uint64_t size = std::filesystem::file_size(path, ec);
  KVDIFF_CHECK(!ec, "GGUF {}: cannot read: {}", path.string(), ec.message());
  std::ifstream in(path, std::ios::binary);
  KVDIFF_CHECK(in.good(), "GGUF {}: cannot open", path.string());
  Reader r(in, path, size);
  const uint32_t magic = r.Get<uint32_t>("the magic");
  KVDIFF_CHECK(magic == 0x46554747u, "GGUF {}: expected the magic \"GGUF\", found 0x{:08x}",
               path.string(), magic);
  GgufHeader h;
  h.version = r.Get<uint32_t>("the version");
  KVDIFF_CHECK(h.version == 2 || h.version == 3, "GGUF {}: version {} is not supported (2 or 3)",
               path.string(), h.version);
  const uint64_t n_tensors = r.Get<uint64_t>("the tensor count");
  const uint64_t n_kv = r.Get<uint64_t>("the metadata count");
  KVDIFF_CHECK(n_kv <= size && n_tensors <= size,
               "GGUF {}: {} metadata entries and {} tensors cannot fit in {} bytes", path.string(),
               n_kv, n_tensors, size);
  uint64_t alignment = kGgufAlignment;
  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key = r.GetString("a metadata key");
    const uint32_t type = r.Get<uint32_t>("a metadata type");
    std::optional<GgufValue> value = ReadValue(r, type, key);
    if (!value) continue;
    if (key == "general.alignment" && std::holds_alternative<uint32_t>(*value)) {
      alignment = std::get<uint32_t>(*value);
      KVDIFF_CHECK(alignment > 0 && (alignment & (alignment - 1)) == 0,
                   "GGUF {}: general.alignment {} is not a power of two", path.string(), alignment);
    }
    h.metadata.push_back({std::move(key), std::move(*value)});
  }
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensorInfo t;
    t.name = r.GetString("a tensor name");
    const uint32_t n_dims = r.Get<uint32_t>("a tensor's n_dims");
    KVDIFF_CHECK(n_dims >= 1 && n_dims <= 4, "GGUF {}: tensor '{}' has {} dims (expected 1..4)",
                 path.string(), t.name, n_dims);
    for (uint32_t d = 0; d < n_dims; ++d) t.dims.push_back(r.Get<uint64_t>("a tensor dim"));
    t.type = r.Get<uint32_t>("a tensor type");
    t.offset = r.Get<uint64_t>("a tensor offset");
    KVDIFF_CHECK(t.offset % alignment == 0,
                 "GGUF {}: tensor '{}' offset {} is not a multiple of {}", path.string(), t.name,
                 t.offset, alignment);
    h.tensors.push_back(std::move(t));
  }
  h.data_offset = AlignUp(r.Position(), alignment);
  for (const GgufTensorInfo& t : h.tensors) {
    KVDIFF_CHECK(h.data_offset + t.offset <= size,
                 "GGUF {}: tensor '{}' starts past the end of the file", path.string(), t.name);
  }
  return h;
}

std::vector<float> PermuteRopeRowsToInterleaved(const std::vector<float>& weight, int64_t n_heads,
                                                int64_t head_dim, int64_t in_features) {
  KVDIFF_CHECK(head_dim % 2 == 0, "PermuteRopeRowsToInterleaved: head_dim must be even, got {}",
               head_dim);
  KVDIFF_CHECK(static_cast<int64_t>(weight.size()) == n_heads * head_dim * in_features,
               "PermuteRopeRowsToInterleaved: weight has {} values, expected {} x {} x {} = {}",
               weight.size(), n_heads, head_dim, in_features, n_heads * head_dim * in_features);
  std::vector<float> out(weight.size());  // (n_heads * head_dim, in_features)
  const int64_t half = head_dim / 2;
  for (int64_t h = 0; h < n_heads; ++h) {
    for (int64_t r = 0; r < head_dim; ++r) {
      // GGUF row r of the head reads HF row r/2 (even r) or r/2 + half (odd r).
      const int64_t src = r % 2 == 0 ? r / 2 : r / 2 + half;
      const float* from = weight.data() + (h * head_dim + src) * in_features;
      std::copy(from, from + in_features, out.data() + (h * head_dim + r) * in_features);
    }
  }
  return out;
}

std::vector<GgufKv> LlamaGgufMetadata(const ModelWeights& model, const std::string& name,
                                      const std::filesystem::path& model_dir, DType dtype) {
  const LlamaConfig& c = model.config;
  auto u32 = [](int64_t v) { return static_cast<uint32_t>(v); };
  // general.file_type: llama_ftype (0 all F32, 1 mostly F16, 32 mostly BF16).
  const uint32_t file_type = dtype == DType::kF32 ? 0 : dtype == DType::kF16 ? 1 : 32;
  std::vector<GgufKv> kv = {
      {"general.architecture", std::string("llama")},
      {"general.name", name},
      {"general.file_type", file_type},
      {"general.alignment", kGgufAlignment},
      {"llama.context_length", u32(c.max_position_embeddings)},
      {"llama.embedding_length", u32(c.hidden_size)},
      {"llama.block_count", u32(c.num_hidden_layers)},
      {"llama.feed_forward_length", u32(c.intermediate_size)},
      {"llama.rope.dimension_count", u32(c.head_dim)},
      {"llama.attention.head_count", u32(c.num_attention_heads)},
      {"llama.attention.head_count_kv", u32(c.num_key_value_heads)},
      {"llama.attention.key_length", u32(c.head_dim)},
      {"llama.attention.value_length", u32(c.head_dim)},
      {"llama.attention.layer_norm_rms_epsilon", static_cast<float>(c.rms_norm_eps)},
      {"llama.rope.freq_base", static_cast<float>(c.rope_theta)},
      {"llama.vocab_size", u32(c.vocab_size)},
  };
  const std::optional<Tokenizer> tok = Tokenizer::LoadFromModelDir(model_dir);
  if (!tok) {
    kv.push_back({"tokenizer.ggml.model", std::string("none")});
    return kv;
  }
  KVDIFF_CHECK(tok->VocabSize() == c.vocab_size,
               "{}: the tokenizer has {} pieces, config.json's vocab_size is {}",
               (model_dir / kTokenizerFileName).string(), tok->VocabSize(), c.vocab_size);
  // SentencePiece token types (llama.cpp's llama_token_type): 1 normal, 2 unknown, 3 control, 6
  // byte.
  std::vector<std::string> pieces;
  std::vector<float> scores;
  std::vector<int32_t> types;
  for (Token id = 0; id < tok->VocabSize(); ++id) {
    const Tokenizer::Entry& e = tok->At(id);
    pieces.push_back(e.piece);
    scores.push_back(e.score);
    const bool byte = e.piece.size() == 6 && e.piece.rfind("<0x", 0) == 0 && e.piece[5] == '>';
    types.push_back(id == 0 ? 2 : (id == tok->BosId() || id == tok->EosId()) ? 3 : byte ? 6 : 1);
  }
  kv.push_back({"tokenizer.ggml.model", std::string("llama")});
  kv.push_back({"tokenizer.ggml.tokens", std::move(pieces)});
  kv.push_back({"tokenizer.ggml.scores", std::move(scores)});
  kv.push_back({"tokenizer.ggml.token_type", std::move(types)});
  kv.push_back({"tokenizer.ggml.bos_token_id", static_cast<uint32_t>(tok->BosId())});
  kv.push_back({"tokenizer.ggml.eos_token_id", static_cast<uint32_t>(tok->EosId())});
  kv.push_back({"tokenizer.ggml.unknown_token_id", uint32_t{0}});
  return kv;
}

void ConvertHfToGguf(const std::filesystem::path& model_dir, const std::filesystem::path& out,
                     DType dtype, bool permute_qk) {
  KVDIFF_CHECK(dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16,
               "convert gguf: dtype {} is not supported (F32, F16 or BF16)", DTypeName(dtype));
  const ModelWeights model = LoadModel(model_dir);
  const LlamaConfig& c = model.config;
  // The llama architecture of llama.cpp has no sliding window (its converter drops the key), so
  // a windowed model converted to it would be a different model: refused, not approximated.
  KVDIFF_CHECK(!c.Windowed(),
               "convert gguf: {} has a sliding window of {} positions, and llama.cpp's llama "
               "architecture (the one kvdiff writes) has no sliding-window attention",
               model_dir.string(), c.sliding_window);
  const std::vector<GgufKv> metadata =
      LlamaGgufMetadata(model, model_dir.filename().string(), model_dir, dtype);

  const GgmlType matrix_type = dtype == DType::kF32   ? GgmlType::kF32
                               : dtype == DType::kF16 ? GgmlType::kF16
                                                      : GgmlType::kBF16;
  std::vector<std::vector<float>> owned;  // permuted copies and rope_freqs
  owned.reserve(2 * c.num_hidden_layers + 1);
  std::vector<GgufTensor> tensors;
  // A PyTorch (out, in) matrix is GGUF {in, out}; 1-D tensors stay F32.
  auto add = [&](const std::string& gguf_name, const Tensor& t, const std::vector<float>* values) {
    std::vector<uint64_t> dims(t.shape.rbegin(), t.shape.rend());
    tensors.push_back({gguf_name, dims, values ? values : &t.data,
                       t.shape.size() == 1 ? GgmlType::kF32 : matrix_type});
  };
  add("token_embd.weight", model.Get("model.embed_tokens.weight"), nullptr);
  if (c.rope_scaling) {
    owned.push_back(Llama3RopeFactors(c));
    tensors.push_back({"rope_freqs.weight",
                       {static_cast<uint64_t>(c.head_dim / 2)},
                       &owned.back(),
                       GgmlType::kF32});
  }
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string hf = "model.layers." + std::to_string(l) + ".";
    const std::string g = "blk." + std::to_string(l) + ".";
    const Tensor& q = model.Get(hf + "self_attn.q_proj.weight");
    const Tensor& k = model.Get(hf + "self_attn.k_proj.weight");
    owned.push_back(
        PermuteRopeRowsToInterleaved(q.data, c.num_attention_heads, c.head_dim, c.hidden_size));
    const std::vector<float>* q_perm = &owned.back();
    owned.push_back(
        PermuteRopeRowsToInterleaved(k.data, c.num_key_value_heads, c.head_dim, c.hidden_size));
    const std::vector<float>* k_perm = &owned.back();
    add(g + "attn_norm.weight", model.Get(hf + "input_layernorm.weight"), nullptr);
    add(g + "attn_q.weight", q, permute_qk ? q_perm : nullptr);
    add(g + "attn_k.weight", k, permute_qk ? k_perm : nullptr);
    add(g + "attn_v.weight", model.Get(hf + "self_attn.v_proj.weight"), nullptr);
    add(g + "attn_output.weight", model.Get(hf + "self_attn.o_proj.weight"), nullptr);
    add(g + "ffn_norm.weight", model.Get(hf + "post_attention_layernorm.weight"), nullptr);
    add(g + "ffn_gate.weight", model.Get(hf + "mlp.gate_proj.weight"), nullptr);
    add(g + "ffn_up.weight", model.Get(hf + "mlp.up_proj.weight"), nullptr);
    add(g + "ffn_down.weight", model.Get(hf + "mlp.down_proj.weight"), nullptr);
  }
  add("output_norm.weight", model.Get("model.norm.weight"), nullptr);
  // Tied heads have no output.weight: llama.cpp then uses token_embd, as transformers does.
  if (!c.tie_word_embeddings) add("output.weight", model.Get("lm_head.weight"), nullptr);
  WriteGguf(out, metadata, tensors);
}

}  // namespace kvdiff::format
