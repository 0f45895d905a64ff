// The GGUF conversion cache of the llama.cpp engine (gguf_cache.h).
#include "engines/llama_cpp/gguf_cache.h"

#include <fmt/format.h>

#include <cctype>
#include <cstdlib>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "format/error.h"
#include "format/gguf.h"
#include "format/prng.h"

namespace kvdiff::llama_cpp {
namespace {

// FNV-1a 64 (format/prng.h) over a file's bytes: the cache key of a converted model (not a
// security boundary).
uint64_t HashFile(const std::filesystem::path& path, uint64_t h) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw kvdiff::InputError(fmt::format("cannot read {}", path.string()));
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    h = kvdiff::format::Fnv1a64(std::string_view(buf.data(), static_cast<size_t>(in.gcount())), h);
  }
  return h;
}

// Beside each cache entry: the FNV-1a 64 hash of its bytes, recorded when kvdiff wrote it.
std::filesystem::path SumFile(const std::filesystem::path& gguf) {
  return gguf.string() + ".fnv1a64";
}

void WriteAtomically(const std::filesystem::path& path, const std::string& text) {
  const std::filesystem::path tmp = path.string() + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f << text;
    if (!f) throw kvdiff::EngineError(fmt::format("cannot write {}", tmp.string()));
  }
  std::filesystem::rename(tmp, path);
}

}  // namespace

void CheckCacheEntry(const std::filesystem::path& gguf) {
  std::ifstream in(SumFile(gguf));
  std::string recorded;
  in >> recorded;
  const std::string actual = fmt::format("{:016x}", HashFile(gguf, kvdiff::format::kFnv1a64Offset));
  if (recorded != actual) {
    throw kvdiff::InputError(fmt::format(
        "the GGUF conversion cache entry {} was changed after kvdiff wrote it: its FNV-1a 64 hash "
        "is {}, {} records {}; delete both files to have kvdiff convert the model again",
        gguf.string(), actual, SumFile(gguf).filename().string(), recorded));
  }
}

std::filesystem::path GgufFor(const std::filesystem::path& model, kvdiff::format::DType dtype) {
  if (std::filesystem::is_regular_file(model)) return model;
  if (!std::filesystem::is_directory(model)) {
    throw kvdiff::InputError(
        fmt::format("model {}: neither a directory nor a .gguf file", model.string()));
  }
  uint64_t h = kvdiff::format::kFnv1a64Offset;
  h = HashFile(model / "config.json", h);
  h = HashFile(model / "model.safetensors", h);
  if (std::filesystem::exists(model / "tokenizer.kvdiff.json"))
    h = HashFile(model / "tokenizer.kvdiff.json", h);
  const char* env = std::getenv("KVDIFF_GGUF_CACHE");
  const char* home = std::getenv("HOME");
  const std::filesystem::path dir =
      env ? env : std::filesystem::path(home ? home : "/tmp") / ".cache" / "kvdiff" / "gguf";
  // v1: the converter's version; bump when the writer's output changes.
  std::string dtype_name = kvdiff::format::DTypeName(dtype);
  for (char& c : dtype_name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const std::filesystem::path out = dir / fmt::format("{:016x}-v1-{}.gguf", h, dtype_name);
  const std::filesystem::path sum = SumFile(out);
  // An entry without its recorded hash was cut short or predates the record: convert it again.
  if (!std::filesystem::exists(out) || !std::filesystem::exists(sum)) {
    std::filesystem::create_directories(dir);
    kvdiff::format::ConvertHfToGguf(model, out, dtype);
    WriteAtomically(sum, fmt::format("{:016x}\n", HashFile(out, kvdiff::format::kFnv1a64Offset)));
  }
  return out;
}

}  // namespace kvdiff::llama_cpp
