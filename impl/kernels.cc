#include "impl/kernels.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "format/error.h"
#include "format/safetensors.h"
#include "format/tensor.h"
#include "impl/gemm.h"
#include "impl/kernel_table.h"
#include "impl/reduction.h"
#include "impl/weight_load.h"

namespace kvdiff::impl {
namespace {

using ConstStridedMap = Eigen::Map<const RowMatrix, 0, Eigen::OuterStride<>>;
using StridedMap = Eigen::Map<RowMatrix, 0, Eigen::OuterStride<>>;

// exp(x) for float32 from basic IEEE operations only (Cephes expf: x = n·ln2 + r with ln2 split in
// two, a degree-6 polynomial for exp(r), and 2^n assembled in the exponent bits). Within 2 ulp of
// the exact value. Unlike std::exp it vectorizes (softmax and SiLU evaluate ~50k of them per decode
// step; this file is compiled with -fno-trapping-math for that, see impl/CMakeLists.txt), and the
// vector and scalar paths give the same bits, so a value never depends on where in a row it sits.
// NaN propagates; arguments are clamped to the float exponent range first.
inline float Exp(float x) {
  x = std::min(std::max(x, -87.0f), 88.0f);  // NaN passes through both (comparisons are false)
  // n = round(x / ln2): adding 1.5·2^23 leaves the rounded integer in the low mantissa bits
  // (an exact, branch-free rounding that vectorizes, where std::floor would be a libm call).
  constexpr float kRound = 12582912.0f;
  const float n = (x * 1.44269504088896341f + kRound) - kRound;
  const float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  // n is in [-126, 127] for every finite or infinite x (clamped above); a NaN x makes n NaN, whose
  // conversion to int is undefined behaviour (clang's UBSan reports it), so it converts 0 instead:
  // p is NaN then, and so is the result. A select, not a branch: it still vectorizes. Unsigned
  // shift: the same bits, and no undefined behaviour when n + 127 is negative.
  const float n_or_zero = n == n ? n : 0.0f;
  const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(n_or_zero) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

// Reductions with 16 interleaved partial sums (vectorizable without reassociation flags).
float Sum(const float* x, int64_t n) {
  constexpr int kLanes = 16;
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) acc[j] += x[i + j];
  }
  for (int j = 0; i < n; ++i, ++j) acc[j] += x[i];
  return FoldLanes<kLanes>(acc);
}

float Max(const float* x, int64_t n) {
  constexpr int kLanes = 16;
  float acc[kLanes];
  std::fill(acc, acc + kLanes, x[0]);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) acc[j] = acc[j] < x[i + j] ? x[i + j] : acc[j];
  }
  for (int j = 0; i < n; ++i, ++j) acc[j] = acc[j] < x[i] ? x[i] : acc[j];
  float m = acc[0];
  for (int j = 1; j < kLanes; ++j) m = m < acc[j] ? acc[j] : m;
  return m;
}

}  // namespace

float Dot(const float* __restrict a, const float* __restrict b, int64_t n) {
  constexpr int kLanes = 32;
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) acc[j] = std::fma(a[i + j], b[i + j], acc[j]);
  }
  for (int j = 0; i < n; ++i, ++j) acc[j] = std::fma(a[i], b[i], acc[j]);
  return FoldLanes<kLanes>(acc);
}

float WidenBF16(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &wide, sizeof(f));
  return f;
}

float WidenF16(uint16_t bits) {
  // sign, 5 exponent bits (bias 15), 10 mantissa bits; subnormals are mantissa * 2^-24.
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  const uint32_t mantissa = bits & 0x3ffu;
  float magnitude;
  if (exponent == 0) {
    magnitude = std::ldexp(static_cast<float>(mantissa), -24);
  } else if (exponent == 31) {
    magnitude =
        mantissa ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  } else {
    const uint32_t wide = ((exponent + 112) << 23) | (mantissa << 13);
    std::memcpy(&magnitude, &wide, sizeof(magnitude));
  }
  uint32_t out;
  std::memcpy(&out, &magnitude, sizeof(out));
  out |= sign;
  float f;
  std::memcpy(&f, &out, sizeof(f));
  return f;
}

