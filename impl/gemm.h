// The prefill GEMM: a packed-panel micro-kernel (AVX-512, AVX2 or plain C++, as the CPU offers:
// impl/kernel_path.h), every output element summed in one fixed order, so the bits depend on the
// values only: not on the thread count, the tile a row falls in, or which of the kernels ran.
#pragma once

#include <cstdint>

#include "impl/kernels.h"

namespace kvdiff::impl {

// C[i][j] = X[i][·] · W[r0 + j][·] for i < s, j < n, with
//   acc = +0.0; for p = 0 .. k-1: acc = fma(X[i][p], W[r0 + j][p], acc); C[i][j] = acc
// (k = w.cols; one rounding per step, in that order: tests/impl/kernels_test.cc holds this scalar
// loop as the oracle and compares bits). X is (s, k) row-major and contiguous; C has row stride
// c_stride. W may be float32, bf16 or f16: its rows are widened (exactly) into the packed panels.
//
// How: W's n rows are packed one panel of kGemmPanel columns at a time, laid out [p][lane] (zero
// lanes pad the last panel); then for each block of up to kGemmRowBlock rows of X the micro-kernel
// keeps a kGemmRowBlock × kGemmPanel block of C in registers for the whole k loop: per step,
// kGemmPanel / 16 vector loads of the panel, one broadcast per row of X, and
// kGemmRowBlock * kGemmPanel / 16 FMAs (AVX-512: 24 accumulators + 3 operands of 32 registers).
// Meanwhile it prefetches the next panel's rows of W into L2, so that packing does not wait on
// DRAM.
constexpr int64_t kGemmPanel = 32;
constexpr int64_t kGemmRowBlock = 12;
// (The kernel in use: impl/kernel_path.h's, defined in gemm.cc; this entry is in linear.cc.)
void GemmTile(const float* x, int64_t s, const WeightView& w, int64_t r0, int64_t n, float* c,
              int64_t c_stride);

}  // namespace kvdiff::impl
