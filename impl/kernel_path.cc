#include "impl/kernel_path.h"

#include <fmt/format.h>

#include <atomic>
#include <cstdlib>

#if KVDIFF_KERNELS_AVX2
#include <cpuid.h>
#endif

#include "format/error.h"
#include "impl/kernel_table.h"

namespace kvdiff::impl {
namespace {

// What a variant needs besides being compiled in: the extensions its compilation was allowed to
// use (impl/CMakeLists.txt gives the same list as compiler flags; only x86-64 builds compile them).
#if KVDIFF_KERNELS_AVX2
bool HasF16c() {  // clang 14 has no __builtin_cpu_supports("f16c"): CPUID leaf 1, ECX bit 29
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
}
bool HasAvx2() {
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && HasF16c();
}
#endif
#if KVDIFF_KERNELS_AVX512
bool HasAvx512() {
  return HasAvx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}
#endif
bool Always() { return true; }

struct Variant {
  const KernelTable* table;
  bool (*runs_here)();
};
// Fastest first: "auto" takes the first that runs here.
const Variant kVariants[] = {
#if KVDIFF_KERNELS_AVX512
    {&avx512::kKernels, HasAvx512},
#endif
#if KVDIFF_KERNELS_AVX2
    {&avx2::kKernels, HasAvx2},
#endif
    {&scalar::kKernels, Always},
};

std::string Join(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& name : names) out += (out.empty() ? "" : ", ") + name;
  return out;
}

const KernelTable* Choose(const std::string& name) {
  for (const Variant& v : kVariants) {
    if (name == "auto" && v.runs_here()) return v.table;
    if (name != v.table->name) continue;
    KVDIFF_CHECK(v.runs_here(),
                 "KVDIFF_KERNELS={}: this CPU lacks the instructions of that kernel path "
                 "(it can run: {})",
                 name, Join(AvailableKernelPaths()));
    return v.table;
  }
  KVDIFF_CHECK(false, "KVDIFF_KERNELS={}: expected auto or one of this build's kernel paths: {}",
               name, Join(CompiledKernelPaths()));
  return nullptr;
}

std::atomic<const KernelTable*> current{nullptr};

}  // namespace

std::vector<std::string> CompiledKernelPaths() {
  std::vector<std::string> names;
  for (const Variant& v : kVariants) names.push_back(v.table->name);
  return names;
}

std::vector<std::string> AvailableKernelPaths() {
  std::vector<std::string> names;
  for (const Variant& v : kVariants) {
    if (v.runs_here()) names.push_back(v.table->name);
  }
  return names;
}

const KernelTable& Kernels() {
  const KernelTable* table = current.load(std::memory_order_acquire);
  if (table != nullptr) return *table;
  const char* env = std::getenv("KVDIFF_KERNELS");
  const std::string name = env == nullptr || *env == '\0' ? "auto" : env;
  table = Choose(name);  // throws on a bad value, and the next call asks again
  const KernelTable* expected = nullptr;
  // Two threads asking at once pick the same table; one of them stores it.
  current.compare_exchange_strong(expected, table, std::memory_order_acq_rel);
  return *current.load(std::memory_order_acquire);
}

const char* KernelPath() { return Kernels().name; }

void UseKernelPath(const std::string& name) {
  current.store(Choose(name), std::memory_order_release);
}

}  // namespace kvdiff::impl
