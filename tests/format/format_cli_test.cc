// The built kvdiff binary: make-model, info and compare, their output and exit codes
// (0 ok, 1 compare beyond tolerance, 2 bad input with the message on stderr).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <string>

#include "format/model_files.h"
#include "format/safetensors.h"
#include "format/sanitizer_runtime.h"
#include "tests/test_support.h"

namespace kvdiff::format {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

using Result = testing::CommandResult;

class Cli : public ::testing::Test {
 protected:
  Result Run(const std::string& args) { return testing::RunKvdiff(args, dir_.path()); }
  std::string P(const std::string& name) { return testing::ShellQuote((dir_ / name).string()); }
  testing::TempDir dir_;
};

TEST_F(Cli, MakeModelIsDeterministic) {
  Result a = Run("make-model --preset tiny --seed 7 --out " + P("a"));
  ASSERT_EQ(a.exit_code, 0) << a.err;
  EXPECT_THAT(a.out, AllOf(HasSubstr("wrote"), HasSubstr("model.safetensors"),
                           HasSubstr("preset tiny"), HasSubstr("seed 7")));
  ASSERT_EQ(Run("make-model --preset tiny --seed 7 --out " + P("b")).exit_code, 0);
  ASSERT_EQ(Run("make-model --preset tiny --seed 8 --out " + P("c")).exit_code, 0);
  const std::string bytes_a = testing::ReadFile(dir_ / "a" / "model.safetensors");
  EXPECT_GT(bytes_a.size(), 400000u);
  EXPECT_EQ(bytes_a, testing::ReadFile(dir_ / "b" / "model.safetensors"));
  EXPECT_EQ(testing::ReadFile(dir_ / "a" / "config.json"),
            testing::ReadFile(dir_ / "b" / "config.json"));
  EXPECT_NE(bytes_a, testing::ReadFile(dir_ / "c" / "model.safetensors"));
  // What the binary wrote is what the library generates.
  const ModelWeights loaded = LoadModel(dir_ / "a");
  const ModelWeights generated = MakeRandomModel(PresetConfig("tiny"), 7);
  for (const auto& [name, t] : generated.tensors) EXPECT_EQ(loaded.Get(name).data, t.data) << name;
}

TEST_F(Cli, MakeModelDtypeAndTiedOverride) {
  ASSERT_EQ(Run("make-model --preset tiny --seed 1 --dtype bf16 --tied --out " + P("m")).exit_code,
            0);
  const LlamaConfig config = LoadConfig(dir_ / "m" / "config.json");
  EXPECT_EQ(config.torch_dtype, "bfloat16");
  EXPECT_TRUE(config.tie_word_embeddings);
  const SafetensorsFile file = SafetensorsFile::Open(dir_ / "m" / "model.safetensors");
  EXPECT_FALSE(file.Has("lm_head.weight"));
  EXPECT_EQ(file.Get("model.norm.weight").dtype, DType::kBF16);

  // --config with a file: the tied tiny config, untied again on the command line.
  ASSERT_EQ(
      Run("make-model --config " + P("m/config.json") + " --untied --dtype f16 --out " + P("n"))
          .exit_code,
      0);
  const SafetensorsFile f16 = SafetensorsFile::Open(dir_ / "n" / "model.safetensors");
  EXPECT_TRUE(f16.Has("lm_head.weight"));
  EXPECT_EQ(f16.Get("lm_head.weight").dtype, DType::kF16);
  EXPECT_EQ(LoadConfig(dir_ / "n" / "config.json").torch_dtype, "float16");
}

TEST_F(Cli, MakeModelBadInput) {
  Result r = Run("make-model --preset huge --out " + P("x"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("huge"));
  r = Run("make-model --seed 1 --out " + P("x"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("exactly one of --preset"));
  r = Run("make-model --preset tiny --dtype f8 --out " + P("x"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("f8"));
  r = Run("make-model --preset tiny --tied --untied --out " + P("x"));
  EXPECT_EQ(r.exit_code, 2);
  std::ofstream(dir_ / "bad.json") << R"({"hidden_size": 64})";
  r = Run("make-model --config " + P("bad.json") + " --out " + P("x"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, AllOf(HasSubstr("bad.json"), HasSubstr("intermediate_size")));
  std::ofstream(dir_ / "file") << "x";
  r = Run("make-model --preset tiny --out " + P("file"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("cannot create the model directory"));
}

TEST_F(Cli, Info) {
  ASSERT_EQ(Run("make-model --preset tiny --seed 3 --dtype bf16 --out " + P("m")).exit_code, 0);
  const Result r = Run("info --model " + P("m"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  int64_t params = 0;
  for (const auto& spec : ExpectedTensors(PresetConfig("tiny"))) {
    int64_t n = 1;
    for (int64_t d : spec.shape) n *= d;
    params += n;
  }
  EXPECT_THAT(r.out, AllOf(HasSubstr("parameters    " + std::to_string(params)),
                           HasSubstr("21 x BF16"), HasSubstr("4 heads, 2 KV heads, head_dim 16"),
                           HasSubstr("bfloat16"), HasSubstr("untied")));
  const Result missing = Run("info --model " + P("nothing"));
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_THAT(missing.err, HasSubstr("does not exist"));
  EXPECT_EQ(Run("info").exit_code, 2);
}

class CompareCli : public Cli {
 protected:
  void SetUp() override {
    for (int i = 0; i < 4 * 8; ++i) base_.push_back(static_cast<float>((i * 7) % 11) - 5.0f);
  }
  std::string Write(const std::string& name, const std::vector<float>& values,
                    std::vector<int64_t> shape = {4, 8}, const std::string& tensor = "logits") {
    WriteSafetensors(dir_ / name, {{tensor, DType::kF32, shape, values}});
    return P(name);
  }
  std::vector<float> base_;
};

TEST_F(CompareCli, IdenticalFilesAgree) {
  const Result r = Run("compare " + Write("a", base_) + " " + Write("b", base_));
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, AllOf(HasSubstr("4 rows: 4 within tolerance, argmax agrees on 4"),
                           Not(HasSubstr("first row beyond tolerance"))));
}

TEST_F(CompareCli, DifferenceBeyondToleranceNamesTheFirstRow) {
  std::vector<float> b = base_;
  b[2 * 8 + 5] += 3e-4f;  // row 2
  b[3 * 8 + 1] += 1.0f;   // row 3
  const std::string fa = Write("a", base_), fb = Write("b", b);
  Result r = Run("compare " + fa + " " + fb);
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_THAT(r.out, AllOf(HasSubstr("first row beyond tolerance: row 2, col 5"),
                           HasSubstr("BEYOND TOLERANCE"), HasSubstr("2 within tolerance")));
  // A looser tolerance admits row 2 but not row 3.
  r = Run("compare " + fa + " " + fb + " --tolerance 1e-3");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.out, HasSubstr("first row beyond tolerance: row 3, col 1"));
  r = Run("compare " + fa + " " + fb + " --tolerance 2");
  EXPECT_EQ(r.exit_code, 0) << r.out;
}

TEST_F(CompareCli, NanIsReportedBeforeAnyDifference) {
  std::vector<float> b = base_;
  b[1 * 8 + 6] = std::numeric_limits<float>::quiet_NaN();
  const Result r = Run("compare " + Write("a", base_) + " " + Write("b", b));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.out, AllOf(HasSubstr("non-finite"), HasSubstr("row 1, col 6"), HasSubstr("nan")));
}

// compare keeps what it prints (the first rows, the first failing ones, the last), not a result
// per row: 4,000,000 rows of vocab 1 (an 8 MB BF16 file) took ~600 MB when it kept them all, and
// take the logits' 32 MB as floats (plus the program) now. The peak is measured in a child of a
// fork, whose RUSAGE_CHILDREN holds that one command alone.
TEST_F(CompareCli, MemoryIsBoundedByTheLogitsNotByTheRows) {
#ifdef KVDIFF_SANITIZER_RUNTIME
  GTEST_SKIP() << "the sanitizer's shadow memory and quarantine make peak RSS meaningless";
#else
  constexpr int64_t kRows = 4'000'000;
  WriteSafetensors(dir_ / "a", {{"logits", DType::kBF16, {kRows, 1}, std::vector<float>(kRows)}});
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const Result r = Run("compare " + P("a") + " " + P("a"));
    rusage usage{};
    getrusage(RUSAGE_CHILDREN, &usage);
    std::ofstream(dir_ / "peak_kb") << usage.ru_maxrss;
    _exit(r.exit_code == 0 && r.out.find("4000000 rows: 4000000 within") != std::string::npos ? 0
                                                                                              : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "compare did not pass";
  const long peak_kb = std::stol(testing::ReadFile(dir_ / "peak_kb"));
  EXPECT_LT(peak_kb, 200 * 1024) << "compare of " << kRows << " rows peaked at " << peak_kb
                                 << " KB";
#endif
}

TEST_F(CompareCli, BadInputExitsTwo) {
  const std::string fa = Write("a", base_);
  Result r = Run("compare " + fa + " " + Write("b", base_, {8, 4}));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, AllOf(HasSubstr("shapes differ"), HasSubstr("[4, 8]"), HasSubstr("[8, 4]")));
  r = Run("compare " + fa + " " + Write("c", base_, {4, 8}, "other"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("no tensor named \"logits\""));
  r = Run("compare " + fa + " " + P("absent"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("cannot open"));
  std::ofstream(dir_ / "junk") << "not a safetensors file at all";
  r = Run("compare " + fa + " " + P("junk"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("junk"));
  r = Run("compare " + fa + " " + fa + " --tolerance -1");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--tolerance"));
  r = Run("compare " + fa + " " + fa + " --tensor other");
  EXPECT_EQ(r.exit_code, 2);
}

}  // namespace
}  // namespace kvdiff::format