bool NarrowExact(float value, WeightDtype dtype, uint16_t* bits) {
  switch (dtype) {
    case WeightDtype::kF32:
      return false;
    case WeightDtype::kBF16:
      *bits = format::FloatToBF16Bits(value);
      break;
    case WeightDtype::kF16:
      *bits = format::FloatToF16Bits(value);
      break;
  }
  const float back = dtype == WeightDtype::kBF16 ? WidenBF16(*bits) : WidenF16(*bits);
  uint32_t a, b;  // bit for bit: -0.0 stays -0.0
  std::memcpy(&a, &value, sizeof(a));
  std::memcpy(&b, &back, sizeof(b));
  return a == b;
}

void WidenRow(const WeightView& w, int64_t r, float* out) {
  switch (w.dtype) {
    case WeightDtype::kF32:
      std::copy(w.Row(r), w.Row(r) + w.cols, out);
      return;
    case WeightDtype::kBF16:
      for (int64_t i = 0; i < w.cols; ++i) out[i] = LoadBF16::Get(w.HalfRow(r) + i);
      return;
    case WeightDtype::kF16:
      for (int64_t i = 0; i < w.cols; ++i) out[i] = LoadF16::Get(w.HalfRow(r) + i);
      return;
  }
}

namespace {

// RMSNorm of R consecutive rows of x (each n long). Each row's sum of squares is one chain of adds
// in index order; the R chains go side by side, so that they overlap rather than wait on each
// other's latency. A row's bits do not depend on its company.
template <int R>
void RmsNormRows(const float* x, const float* weight, int64_t n, float eps, float* out) {
  double sum_squares[R] = {};
  for (int64_t i = 0; i < n; ++i) {
    for (int r = 0; r < R; ++r) sum_squares[r] += static_cast<double>(x[r * n + i]) * x[r * n + i];
  }
  for (int r = 0; r < R; ++r) {
    const float inv_rms =
        static_cast<float>(1.0 / std::sqrt(sum_squares[r] / static_cast<double>(n) + eps));
    for (int64_t i = 0; i < n; ++i) out[r * n + i] = (x[r * n + i] * inv_rms) * weight[i];
  }
}

}  // namespace

void RmsNorm(const float* x, const float* weight, int64_t s, int64_t n, float eps, float* out) {
  // The sum of squares in double: in float32 it overflows (inf, and the row normalizes to 0)
  // once the row's RMS passes ~1.8e19 / sqrt(n), while x itself and the normalized row are
  // still well inside float32's range (make-model --scale demanding builds such hidden states).
  // transformers' LlamaRMSNorm squares in float32 and does return zeros there; ref64 does not.
  // Eight rows at a time: 128 rows of 576 in 36 us rather than 120 one at a time (kernels_bench
  // BM_RmsNorm; one row still 0.9 us).
  constexpr int kRows = 8;
  int64_t row = 0;
  for (; row + kRows <= s; row += kRows) {
    RmsNormRows<kRows>(x + row * n, weight, n, eps, out + row * n);
  }
  for (; row < s; ++row) RmsNormRows<1>(x + row * n, weight, n, eps, out + row * n);
}

void AddInPlace(float* x, const float* y, int64_t count) {
  for (int64_t i = 0; i < count; ++i) x[i] += y[i];
}

void SwiGlu(ThreadPool& pool, const float* gate, const float* up, int64_t count, float* out) {
  // Elementwise, so any split gives the same bits; a decode step's 1536 values stay on the
  // calling thread (one grain), a prefill's 128 x 1536 go to every thread.
  constexpr int64_t kGrain = 4096;
  pool.ParallelFor(count, kGrain, [&](int64_t begin, int64_t end, int) {
    for (int64_t i = begin; i < end; ++i) {
      const float g = gate[i];
      out[i] = (g / (1.0f + Exp(-g))) * up[i];
    }
  });
}

namespace {
// In place: x = exp(x - max) over n values; returns max and the sum of the exps. Softmax's first
// half, and all a decode key chunk does before its weighted sums.
struct ShiftedExps {
  float max;
  float sum;
};
ShiftedExps ExpShifted(float* x, int64_t n) {
  const float max = Max(x, n);
  for (int64_t i = 0; i < n; ++i) x[i] = Exp(x[i] - max);
  return {max, Sum(x, n)};
}
}  // namespace

void Softmax(float* x, int64_t n) {
  const float sum = ExpShifted(x, n).sum;
  for (int64_t i = 0; i < n; ++i) x[i] /= sum;
}

