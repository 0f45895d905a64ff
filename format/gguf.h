// GGUF (version 3), the file format of llama.cpp: written from an HF Llama directory without
// Python, and read back as far as the header, metadata and tensor infos (for tests and `info`).
//
// Layout: "GGUF", u32 version, u64 tensor count, u64 metadata count, the metadata (key, u32 type,
// value), the tensor infos (name, u32 n_dims, u64 dims with ne[0] the fastest-varying, u32 ggml
// type, u64 offset from the data start), padding to general.alignment (32), the tensor data, each
// tensor starting on an alignment boundary. All little-endian.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <variant>
#include <vector>

#include "format/model_files.h"
#include "format/safetensors.h"

namespace kvdiff::format {

inline constexpr uint32_t kGgufVersion = 3;
inline constexpr uint32_t kGgufAlignment = 32;

// The metadata value types this writer emits (GGUF has more; the reader refuses those it meets in
// a file only if it cannot skip them, which is never: every GGUF type has a known size).
using GgufValue = std::variant<uint32_t, int32_t, float, bool, std::string, uint64_t,
                               std::vector<std::string>, std::vector<float>, std::vector<int32_t>>;

struct GgufKv {
  std::string key;
  GgufValue value;
};

// ggml tensor types we write (ggml.h's enum ggml_type values).
enum class GgmlType : uint32_t { kF32 = 0, kF16 = 1, kBF16 = 30 };

struct GgufTensorInfo {
  std::string name;
  std::vector<uint64_t> dims;  // ne[0] first: a PyTorch (out, in) weight is {in, out}
  uint32_t type = 0;           // ggml_type
  uint64_t offset = 0;         // from the start of the data section
};

struct GgufHeader {
  uint32_t version = 0;
  std::vector<GgufKv> metadata;  // in file order; values of types we do not model are skipped
  std::vector<GgufTensorInfo> tensors;
  uint64_t data_offset = 0;                          // file offset of the data section
  const GgufKv* Find(const std::string& key) const;  // nullptr when absent
};

// Reads and validates everything before the tensor data. Throws InputError naming the file and
// the problem (bad magic, unsupported version, truncated, offsets outside the file).
GgufHeader ReadGgufHeader(const std::filesystem::path& path);

// The hyperparameters llama.cpp asserts on instead of refusing: general.architecture "llama",
// block_count 1..1024, context_length 1..2^20, widths and head counts positive (KV heads dividing
// heads), layer_norm_rms_epsilon and rope.freq_base positive and finite. InputError naming the
// file, the key, its value and what was expected (format/gguf_check.cc).
void CheckLlamaGgufHyperparameters(const GgufHeader& header, const std::filesystem::path& path);

// HF's rotate-half q/k rows (row i pairs with i + head_dim/2) to GGUF's interleaved RoPE layout
// (row 2i pairs with 2i+1): GGUF row 2i = HF row i, GGUF row 2i+1 = HF row i + head_dim/2, per
// head. The inverse of format/llama2c.cc's PermuteRopeRows; what convert_hf_to_gguf.py does.
std::vector<float> PermuteRopeRowsToInterleaved(const std::vector<float>& weight, int64_t n_heads,
                                                int64_t head_dim, int64_t in_features);

// The metadata of a Llama model in GGUF: general.*, llama.* and tokenizer.ggml.*. With a
// tokenizer (DIR/tokenizer.kvdiff.json) the SentencePiece pieces, scores and token types
// ("llama" model); without one, tokenizer.ggml.model = "none" and llama.vocab_size.
std::vector<GgufKv> LlamaGgufMetadata(const ModelWeights& model, const std::string& name,
                                      const std::filesystem::path& model_dir, DType dtype);

// `kvdiff convert gguf`: DIR (config.json + model.safetensors) -> out (one GGUF file, written to
// a temporary file beside it, then renamed). Matrices in `dtype` (F32, F16 or BF16), 1-D tensors
// (norms, rope_freqs) always F32 as llama.cpp's converter writes them.
// permute_qk = false leaves q/k rows in HF order: a deliberately wrong file, only for the mutation
// test proving that the llama.cpp test catches it.
void ConvertHfToGguf(const std::filesystem::path& model_dir, const std::filesystem::path& out,
                     DType dtype, bool permute_qk = true);

}  // namespace kvdiff::format
