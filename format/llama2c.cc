#include "format/llama2c.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <optional>
#include <string>

#include "format/error.h"
#include "format/tokenizer.h"

namespace kvdiff::format {
namespace {

static_assert(sizeof(float) == 4, "llama2.c checkpoints hold IEEE float32");

// a * b and a + b on sizes derived from an untrusted header: an overflow is a refusal, not UB.
int64_t CheckedMul(int64_t a, int64_t b) {
  int64_t out = 0;
  KVDIFF_CHECK(!__builtin_mul_overflow(a, b, &out),
               "llama2.c header implies a size that overflows 64 bits ({} * {})", a, b);
  return out;
}
int64_t CheckedAdd(int64_t a, int64_t b) {
  int64_t out = 0;
  KVDIFF_CHECK(!__builtin_add_overflow(a, b, &out),
               "llama2.c header implies a size that overflows 64 bits ({} + {})", a, b);
  return out;
}

std::string HeaderString(const Llama2cHeader& h) {
  return fmt::format(
      "dim={} hidden_dim={} n_layers={} n_heads={} n_kv_heads={} vocab_size={} seq_len={}", h.dim,
      h.hidden_dim, h.n_layers, h.n_heads, h.n_kv_heads, h.vocab_size, h.seq_len);
}

// Reads consecutive float32 arrays from the checkpoint stream.
class FloatReader {
 public:
  FloatReader(std::ifstream& in, const std::filesystem::path& path) : in_(in), path_(path) {}
  std::vector<float> Read(int64_t count, const char* what) {
    std::vector<float> out(static_cast<size_t>(count));
    in_.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(count * 4));
    KVDIFF_CHECK(in_.gcount() == count * 4,
                 "llama2.c checkpoint {}: short read of {} ({} of {} bytes)", path_.string(), what,
                 static_cast<int64_t>(in_.gcount()), count * 4);
    return out;
  }
  void Skip(int64_t count) { in_.seekg(count * 4, std::ios::cur); }

 private:
  std::ifstream& in_;
  const std::filesystem::path& path_;
};

// Layer `layer` of a (layers, rows, cols) stack.
std::vector<float> LayerSlice(const std::vector<float>& stack, int64_t layer, int64_t rows,
                              int64_t cols) {
  const auto begin = stack.begin() + layer * rows * cols;
  return std::vector<float>(begin, begin + rows * cols);
}

}  // namespace

void Llama2cHeader::Validate() const {
  const std::string all = HeaderString(*this);
  auto positive = [&](int32_t value, const char* name) {
    KVDIFF_CHECK(value > 0, "llama2.c header: {} must be positive, got {} ({})", name, value, all);
  };
  positive(dim, "dim");
  positive(hidden_dim, "hidden_dim");
  positive(n_layers, "n_layers");
  positive(n_heads, "n_heads");
  positive(n_kv_heads, "n_kv_heads");
  positive(seq_len, "seq_len");
  KVDIFF_CHECK(
      vocab_size != 0 && vocab_size != INT32_MIN,
      "llama2.c header: vocab_size must be non-zero (negative = untied classifier), got {} ({})",
      vocab_size, all);
  const int64_t vocab = vocab_size < 0 ? -static_cast<int64_t>(vocab_size) : vocab_size;
  // Token ids 1 (BOS) and 2 (EOS) must exist.
  KVDIFF_CHECK(vocab >= 3,
               "llama2.c header: |vocab_size| must be at least 3 (unk, BOS, EOS), got {} ({})",
               vocab_size, all);
  KVDIFF_CHECK(dim % n_heads == 0, "llama2.c header: n_heads {} must divide dim {} ({})", n_heads,
               dim, all);
  KVDIFF_CHECK(n_heads % n_kv_heads == 0,
               "llama2.c header: n_kv_heads {} must divide n_heads {} ({})", n_kv_heads, n_heads,
               all);
  KVDIFF_CHECK((dim / n_heads) % 2 == 0,
               "llama2.c header: head_dim = dim / n_heads = {} must be even for RoPE ({})",
               dim / n_heads, all);
}