std::vector<double> RopeInvFreq(const format::LlamaConfig& config) {
  const int64_t d = config.head_dim;
  std::vector<double> inv_freq(d / 2);
  for (int64_t i = 0; i < d / 2; ++i) {
    inv_freq[i] = 1.0 / std::pow(config.rope_theta, static_cast<double>(2 * i) / d);
  }
  if (config.rope_scaling) {  // "llama3" (the only type format accepts): spec §3
    const auto& rs = *config.rope_scaling;
    const double orig = static_cast<double>(rs.original_max_position_embeddings);
    const double low_freq_wavelen = orig / rs.low_freq_factor;
    const double high_freq_wavelen = orig / rs.high_freq_factor;
    for (double& f : inv_freq) {
      const double wavelen = 2.0 * M_PI / f;
      if (wavelen < high_freq_wavelen) continue;
      if (wavelen > low_freq_wavelen) {
        f = f / rs.factor;
      } else {
        const double smooth =
            (orig / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor);
        f = (1.0 - smooth) * f / rs.factor + smooth * f;
      }
    }
  }
  return inv_freq;
}

RopeTable BuildRopeTable(const format::LlamaConfig& config) {
  RopeTable table;
  GrowRopeTable(config, config.max_position_embeddings, table);
  return table;
}

void GrowRopeTable(const format::LlamaConfig& config, int64_t needed, RopeTable& table) {
  if (needed <= table.positions) return;
  const int64_t built = table.positions;
  // At least 4096 rows at once, so a model of up to 4096 positions (and any short run) builds its
  // table in its first call and a decode step never allocates.
  constexpr int64_t kMinRows = 4096;
  const int64_t positions =
      std::min(config.max_position_embeddings, std::max({needed, 2 * built, kMinRows}));
  table.half = config.head_dim / 2;
  table.cos.resize(positions * table.half);
  table.sin.resize(positions * table.half);
  const std::vector<double> inv_freq = RopeInvFreq(config);
  for (int64_t p = built; p < positions; ++p) {
    for (int64_t i = 0; i < table.half; ++i) {
      const double angle = static_cast<double>(p) * inv_freq[i];
      table.cos[p * table.half + i] = static_cast<float>(std::cos(angle));
      table.sin[p * table.half + i] = static_cast<float>(std::sin(angle));
    }
  }
  table.positions = positions;
}

void ApplyRope(float* x, int64_t heads, int64_t half, const float* cos, const float* sin) {
  for (int64_t h = 0; h < heads; ++h) {
    float* v = x + h * 2 * half;
    for (int64_t i = 0; i < half; ++i) {
      const float x1 = v[i];
      const float x2 = v[i + half];
      v[i] = x1 * cos[i] + (-x2) * sin[i];
      v[i + half] = x2 * cos[i] + x1 * sin[i];
    }
  }
}

void ScratchBuffer::Grow(int64_t floats) {
  if (floats <= size_) return;
  data_.reset(new float[floats]);  // uninitialized on purpose: see the header
  size_ = floats;
}

namespace {
// Decode attention's keys in chunks, each chunk's softmax and weighted sums combined afterwards
// (AttendOneRow). A constant: the bits depend on it, so never on the thread count.
constexpr int64_t kDecodeKeyChunk = 256;
// Rows of a chunk read for every KV head in turn (a multiple of both paths' key blocks).
constexpr int64_t kDecodeKeyBlock = 32;
int64_t DecodeKeyChunks(int64_t keys) { return (keys + kDecodeKeyChunk - 1) / kDecodeKeyChunk; }
}  // namespace

void AttentionScratch::Reserve(int threads, int64_t s, int64_t keys, int64_t nh, int64_t d) {
  // Decode's buffers always: a batched call of s rows runs its one-row parts as decode rows.
  heads.Grow(nh * keys);
  chunk_sums.Grow(DecodeKeyChunks(keys) * nh * (d + 2));
  if (s == 1) return;  // decode uses `heads` and `chunk_sums` only
  if (static_cast<int>(per_thread.size()) < threads) per_thread.resize(threads);
  for (auto& buffer : per_thread) buffer.Grow(std::min(s, kAttentionQueryTile) * keys);
}

