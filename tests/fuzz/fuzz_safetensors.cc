// A safetensors file: header, offsets, then every tensor converted to float.
#include "format/safetensors.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = kvdiff::fuzz::WriteFile("model.safetensors", data, size);
  kvdiff::fuzz::Refusable([&] {
    const auto file = kvdiff::format::SafetensorsFile::Open(path);
    for (const auto& [name, view] : file.tensors()) (void)file.ReadFloat(name);
  });
  return 0;
}
