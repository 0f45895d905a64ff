// The linear layers: y = x W^T for the weights in any storage (float32, bf16, f16), by
// matrix-vector products that stream the weights for a few rows (decode) and by impl/gemm.h's tiles
// for many. The kernels themselves are impl/linear_kernels.cc and impl/gemm.cc, in the variant for
// this CPU (impl/kernel_path.h); this file only deals the work out.
#include <algorithm>
#include <vector>

#include "format/error.h"
#include "impl/gemm.h"
#include "impl/kernel_table.h"
#include "impl/kernels.h"

namespace kvdiff::impl {
namespace {

// Output rows per GEMM tile in prefill (a work item of the pool, claimed on its own). A function
// of the matrix shape only; the bits do not depend on it anyway (GemmTile sums each element in one
// fixed chain), but the balance does: a thread that finishes first waits for at most one tile.
// 64 rows splits the 576-, 192- and 1536-row matrices of SmolLM2 into 9, 3 and 24 tiles of two
// panels. Measured on its 128-token bf16 forward, 2 threads (a throwaway in-process A/B, medians of
// 20 alternated runs, two runs each): 96-row tiles in 8 chunks a call took 1.04-1.06x the time of
// 32-row tiles in 32 chunks, those 1.03-1.05x that of 64-row tiles in 32 chunks, and those
// 1.05-1.07x that of 64-row tiles claimed one at a time; 128-row tiles one at a time did as well.
int64_t GemmTileRows(int64_t rows) { return rows <= 2048 ? 64 : 256; }

// Rows per chunk in matrix-vector products: one chunk boundary per 16 rows keeps the split even.
constexpr int64_t kMatVecGrain = 16;

}  // namespace

namespace {

// The work items of a LinearMany call, in order: output k owns items [begin[k], begin[k + 1]).
// An item is a weight row (rows path) or a tile of GemmTileRows rows (GEMM path).
struct LinearItems {
  int64_t begin[kLinearManyMax + 1];
  int count;
  int64_t Total() const { return begin[count]; }
  int Owner(int64_t item) const {  // the output an item belongs to (count is tiny: a scan)
    int k = 0;
    while (item >= begin[k + 1]) ++k;
    return k;
  }
};

LinearItems CountItems(const LinearOutput* outputs, int count, bool gemm) {
  KVDIFF_CHECK(count >= 1 && count <= kLinearManyMax, "LinearMany: expected 1..{} outputs, got {}",
               kLinearManyMax, count);
  LinearItems items{};
  items.count = count;
  for (int k = 0; k < count; ++k) {
    const int64_t rows = outputs[k].w.rows;
    const int64_t n = gemm ? (rows + GemmTileRows(rows) - 1) / GemmTileRows(rows) : rows;
    items.begin[k + 1] = items.begin[k] + n;
  }
  return items;
}

// This thread's scratch for GemmTile's packed panel of w (w.cols * kGemmPanel floats); it only
// grows, so a forward allocates it once.
float* PanelScratch(const WeightView& w) {
  thread_local std::vector<float> panel;
  if (static_cast<int64_t>(panel.size()) < w.cols * kGemmPanel) panel.resize(w.cols * kGemmPanel);
  return panel.data();
}

// Tile t of one output: y[:, t*tile .. +rows] = x · W[t*tile .. +rows]ᵀ by the packed-panel
// micro-kernel (impl/gemm.h): each element one fused multiply-add chain over the input features.
void GemmTileOfOne(const KernelTable& kernels, const float* x, int64_t s, const WeightView& w,
                   int64_t t, float* y) {
  const int64_t tile = GemmTileRows(w.rows);
  const int64_t r0 = t * tile;
  kernels.gemm_tile(x, s, w, r0, std::min(tile, w.rows - r0), y + r0, w.rows, PanelScratch(w));
}

void RunLinear(ThreadPool& pool, const float* x, int64_t s, const LinearOutput* outputs, int count,
               bool gemm) {
  const LinearItems items = CountItems(outputs, count, gemm);
  const KernelTable& kernels = Kernels();
  if (gemm) {  // a tile is tens of microseconds: each is claimed on its own
    pool.ParallelForEach(items.Total(), [&](int64_t item, int64_t, int) {
      const int k = items.Owner(item);
      GemmTileOfOne(kernels, x, s, outputs[k].w, item - items.begin[k], outputs[k].y);
    });
    return;
  }
  // Rows: chunk boundaries every 16 rows keep the split even.
  pool.ParallelFor(items.Total(), kMatVecGrain, [&](int64_t begin, int64_t end, int) {
    int k = items.Owner(begin);
    if (s == 1) {  // runs of rows of one output at a time
      for (int64_t item = begin; item < end;) {
        while (item >= items.begin[k + 1]) ++k;
        const int64_t n = std::min(end, items.begin[k + 1]) - item;
        kernels.decode_rows(x, outputs[k].w, item - items.begin[k], n, outputs[k].y);
        item += n;
      }
      return;
    }
    for (int64_t item = begin; item < end; ++item) {
      while (item >= items.begin[k + 1]) ++k;
      kernels.rows_of_one(x, s, outputs[k].w, item - items.begin[k], outputs[k].y);
    }
  });
}

}  // namespace

void LinearRows(ThreadPool& pool, const float* x, int64_t s, const WeightView& w, float* y) {
  const LinearOutput output{w, y};
  RunLinear(pool, x, s, &output, 1, false);
}

void LinearGemm(ThreadPool& pool, const float* x, int64_t s, const WeightView& w, float* y) {
  const LinearOutput output{w, y};
  RunLinear(pool, x, s, &output, 1, true);
}

void LinearMany(ThreadPool& pool, const float* x, int64_t s, const LinearOutput* outputs,
                int count) {
  for (int k = 1; k < count; ++k) {
    KVDIFF_CHECK(outputs[k].w.cols == outputs[0].w.cols,
                 "LinearMany: output {} has {} input features, output 0 has {}", k,
                 outputs[k].w.cols, outputs[0].w.cols);
  }
  RunLinear(pool, x, s, outputs, count, s > kLinearRowsMax);
}

void GemmTile(const float* x, int64_t s, const WeightView& w, int64_t r0, int64_t n, float* c,
              int64_t c_stride) {
  Kernels().gemm_tile(x, s, w, r0, n, c, c_stride, PanelScratch(w));
}

void Linear(ThreadPool& pool, const float* x, int64_t s, const WeightView& w, float* y) {
  const LinearOutput output{w, y};
  RunLinear(pool, x, s, &output, 1, s > kLinearRowsMax);
}

}  // namespace kvdiff::impl
