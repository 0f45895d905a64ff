// model.safetensors.index.json beside a valid config.json: the shard map, then loading the model.
#include "format/config.h"
#include "format/model_files.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string config =
      kvdiff::format::ConfigToJson(kvdiff::format::PresetConfig("tiny"));
  const auto dir = kvdiff::fuzz::ScratchDir() / "sharded";
  std::filesystem::create_directories(dir);
  {
    std::ofstream out(dir / "config.json", std::ios::binary | std::ios::trunc);
    out << config;
  }
  std::filesystem::remove(dir / "model.safetensors");
  {
    std::ofstream out(dir / "model.safetensors.index.json", std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  kvdiff::fuzz::Refusable([&] { (void)kvdiff::format::LoadModel(dir); });
  return 0;
}