int64_t Llama2cHeader::ExpectedFileBytes() const {
  Validate();
  const int64_t vocab = vocab_size < 0 ? -static_cast<int64_t>(vocab_size) : vocab_size;
  const int64_t head_dim = dim / n_heads;
  const int64_t kv_dim = CheckedMul(n_kv_heads, head_dim);
  const int64_t d = dim, h = hidden_dim, l = n_layers;
  int64_t floats = CheckedMul(vocab, d);                                  // token_embedding
  floats = CheckedAdd(floats, CheckedMul(l, d));                          // rms_att
  floats = CheckedAdd(floats, CheckedMul(l, CheckedMul(d, d)));           // wq
  floats = CheckedAdd(floats, CheckedMul(2 * l, CheckedMul(kv_dim, d)));  // wk, wv
  floats = CheckedAdd(floats, CheckedMul(l, CheckedMul(d, d)));           // wo
  floats = CheckedAdd(floats, CheckedMul(l, d));                          // rms_ffn
  floats = CheckedAdd(floats, CheckedMul(3 * l, CheckedMul(h, d)));       // w1, w2, w3
  floats = CheckedAdd(floats, d);                                         // rms_final
  floats = CheckedAdd(floats, CheckedMul(seq_len, head_dim));             // freq_cis real + imag
  if (!SharedClassifier()) floats = CheckedAdd(floats, CheckedMul(vocab, d));  // wcls
  return CheckedAdd(kLlama2cHeaderBytes, CheckedMul(floats, 4));
}

LlamaConfig Llama2cHeader::ToConfig() const {
  Validate();
  LlamaConfig config;
  config.hidden_size = dim;
  config.intermediate_size = hidden_dim;
  config.num_hidden_layers = n_layers;
  config.num_attention_heads = n_heads;
  config.num_key_value_heads = n_kv_heads;
  config.head_dim = dim / n_heads;
  config.vocab_size = vocab_size < 0 ? -static_cast<int64_t>(vocab_size) : vocab_size;
  config.max_position_embeddings = seq_len;
  config.rope_theta = 10000.0;
  config.rms_norm_eps = 1e-5;
  config.tie_word_embeddings = SharedClassifier();
  config.bos_token_id = 1;
  config.eos_token_id = 2;
  config.torch_dtype = "float32";
  return config;
}

Llama2cHeader ReadLlama2cHeader(const std::filesystem::path& checkpoint) {
  const std::string name = checkpoint.string();
  std::error_code ec;
  KVDIFF_CHECK(std::filesystem::is_regular_file(checkpoint, ec),
               "llama2.c checkpoint {}: not a readable file", name);
  const auto file_bytes = static_cast<int64_t>(std::filesystem::file_size(checkpoint, ec));
  KVDIFF_CHECK(!ec, "llama2.c checkpoint {}: cannot read its size: {}", name, ec.message());
  KVDIFF_CHECK(file_bytes >= kLlama2cHeaderBytes,
               "llama2.c checkpoint {}: expected at least {} bytes for the header (7 int32), the "
               "file has {} bytes",
               name, kLlama2cHeaderBytes, file_bytes);
  std::ifstream in(checkpoint, std::ios::binary);
  KVDIFF_CHECK(in.good(), "llama2.c checkpoint {}: cannot open", name);
  int32_t fields[7];
  in.read(reinterpret_cast<char*>(fields), sizeof(fields));
  KVDIFF_CHECK(in.gcount() == static_cast<std::streamsize>(sizeof(fields)),
               "llama2.c checkpoint {}: short read of the header", name);
  Llama2cHeader header{fields[0], fields[1], fields[2], fields[3], fields[4], fields[5], fields[6]};
  int64_t expected = 0;
  try {
    expected = header.ExpectedFileBytes();
  } catch (const InputError& e) {
    throw InputError(fmt::format("llama2.c checkpoint {}: {}", name, e.what()));
  }
  KVDIFF_CHECK(expected == file_bytes,
               "llama2.c checkpoint {}: the header ({}) implies {} bytes ({}), the file has {} "
               "bytes; truncated, or not a llama2.c version-0 checkpoint",
               name, HeaderString(header), expected,
               header.SharedClassifier() ? "tied classifier" : "untied classifier at the end",
               file_bytes);
  return header;
}

std::vector<float> PermuteRopeRows(const std::vector<float>& weight, int64_t n_heads,
                                   int64_t head_dim, int64_t in_features) {
  KVDIFF_CHECK(head_dim % 2 == 0, "PermuteRopeRows: head_dim must be even, got {}", head_dim);
  KVDIFF_CHECK(static_cast<int64_t>(weight.size()) == n_heads * head_dim * in_features,
               "PermuteRopeRows: weight has {} values, expected {} x {} x {} = {}", weight.size(),
               n_heads, head_dim, in_features, n_heads * head_dim * in_features);
  std::vector<float> out(weight.size());  // (n_heads * head_dim, in_features)
  const int64_t half = head_dim / 2;
  for (int64_t h = 0; h < n_heads; ++h) {
    for (int64_t r = 0; r < head_dim; ++r) {
      // HF row r of the head reads llama2.c row 2r (first half) or 2(r - half) + 1 (second half).
      const int64_t src = r < half ? 2 * r : 2 * (r - half) + 1;
      const float* from = weight.data() + (h * head_dim + src) * in_features;
      std::copy(from, from + in_features, out.data() + (h * head_dim + r) * in_features);
    }
  }
  return out;
}