namespace {

// One query row of every head against keys 0..visible-1 (decode). At a long context this reads
// the whole cache once per layer, and that read is its cost, so the work is cut for reading.
// The keys are cut into chunks of kDecodeKeyChunk. A chunk's keys are read block by block of
// kDecodeKeyBlock rows, each KV head in turn taking its part of the block's rows for its n_rep
// query heads (n_rep dots per key row), so that one thread reads whole cache rows in order; then
// each query head's scores become exp(score - the chunk's max), and the values are read the same
// way (n_rep weighted sums per value row, each output one chain run a block at a time). The
// chunks are then combined head by head in chunk order, as flash-decoding does: each chunk's sums
// and exp sum rescaled by exp(its max - the row's max), the sums divided by the exp sums' total.
// Every value is computed whole by one work item (the scores in Dot's order, the sums in key
// order) or by the combine, so the bits depend on kDecodeKeyChunk only: neither on the thread
// count, nor on how the work is cut into items, nor on the kernel path (the two products are
// dispatched: impl/kernel_table.h). An item is a chunk, or, with fewer chunks than threads, a
// chunk's part for one KV head (whose rows it then reads with a stride).
// With the cache read from DRAM as in a decode step (kernels_bench BM_AttentionDecodeCold, 2
// threads, 512 keys): one head at a time through Eigen's products 49.5-50.2 us per layer; one
// item per KV head 40.9-41.6 us, and 28.6-35.5 with the scores' trees folded 16 keys at a time
// (attention_kernels.cc); chunks of whole rows 23.1-27.1 us (2048 keys: 126-153 -> 90-110 us). In
// the decode step at 512 (bench, 11 alternations) decode@512 / decode@64 went 0.90 -> 0.93.
// Chunks of 64 or 128 keys, claimed as they come, did no better than the items per KV head: each
// item starts its rows unprefetched.

void AttendOneRow(ThreadPool& pool, const float* q, const float* keys, const float* values,
                  int64_t visible, int64_t nh, int64_t nkv, int64_t d, float scale, float* scores,
                  float* chunk_sums, float* out) {
  const KernelTable& kernels = Kernels();
  const int64_t n_rep = nh / nkv;
  const int64_t kv_dim = nkv * d;
  const int64_t chunks = DecodeKeyChunks(visible);
  float* sums = chunk_sums;                     // (chunks, nh, d)
  float* stats = chunk_sums + chunks * nh * d;  // (chunks, nh, {max, exp sum})
  // Chunk c's part for KV heads [g0, g1): query heads g0 * n_rep .. g1 * n_rep - 1.
  const auto attend_chunk = [&](int64_t c, int64_t g0, int64_t g1) {
    const int64_t j0 = c * kDecodeKeyChunk;  // keys j0 .. j0 + n - 1
    const int64_t n = std::min(kDecodeKeyChunk, visible - j0);
    float* chunk_scores = scores + nh * j0;  // (nh, n)
    for (int64_t b = 0; b < n; b += kDecodeKeyBlock) {
      for (int64_t g = g0; g < g1; ++g) {
        kernels.attention_scores(q + g * n_rep * d, n_rep, keys + (j0 + b) * kv_dim + g * d, kv_dim,
                                 std::min(kDecodeKeyBlock, n - b), d, scale,
                                 chunk_scores + g * n_rep * n + b, n);
      }
    }
    for (int64_t h = g0 * n_rep; h < g1 * n_rep; ++h) {
      const ShiftedExps e = ExpShifted(chunk_scores + h * n, n);
      stats[(c * nh + h) * 2] = e.max;
      stats[(c * nh + h) * 2 + 1] = e.sum;
    }
    for (int64_t b = 0; b < n; b += kDecodeKeyBlock) {
      for (int64_t g = g0; g < g1; ++g) {
        kernels.weighted_sums(chunk_scores + g * n_rep * n + b, n, n_rep,
                              std::min(kDecodeKeyBlock, n - b), values + (j0 + b) * kv_dim + g * d,
                              kv_dim, d, sums + (c * nh + g * n_rep) * d, d, b > 0);
      }
    }
  };
  // An item is a whole chunk (every KV head), or with fewer chunks than threads one KV head's part.
  const int64_t heads_per_item = chunks >= pool.Size() ? nkv : 1;
  const int64_t items_per_chunk = nkv / heads_per_item;
  pool.ParallelFor(chunks * items_per_chunk, 1, [&](int64_t begin, int64_t end, int) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t g0 = (item % items_per_chunk) * heads_per_item;
      attend_chunk(item / items_per_chunk, g0, g0 + heads_per_item);
    }
  });
  for (int64_t h = 0; h < nh; ++h) {  // the combine
    float max = stats[h * 2];
    for (int64_t c = 1; c < chunks; ++c) max = std::max(max, stats[(c * nh + h) * 2]);
    float* o = out + h * d;
    std::fill(o, o + d, 0.0f);
    float total = 0.0f;
    for (int64_t c = 0; c < chunks; ++c) {
      const float rescale = Exp(stats[(c * nh + h) * 2] - max);
      total += rescale * stats[(c * nh + h) * 2 + 1];
      const float* chunk = sums + (c * nh + h) * d;
      for (int64_t i = 0; i < d; ++i) o[i] += rescale * chunk[i];
    }
    for (int64_t i = 0; i < d; ++i) o[i] /= total;
  }
}

