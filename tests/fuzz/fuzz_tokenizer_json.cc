// HuggingFace tokenizer.json (format::HfTokenizer::Parse), then encoding and decoding with it.
#include "format/tokenizer_json.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kvdiff::fuzz::Refusable([&] {
    const auto tokenizer = kvdiff::format::HfTokenizer::Parse(kvdiff::fuzz::Text(data, size));
    const auto ids = tokenizer.Encode("Hello world, <s> once upon a time.", true);
    (void)tokenizer.Decode(ids, false);
  });
  return 0;
}
