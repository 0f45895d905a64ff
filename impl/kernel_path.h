// Which of impl's kernel variants runs. One binary holds the hot kernels (the decode
// matrix-vector products, the rows path, the GEMM tiles) compiled for several instruction sets
// and picks one at run time by what the CPU offers; every variant gives the same bits
// (tests/impl/kernel_path_test.cc), so the choice changes only the speed.
#pragma once

#include <string>
#include <vector>

namespace kvdiff::impl {

// The paths this binary holds, fastest first: "avx512" (unless built with -DKVDIFF_AVX512=OFF),
// "avx2", "scalar" (plain C++; always).
std::vector<std::string> CompiledKernelPaths();
// Those of them this CPU can run (avx512: AVX-512 F, BW, VL and DQ; avx2: AVX2, FMA and F16C).
std::vector<std::string> AvailableKernelPaths();

// The path in use. The first call chooses it from the environment variable KVDIFF_KERNELS:
// unset, empty or "auto" takes the first available path; a path's name forces it. Throws
// InputError naming the value and the paths this CPU offers when it names no compiled path or
// one this CPU cannot run (a clear error instead of SIGILL); the kvdiff CLI asks before any
// command runs, so a bad value is exit 2.
const char* KernelPath();

// Switches to the named path ("auto" as above) from now on, for the tests and benchmarks that
// compare paths in one process. Not while a forward runs. Throws InputError like KernelPath.
void UseKernelPath(const std::string& name);

}  // namespace kvdiff::impl