// A block of query rows [i0, i0 + rows) of one head (prefill): scores by GEMM, masked softmax per
// row (masked entries set to exactly 0, as exp(-inf) gives), then out = weights · V by GEMM.
void AttendBlock(const float* q, int64_t q_dim, int64_t i0, int64_t rows, int64_t past,
                 const float* keys, const float* values, int64_t kv_dim, int64_t d, float scale,
                 int64_t window, float* scores, float* out) {
  const int64_t kv_len = past + i0 + rows;  // keys the last row of the block can see
  ConstStridedMap q_block(q + i0 * q_dim, rows, d, Eigen::OuterStride<>(q_dim));  // (rows, d)
  ConstStridedMap k(keys, kv_len, d, Eigen::OuterStride<>(kv_dim));               // (kv_len, d)
  ConstStridedMap v(values, kv_len, d, Eigen::OuterStride<>(kv_dim));             // (kv_len, d)
  Eigen::Map<RowMatrix> s(scores, rows, kv_len);                                  // (rows, kv_len)
  s.noalias() = q_block * k.transpose();
  for (int64_t r = 0; r < rows; ++r) {
    float* row = scores + r * kv_len;
    const int64_t visible = past + i0 + r + 1;  // the causal mask: key j visible iff j <= past + i
    // The window hides the keys before `first` (none without a window).
    const int64_t first = window > 0 ? std::max<int64_t>(0, visible - window) : 0;
    for (int64_t j = first; j < visible; ++j) row[j] *= scale;
    Softmax(row + first, visible - first);
    std::fill(row, row + first, 0.0f);
    std::fill(row + visible, row + kv_len, 0.0f);
  }
  StridedMap o(out + i0 * q_dim, rows, d, Eigen::OuterStride<>(q_dim));  // (rows, d)
  o.noalias() = s * v;
}

}  // namespace

void Attention(ThreadPool& pool, const float* q, int64_t s, int64_t past, const float* keys,
               const float* values, int64_t nh, int64_t nkv, int64_t d, float* out,
               AttentionScratch& scratch, int64_t window) {
  const int64_t n_rep = nh / nkv;
  const int64_t q_dim = nh * d;
  const int64_t kv_dim = nkv * d;
  // transformers multiplies the scores by head_dim**-0.5 (a float32 multiply).
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
  if (s == 1) {
    // A window starts the row's keys at `first` (0 without one).
    const int64_t first = window > 0 ? std::max<int64_t>(0, past + 1 - window) : 0;
    AttendOneRow(pool, q, keys + first * kv_dim, values + first * kv_dim, past + 1 - first, nh, nkv,
                 d, scale, scratch.heads.data(), scratch.chunk_sums.data(), out);
    return;
  }
  // Work items: (head, block of query rows); each computed whole by one thread.
  const int64_t blocks = (s + kAttentionQueryTile - 1) / kAttentionQueryTile;
  pool.ParallelFor(nh * blocks, 1, [&](int64_t begin, int64_t end, int thread) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t h = item / blocks;
      const int64_t i0 = (item % blocks) * kAttentionQueryTile;
      const int64_t rows = std::min(kAttentionQueryTile, s - i0);
      const int64_t kv_head = h / n_rep;
      AttendBlock(q + h * d, q_dim, i0, rows, past, keys + kv_head * d, values + kv_head * d,
                  kv_dim, d, scale, window, scratch.per_thread[thread].data(), out + h * d);
    }
  });
}

}  // namespace kvdiff::impl
