// What the reference needs around LibTorch, not of transformers' model: the BLAS thread pool held
// to the reference's threads, tensors read back as row-major float matrices, shapes as text, and
// LibTorch's errors reported as the reference's.
#pragma once

#include <ATen/ATen.h>

#include <string>

#include "format/tensor.h"

namespace kvdiff::ref {

// LibTorch's GEMMs run in whatever BLAS libblas.so.3 resolves to. OpenBLAS keeps a thread pool of
// its own, sized to every core when it loads, whose workers spin after each call: it is held to
// the reference's own thread count, so a reference on one thread (kvdiff check, any --jobs) never
// wakes them to spin against kvdiff's other threads. Looked up at run time: other BLAS have no
// such call, and LibTorch is not linked against OpenBLAS, only against libblas.so.3.
void HoldBlasThreads(int threads);

// "[2, 3]"
std::string ShapeString(at::IntArrayRef shape);

// [B, s, cols] (any float dtype) -> row-major float [B*s, cols].
RowMatrix ToRowMatrix(const at::Tensor& t);

// A LibTorch failure is never bad input (inputs are checked first); report it as ours, with the
// first line of torch's message and no C++ backtrace.
[[noreturn]] void RethrowTorchError(const c10::Error& e, const char* where);

}  // namespace kvdiff::ref
