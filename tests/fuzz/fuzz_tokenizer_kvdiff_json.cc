// tokenizer.kvdiff.json (format::Tokenizer::Parse), then a round trip through its text.
#include "format/tokenizer.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kvdiff::fuzz::Refusable([&] {
    const auto tokenizer = kvdiff::format::Tokenizer::Parse(kvdiff::fuzz::Text(data, size));
    for (kvdiff::Token id : tokenizer.Encode("Once upon a time", true))
      (void)tokenizer.Decode(id, 1);
  });
  return 0;
}
