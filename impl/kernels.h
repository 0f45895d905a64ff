// The numeric kernels of the forward pass. Each one is the plain definition from
// ../shared/spec/llama-forward.md, written so that every output element is computed by exactly one
// thread in a fixed order: results are bit-identical for any thread count.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "format/config.h"
#include "impl/thread_pool.h"

namespace kvdiff::impl {

// How a weight matrix is stored. A 16-bit matrix holds values that are exactly its float32 values
// (a bf16 or f16 checkpoint): the kernels widen each value to float32 as they load it (exact), so
// every product and every sum is the one the float32 matrix gives, bit for bit, from half the
// bytes.
enum class WeightDtype { kF32, kBF16, kF16 };

// A weight matrix (out_features, in_features), row-major: float32 borrowed from
// format::ModelWeights (data), or 16-bit values the model keeps (half, with dtype kBF16/kF16).
struct WeightView {
  const float* data = nullptr;
  int64_t rows = 0;                // out_features
  int64_t cols = 0;                // in_features
  const uint16_t* half = nullptr;  // the 16-bit storage when dtype != kF32
  WeightDtype dtype = WeightDtype::kF32;
  const float* Row(int64_t r) const { return data + r * cols; }
  const uint16_t* HalfRow(int64_t r) const { return half + r * cols; }
};

// The exact float32 value of a bf16 / f16 bit pattern.
float WidenBF16(uint16_t bits);
float WidenF16(uint16_t bits);
// out[0 .. w.cols) = row r of w as float32 (the embedding lookup; exact for every dtype).
void WidenRow(const WeightView& w, int64_t r, float* out);
// Whether `value` is exactly representable in dtype, and its bits there (for the model's copy).
bool NarrowExact(float value, WeightDtype dtype, uint16_t* bits);

// sum_i a[i] * b[i] in float32, in a fixed order: 32 interleaved partial sums, each a chain of
// fused multiply-adds (acc[i % 32] = fma(a[i], b[i], acc[i % 32]), explicit: whether the compiler
// would contract a * b + acc depends on its flags), then reduction.h's fixed tree. Every kernel
// over weights (linear_kernels.cc, each instruction set) gives these bits. This one is the
// tests' oracle, compiled for the baseline: where there is no FMA it calls fmaf, slowly.
float Dot(const float* a, const float* b, int64_t n);

// y (s, w.rows) = x (s, w.cols) · wᵀ, all row-major and contiguous. Up to kLinearRowsMax input rows
// (decode, short uncached forwards, small chunks) it is LinearRows; past that LinearGemm.
void Linear(ThreadPool& pool, const float* x, int64_t s, const WeightView& w, float* y);
// Memory-bound: each weight row is read once and dotted with every input row while it is in L1
// (s == 1 is the decode matrix-vector product); output rows split over the pool. Each element is
// Dot(w.Row(r), x_i), bit for bit.
void LinearRows(ThreadPool& pool, const float* x, int64_t s, const WeightView& w, float* y);
// Compute-bound: the packed-panel GEMM of impl/gemm.h on tiles of output rows spread over the
// pool; each element is one fused multiply-add chain in input order, whatever thread runs it.
void LinearGemm(ThreadPool& pool, const float* x, int64_t s, const WeightView& w, float* y);
// One output of LinearMany: y (s, w.rows) = x (s, w.cols) · wᵀ.
struct LinearOutput {
  WeightView w;
  float* y;
};
constexpr int kLinearManyMax = 4;
// Several linear layers of the same input (Q, K and V; gate and up) in ONE parallel region: their
// rows (or tiles) are dealt out together, so a small matrix (K, V: 192 rows) neither leaves a
// thread idle at its end nor costs a region of its own. Every element is computed exactly as
// Linear computes it. Throws InputError unless 1 <= count <= kLinearManyMax and the inputs agree.
void LinearMany(ThreadPool& pool, const float* x, int64_t s, const LinearOutput* outputs,
                int count);
// Where LinearGemm starts to win (tests/bench kernels_bench BM_LinearFewRows measures both).
constexpr int64_t kLinearRowsMax = 8;

// out (s, n) = RMSNorm of each row of x (s, n): (x · rsqrt(mean(x²) + eps)) · weight, weight last.
// mean(x²) is accumulated in double, so a row whose float32 sum of squares would overflow
// (RMS beyond ~1.8e19 / sqrt(n)) still normalizes to unit RMS.
void RmsNorm(const float* x, const float* weight, int64_t s, int64_t n, float eps, float* out);

// x[i] += y[i] for i < count (the residual connections).
void AddInPlace(float* x, const float* y, int64_t count);

// out[i] = silu(gate[i]) * up[i], silu(z) = z · sigmoid(z).
void SwiGlu(ThreadPool& pool, const float* gate, const float* up, int64_t count, float* out);

// In place: x = exp(x - max) / sum(exp(x - max)) over n values.
void Softmax(float* x, int64_t n);

// RoPE tables, "rotate half" layout: cos/sin of position p and frequency i < head_dim / 2.
// The angles are computed in double and rounded once, so every row is within 1 ulp of the exact
// table even at positions in the thousands (float32 angles would be off by ~1e-4 there).
struct RopeTable {
  int64_t positions = 0;   // rows built so far (at most max_position_embeddings)
  int64_t half = 0;        // head_dim / 2
  std::vector<float> cos;  // (positions, half)
  std::vector<float> sin;  // (positions, half)
  const float* Cos(int64_t pos) const { return cos.data() + pos * half; }
  const float* Sin(int64_t pos) const { return sin.data() + pos * half; }
};
// inv_freq[i] = 1 / rope_theta^(2i/d), rescaled by rope_scaling "llama3" when present.
std::vector<double> RopeInvFreq(const format::LlamaConfig& config);
// The table of every position up to max_position_embeddings.
RopeTable BuildRopeTable(const format::LlamaConfig& config);
// Extends `table` to cover at least positions 0..needed-1 (doubling, at least 4096, capped at
// max_position_embeddings); rows already built are kept. A model builds its table as it is used,
// so a config promising 2^20 positions costs nothing until a run reaches them.
void GrowRopeTable(const format::LlamaConfig& config, int64_t needed, RopeTable& table);

// Rotates each of the `heads` vectors of length d = 2 * half in x (heads, d), in place:
// x' = x·cos + rotate_half(x)·sin, with rotate_half(x) = concat(-x[half:], x[:half]).
void ApplyRope(float* x, int64_t heads, int64_t half, const float* cos, const float* sin);

// A float buffer that only grows. Its memory comes uninitialized (new float[n]), so pages the
// kernels never write stay unresident: a scratch sized for the whole cache capacity (thousands of
// keys) costs resident memory only for the keys actually attended to.
class ScratchBuffer {
 public:
  float* data() { return data_.get(); }
  int64_t size() const { return size_; }
  void Grow(int64_t floats);  // keeps nothing: callers write before they read
 private:
  std::unique_ptr<float[]> data_;
  int64_t size_ = 0;
};

// Scratch for the attention scores; grown by Reserve only (never during a decode step).
struct AttentionScratch {
  std::vector<ScratchBuffer> per_thread;  // prefill: a block of query rows' scores per thread
  ScratchBuffer heads;                    // decode: every head's scores, (nh, keys)
  // decode: per chunk of keys, every head's weighted sums (chunks, nh, d), then every head's max
  // and exp sum (chunks, nh, 2)
  ScratchBuffer chunk_sums;
  // Room for Attention of up to s query rows over up to `keys` keys with nh query heads of d.
  void Reserve(int threads, int64_t s, int64_t keys, int64_t nh, int64_t d);
};
// Query rows handled per block in prefill attention: bounds the scores scratch to
// kAttentionQueryTile × (keys) per thread.
constexpr int64_t kAttentionQueryTile = 128;

// Causal attention of s new query rows at cache positions past..past+s-1 over keys/values rows
// 0..past+s-1 (the cache already holds the new rows).
//   q:      (s, nh * d) post-RoPE queries      out: (s, nh * d)
//   keys:   (past + s, nkv * d) post-RoPE, row-major, one row per position (the KvCache layout)
//   values: (past + s, nkv * d)
// Query head h reads KV head h / (nh / nkv). Key j is visible to row i iff j <= past + i and,
// with a sliding window W > 0, j > past + i - W (W keys, the row's own included; window 0: none).
// A row's softmax runs over its visible keys only, in key order.
// scratch must have been reserved for at least s rows, past + s keys and nh heads.
void Attention(ThreadPool& pool, const float* q, int64_t s, int64_t past, const float* keys,
               const float* values, int64_t nh, int64_t nkv, int64_t d, float* out,
               AttentionScratch& scratch, int64_t window = 0);

}  // namespace kvdiff::impl
