// Scenario JSON (harness::ParseScenario), then its validation against the tiny preset.
#include "format/model_files.h"
#include "harness/scenario/scenario.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const kvdiff::format::LlamaConfig tiny = kvdiff::format::PresetConfig("tiny");
  kvdiff::fuzz::Refusable([&] {
    const auto scenario = kvdiff::harness::ParseScenario(kvdiff::fuzz::Text(data, size));
    kvdiff::harness::ValidateScenario(scenario, tiny);
    (void)scenario.ToText();
  });
  return 0;
}
