// `kvdiff make-model` + `kvdiff forward` end to end: the logits file, cached and uncached, and the
// exit codes of bad input.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "format/safetensors.h"
#include "impl/model.h"
#include "tests/test_support.h"

namespace kvdiff {
namespace {

using ::testing::HasSubstr;

kvdiff::testing::CommandResult Kvdiff(const kvdiff::testing::TempDir& dir,
                                      const std::string& args) {
  return kvdiff::testing::RunKvdiff(args, dir.path());
}

class ForwardCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    kvdiff::testing::CommandResult made = Kvdiff(dir_, "make-model --preset tiny --seed 7 --out m");
    ASSERT_EQ(made.exit_code, 0) << made.err;
  }
  kvdiff::testing::TempDir dir_;
};

RowMatrix ReadLogits(const std::filesystem::path& path) {
  auto file = format::SafetensorsFile::Open(path);
  EXPECT_EQ(file.tensors().size(), 1u);
  const auto& view = file.Get("logits");
  EXPECT_EQ(view.dtype, format::DType::kF32);
  const std::vector<float> values = file.ReadFloat("logits");
  return Eigen::Map<const RowMatrix>(values.data(), view.shape.at(0), view.shape.at(1));
}

TEST_F(ForwardCliTest, WritesTheLogitsOfEveryPositionAndPrintsTheTop5) {
  kvdiff::testing::CommandResult run =
      Kvdiff(dir_, "forward --model m --tokens 1,2,3,4,5 --out l.safetensors");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const RowMatrix logits = ReadLogits(dir_ / "l.safetensors");
  ASSERT_EQ(logits.rows(), 5);
  ASSERT_EQ(logits.cols(), 256);
  const impl::Model model = impl::Model::Load(dir_ / "m", 1);
  const Logits expected = model.ForwardFull({1, 2, 3, 4, 5});
  EXPECT_LE((logits - expected).cwiseAbs().maxCoeff(), 0.0f);  // the same computation
  Eigen::Index best = 0;
  logits.row(4).maxCoeff(&best);
  EXPECT_THAT(run.out, HasSubstr(fmt::format("1. token {:>6}", best)));
  EXPECT_THAT(run.out, HasSubstr("5. token"));
}

TEST_F(ForwardCliTest, CachedInChunksAgreesWithUncached) {
  ASSERT_EQ(Kvdiff(dir_, "forward --model m --tokens 9,8,7,6,5,4 --out full.safetensors").exit_code,
            0);
  for (std::string chunks : {"", " --chunks 2,1,3", " --chunks 6"}) {
    kvdiff::testing::CommandResult run =
        Kvdiff(dir_, "forward --model m --tokens 9,8,7,6,5,4 --cached" + chunks +
                         " --threads 1 --out cached.safetensors");
    ASSERT_EQ(run.exit_code, 0) << run.err;
    const RowMatrix diff =
        ReadLogits(dir_ / "cached.safetensors") - ReadLogits(dir_ / "full.safetensors");
    EXPECT_LE(diff.cwiseAbs().maxCoeff(), 1e-4) << "chunks:" << chunks;
  }
}

// KVDIFF_KERNELS (impl/kernel_path.h) is checked before any command runs: a path this build or
// CPU lacks is bad input, never a SIGILL; the scalar path runs anywhere.
TEST_F(ForwardCliTest, KvdiffKernelsNamesAPathOrExitsWith2) {
  const std::string args = "forward --model m --tokens 1,2,3 --out x.safetensors";
  kvdiff::testing::CommandResult bad =
      kvdiff::testing::RunKvdiff(args, dir_.path(), {{"KVDIFF_KERNELS", "sse9"}});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("KVDIFF_KERNELS=sse9: expected auto or one of this build's "
                                 "kernel paths: "));
  EXPECT_FALSE(std::filesystem::exists(dir_ / "x.safetensors"));
  kvdiff::testing::CommandResult scalar =
      kvdiff::testing::RunKvdiff(args, dir_.path(), {{"KVDIFF_KERNELS", "scalar"}});
  EXPECT_EQ(scalar.exit_code, 0) << scalar.err;
}

TEST_F(ForwardCliTest, BadInputExitsWith2AndSaysWhy) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--tokens 1,x,3", "item 1 is \"x\""},
      {"--tokens 1,,3", "item 1 is \"\""},
      {"--tokens 1,2,300", "token id 300 at index 2 is out of range for vocab_size 256"},
      {"--tokens 1,2,3 --cached --chunks 2,2", "--chunks add up to 4 tokens but --tokens has 3"},
      {"--tokens 1,2,3 --cached --chunks 3,0", "chunk 1 is 0"},
      {"--tokens 1,2,3 --chunks 3", "--chunks requires --cached"},
      {"--tokens 1,2 --backend nope", "unknown backend 'nope' (available: impl"},
  };
  for (const auto& [args, message] : cases) {
    kvdiff::testing::CommandResult run =
        Kvdiff(dir_, "forward --model m " + args + " --out x.safetensors");
    EXPECT_EQ(run.exit_code, 2) << args;
    EXPECT_THAT(run.err, HasSubstr(message)) << args;
    EXPECT_FALSE(std::filesystem::exists(dir_ / "x.safetensors")) << args;
  }
  kvdiff::testing::CommandResult missing =
      Kvdiff(dir_, "forward --model nowhere --tokens 1 --out x.safetensors");
  EXPECT_EQ(missing.exit_code, 2);
}

}  // namespace
}  // namespace kvdiff
