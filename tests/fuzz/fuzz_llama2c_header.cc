// A llama2.c checkpoint's header (7 int32) and the size it implies.
#include "format/llama2c.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = kvdiff::fuzz::WriteFile("model.bin", data, size);
  kvdiff::fuzz::Refusable([&] {
    const auto header = kvdiff::format::ReadLlama2cHeader(path);
    (void)header.ToConfig();
  });
  return 0;
}
