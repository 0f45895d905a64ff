// config.json (format::ParseConfig).
#include "format/config.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kvdiff::fuzz::Refusable([&] { kvdiff::format::ParseConfig(kvdiff::fuzz::Text(data, size)); });
  return 0;
}
