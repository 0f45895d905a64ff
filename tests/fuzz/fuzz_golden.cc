// Golden files (harness::ParseGolden), printed back when accepted.
#include "harness/golden/golden.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kvdiff::fuzz::Refusable([&] {
    const auto golden = kvdiff::harness::ParseGolden(kvdiff::fuzz::Text(data, size), "fuzz");
    (void)kvdiff::harness::GoldenToText(golden);
  });
  return 0;
}
