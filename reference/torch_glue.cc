#include "reference/torch_glue.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <cstring>
#include <mutex>
#include <stdexcept>

namespace kvdiff::ref {

void HoldBlasThreads(int threads) {
  using SetThreads = void (*)(int);
  using GetThreads = int (*)();
  static const auto set =
      reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  static const auto get =
      reinterpret_cast<GetThreads>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  if (set == nullptr || get == nullptr || get() == threads) return;
  static std::mutex mutex;  // a process-wide setting: one writer at a time
  std::lock_guard<std::mutex> lock(mutex);
  if (get() != threads) set(threads);
}

std::string ShapeString(at::IntArrayRef shape) {
  return fmt::format("[{}]", fmt::join(shape.begin(), shape.end(), ", "));
}

RowMatrix ToRowMatrix(const at::Tensor& t) {
  at::Tensor rows = t.reshape({-1, t.size(-1)}).to(at::kFloat).contiguous();
  RowMatrix out(rows.size(0), rows.size(1));
  std::memcpy(out.data(), rows.data_ptr<float>(), sizeof(float) * rows.numel());
  return out;
}

void RethrowTorchError(const c10::Error& e, const char* where) {
  std::string message = e.what_without_backtrace();
  const auto newline = message.find('\n');
  if (newline != std::string::npos) message.resize(newline);
  throw std::runtime_error(fmt::format("reference {}: LibTorch error: {}", where, message));
}

}  // namespace kvdiff::ref
