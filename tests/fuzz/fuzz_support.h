// Shared by the libFuzzer targets (one per parser of outside input; see tests/fuzz/CMakeLists.txt
// and ci/fuzz). A target feeds the bytes to a parser; refusing them with kvdiff::InputError is the
// expected outcome. Anything else — a crash, a sanitizer report, another exception escaping, a
// leak, a timeout, running out of memory — is a finding.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "format/error.h"

namespace kvdiff::fuzz {

inline std::string Text(const uint8_t* data, size_t size) {
  return std::string(reinterpret_cast<const char*>(data), size);
}

// A scratch directory of this process, made once, for parsers that read files; removed when the
// fuzzer exits normally (its time or run limit), kept when it stops on a finding.
inline const std::filesystem::path& ScratchDir() {
  struct Dir {
    std::filesystem::path path = std::filesystem::temp_directory_path() /
                                 ("kvdiff-fuzz-" + std::to_string(static_cast<long>(::getpid())));
    Dir() { std::filesystem::create_directories(path); }
    ~Dir() {
      std::error_code ignored;
      std::filesystem::remove_all(path, ignored);
    }
  };
  static const Dir dir;
  return dir.path;
}

// Writes the bytes to ScratchDir()/name and returns the path.
inline std::filesystem::path WriteFile(const std::string& name, const uint8_t* data, size_t size) {
  const auto path = ScratchDir() / name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  return path;
}

// Runs fn; an InputError is the parser refusing the input, which is fine.
template <typename Fn>
void Refusable(Fn&& fn) {
  try {
    fn();
  } catch (const InputError&) {
  }
}

}  // namespace kvdiff::fuzz
