// A folder under the system temporary directory, removed with everything in it when the object
// goes. For files kvdiff writes only to hand to something else (a rows file to hash, a model
// directory for an engine plugin).
#pragma once

#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <string>

#include "format/error.h"

namespace kvdiff::format {

class ScratchDir {
 public:
  explicit ScratchDir(const std::string& purpose = "scratch") {
    static std::atomic<unsigned> counter{0};
    const auto tmp = std::filesystem::temp_directory_path();
    for (int attempt = 0; attempt < 100; ++attempt) {
      path_ = tmp / fmt::format("kvdiff-{}-{}-{}", purpose, static_cast<long>(getpid()), counter++);
      std::error_code ec;
      if (std::filesystem::create_directory(path_, ec)) return;
    }
    throw InputError(fmt::format("cannot create a temporary folder in {}", tmp.string()));
  }
  ~ScratchDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace kvdiff::format
