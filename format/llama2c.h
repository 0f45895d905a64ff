// llama2.c checkpoints ("version 0" .bin files, e.g. stories260K.bin) read into HF Llama weights,
// and `kvdiff convert llama2c`'s conversion to an HF layout model directory.
//
// File layout: 7 little-endian int32 (dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size,
// seq_len; a negative vocab_size means an untied classifier is stored last), then float32 arrays
// (out_features, in_features): token_embedding (vocab, dim), rms_att (layers, dim),
// wq (layers, dim, dim), wk (layers, kv_dim, dim), wv (layers, kv_dim, dim), wo (layers, dim, dim),
// rms_ffn (layers, dim), w1 (layers, hidden, dim), w2 (layers, dim, hidden), w3 (layers, hidden,
// dim), rms_final (dim), two unused RoPE tables (seq_len, head_dim / 2) each, [wcls (vocab, dim)].
#pragma once

#include <cstdint>
#include <filesystem>
#include <vector>

#include "format/model_files.h"

namespace kvdiff::format {

struct Llama2cHeader {
  int32_t dim = 0;
  int32_t hidden_dim = 0;
  int32_t n_layers = 0;
  int32_t n_heads = 0;
  int32_t n_kv_heads = 0;
  int32_t vocab_size = 0;  // as stored: negative means an untied classifier follows
  int32_t seq_len = 0;

  bool SharedClassifier() const { return vocab_size > 0; }
  // Throws InputError naming the field when the header cannot describe a model (zero or negative
  // sizes, heads not dividing dim, query heads not a multiple of KV heads, odd head_dim, ...).
  void Validate() const;
  // Bytes a file with this header must have; throws InputError if that does not fit in 64 bits.
  int64_t ExpectedFileBytes() const;
  // The HF config: rms_norm_eps 1e-5, rope_theta 10000, tie per the vocab_size sign,
  // max_position_embeddings = seq_len, bos 1, eos 2.
  LlamaConfig ToConfig() const;
};

inline constexpr int64_t kLlama2cHeaderBytes = 7 * 4;

// Reads and validates the header, and that the file size is exactly what it implies; nothing large
// is allocated before both checks pass.
Llama2cHeader ReadLlama2cHeader(const std::filesystem::path& checkpoint);

// Rows of a (n_heads * head_dim, in) projection reordered per head from llama2.c's interleaved
// RoPE pairs (2i, 2i+1) to HF's rotate-half pairs (i, i + head_dim/2): HF row r < head_dim/2 is
// llama2.c row 2r, HF row head_dim/2 + r is llama2.c row 2r + 1.
std::vector<float> PermuteRopeRows(const std::vector<float>& weight, int64_t n_heads,
                                   int64_t head_dim, int64_t in_features);

// The checkpoint as HF Llama weights (wq/wk permuted, names as in ExpectedTensors).
ModelWeights ReadLlama2cCheckpoint(const std::filesystem::path& checkpoint);

// Writes DIR/config.json, DIR/model.safetensors (float32) and, when tokenizer is not empty,
// DIR/tokenizer.kvdiff.json from llama2.c's tokenizer.bin (its size must match the vocabulary).
void ConvertLlama2c(const std::filesystem::path& checkpoint, const std::filesystem::path& tokenizer,
                    const std::filesystem::path& out_dir);

}  // namespace kvdiff::format