ModelWeights ReadLlama2cCheckpoint(const std::filesystem::path& checkpoint) {
  const Llama2cHeader header = ReadLlama2cHeader(checkpoint);
  ModelWeights model;
  model.config = header.ToConfig();
  model.config.Validate();
  model.dtype_on_disk = DType::kF32;
  const LlamaConfig& c = model.config;
  const int64_t d = c.hidden_size, hd = c.head_dim, kv = c.KvDim(), h = c.intermediate_size;
  const int64_t layers = c.num_hidden_layers, vocab = c.vocab_size;

  std::ifstream in(checkpoint, std::ios::binary);
  KVDIFF_CHECK(in.good(), "llama2.c checkpoint {}: cannot open", checkpoint.string());
  in.seekg(kLlama2cHeaderBytes);
  FloatReader reader(in, checkpoint);
  // Stacks over layers, in file order.
  auto embedding = reader.Read(vocab * d, "token_embedding");  // (vocab, dim)
  auto rms_att = reader.Read(layers * d, "rms_att");           // (layers, dim)
  auto wq = reader.Read(layers * d * d, "wq");                 // (layers, dim, dim)
  auto wk = reader.Read(layers * kv * d, "wk");                // (layers, kv_dim, dim)
  auto wv = reader.Read(layers * kv * d, "wv");                // (layers, kv_dim, dim)
  auto wo = reader.Read(layers * d * d, "wo");                 // (layers, dim, dim)
  auto rms_ffn = reader.Read(layers * d, "rms_ffn");           // (layers, dim)
  auto w1 = reader.Read(layers * h * d, "w1");                 // (layers, hidden, dim)
  auto w2 = reader.Read(layers * d * h, "w2");                 // (layers, dim, hidden)
  auto w3 = reader.Read(layers * h * d, "w3");                 // (layers, hidden, dim)
  auto rms_final = reader.Read(d, "rms_final");                // (dim)
  reader.Skip(c.max_position_embeddings * hd);                 // freq_cis_real, freq_cis_imag
  if (!header.SharedClassifier()) {
    model.tensors["lm_head.weight"] = {{vocab, d}, reader.Read(vocab * d, "wcls")};
  }

  model.tensors["model.embed_tokens.weight"] = {{vocab, d}, std::move(embedding)};
  model.tensors["model.norm.weight"] = {{d}, std::move(rms_final)};
  for (int64_t l = 0; l < layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    model.tensors[p + "input_layernorm.weight"] = {{d}, LayerSlice(rms_att, l, 1, d)};
    model.tensors[p + "post_attention_layernorm.weight"] = {{d}, LayerSlice(rms_ffn, l, 1, d)};
    model.tensors[p + "self_attn.q_proj.weight"] = {
        {d, d}, PermuteRopeRows(LayerSlice(wq, l, d, d), c.num_attention_heads, hd, d)};
    model.tensors[p + "self_attn.k_proj.weight"] = {
        {kv, d}, PermuteRopeRows(LayerSlice(wk, l, kv, d), c.num_key_value_heads, hd, d)};
    model.tensors[p + "self_attn.v_proj.weight"] = {{kv, d}, LayerSlice(wv, l, kv, d)};
    model.tensors[p + "self_attn.o_proj.weight"] = {{d, d}, LayerSlice(wo, l, d, d)};
    model.tensors[p + "mlp.gate_proj.weight"] = {{h, d}, LayerSlice(w1, l, h, d)};
    model.tensors[p + "mlp.down_proj.weight"] = {{d, h}, LayerSlice(w2, l, d, h)};
    model.tensors[p + "mlp.up_proj.weight"] = {{h, d}, LayerSlice(w3, l, h, d)};
  }
  return model;
}

void ConvertLlama2c(const std::filesystem::path& checkpoint, const std::filesystem::path& tokenizer,
                    const std::filesystem::path& out_dir) {
  // Read everything before writing anything, so a bad input leaves no half-written directory.
  ModelWeights model = ReadLlama2cCheckpoint(checkpoint);
  std::optional<Tokenizer> tok;
  if (!tokenizer.empty()) {
    tok = Tokenizer::ReadLlama2c(tokenizer, model.config.vocab_size);
  }
  SaveModel(out_dir, model, DType::kF32);
  if (tok) tok->Save(out_dir / kTokenizerFileName);
}

}  // namespace kvdiff::format
