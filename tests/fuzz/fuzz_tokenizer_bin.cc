// llama2.c's tokenizer.bin, then encoding and decoding a little text with it.
#include "format/tokenizer.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = kvdiff::fuzz::WriteFile("tokenizer.bin", data, size);
  kvdiff::fuzz::Refusable([&] {
    const auto tokenizer = kvdiff::format::Tokenizer::ReadLlama2c(path);
    for (kvdiff::Token id : tokenizer.Encode("Once upon a time", true))
      (void)tokenizer.Decode(id, 1);
  });
  return 0;
}
