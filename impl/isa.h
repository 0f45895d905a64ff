// The instruction set a translation unit of impl is compiled for. impl's hot kernels (gemm.cc,
// linear_kernels.cc) are compiled once per instruction set, each time with KVDIFF_ISA naming it
// (impl/CMakeLists.txt); everything else is compiled once, for the baseline. Every inline function
// and template those kernel files share with the rest of impl (reduction.h, weight_load.h) lives
// in the inline namespace KVDIFF_ISA: the name reads the same, but each compilation is a distinct
// symbol, so the linker cannot keep the AVX-512 copy of one and hand it to a baseline caller (the
// SIGILL that one-definition-rule merging would cause on a CPU without AVX-512).
#pragma once

#ifndef KVDIFF_ISA
#define KVDIFF_ISA base
#endif
