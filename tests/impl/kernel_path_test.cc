// The kernel paths (impl/kernel_path.h): every path this CPU can run gives the logits of the scalar
// path bit for bit (memcmp), on every route through the linear layers: decode (one row), the rows
// path (2..8 rows), GEMM tiles (9+ rows), past one attention query tile (141 rows), cached prefill
// and chunks, for float32, bf16 and f16 storage and 1, 2 and 3 threads. A path the CPU lacks is
// skipped with a message saying so. The scalar path is the same source as the others, compiled
// without vector extensions: the oracle is the definition (Dot's lanes and tree, GemmTile's fma
// chain), not whatever a vector unit happens to do.
#include "impl/kernel_path.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "format/error.h"
#include "format/model_files.h"
#include "format/safetensors.h"
#include "impl/kernel_table.h"
#include "impl/kernels.h"
#include "impl/model.h"
#include "impl/session.h"
#include "impl_test_util.h"

namespace kvdiff::impl {
namespace {

using format::DType;

std::string Join(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& name : names) out += (out.empty() ? "" : ", ") + name;
  return out;
}

bool Available(const std::string& path) {
  for (const std::string& name : AvailableKernelPaths()) {
    if (name == path) return true;
  }
  return false;
}

// Puts the automatic choice back whatever the test did.
struct RestoreAuto {
  ~RestoreAuto() { UseKernelPath("auto"); }
};

// Widths that are not multiples of the vector widths, so every kernel's tails run: hidden 80
// (Dot's 32 lanes leave 16), intermediate 136 (the 16-column transpose leaves 8), vocab 300 (the
// last 32-row GEMM panel holds 12), 5 query heads over 1 KV head of 20 (decode attention: a
// vector of 16 or two of 8 and 4 columns left; Dot 20 lanes of 32).
format::LlamaConfig OddConfig() {
  format::LlamaConfig c = format::PresetConfig("tiny");
  c.hidden_size = 80;
  c.intermediate_size = 136;
  c.num_attention_heads = 5;
  c.num_key_value_heads = 1;
  c.head_dim = 20;
  c.vocab_size = 300;
  c.tie_word_embeddings = false;
  return c;
}
// And widths that are: Dot's rows of 96 and the attention's heads of 32 end with no tail (their
// tree then runs in registers).
format::LlamaConfig WholeConfig() {
  format::LlamaConfig c = OddConfig();
  c.hidden_size = 96;
  c.num_attention_heads = 6;
  c.num_key_value_heads = 2;
  c.head_dim = 32;
  return c;
}

// A random model with every value rounded to dtype and marked as loaded from it (16-bit storage).
std::shared_ptr<const format::ModelWeights> ModelIn(const format::LlamaConfig& config,
                                                    DType dtype) {
  format::ModelWeights w = format::MakeRandomModel(config, 11);
  if (dtype != DType::kF32) {
    for (auto& [name, t] : w.tensors) {
      for (float& v : t.data) v = format::RoundToDType(v, dtype);
    }
  }
  w.dtype_on_disk = dtype;
  return std::make_shared<const format::ModelWeights>(std::move(w));
}

// Every logits matrix the paths are compared on, each named by how it was made.
struct Routes {
  std::vector<std::string> names;
  std::vector<RowMatrix> logits;
};

Routes AllRoutes(const Model& model) {
  Routes run;
  const int64_t vocab = model.config().vocab_size;
  // Uncached: 1 row (matrix-vector), 2..8 (rows path), 9+ (GEMM tiles), 141 (past one attention
  // query tile of 128).
  for (int64_t n : {1, 2, 3, 5, 8, 9, 13, 40, 141}) {
    run.names.push_back("uncached n=" + std::to_string(n));
    run.logits.push_back(
        model.ForwardFull(testing::RandomTokens(n, vocab, static_cast<uint32_t>(n))));
  }
  // Cached: a 20-token prefill, a 3-token and a 12-token chunk, then single-token decode steps.
  Session session = model.NewSession();
  const Tokens history = testing::RandomTokens(40, vocab, 99);
  auto append = [&](int64_t begin, int64_t end) {
    run.names.push_back("cached " + std::to_string(begin) + ".." + std::to_string(end));
    run.logits.push_back(session.Append(Tokens(history.begin() + begin, history.begin() + end)));
  };
  append(0, 20);
  append(20, 23);
  append(23, 35);
  for (int64_t i = 35; i < 40; ++i) append(i, i + 1);
  return run;
}

struct Case {
  std::string path;
  DType dtype;
  const char* storage;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.path << " " << c.storage; }

class KernelPathTest : public ::testing::TestWithParam<Case> {};

TEST_P(KernelPathTest, LogitsAreTheScalarPathsBitForBit) {
  const Case c = GetParam();
  if (!Available(c.path)) {
    GTEST_SKIP() << "this CPU or build lacks the " << c.path
                 << " kernel path (available: " << Join(AvailableKernelPaths()) << ")";
  }
  RestoreAuto restore;
  const std::pair<const char*, format::LlamaConfig> shapes[] = {{"odd widths", OddConfig()},
                                                                {"whole widths", WholeConfig()}};
  for (const auto& [shape, config] : shapes) {
    const auto weights = ModelIn(config, c.dtype);
    for (int threads : {1, 2, 3}) {
      SCOPED_TRACE(::testing::Message() << shape << ", threads " << threads);
      const Model model(weights, threads);
      ASSERT_STREQ(model.StorageName(), c.storage);
      UseKernelPath("scalar");
      const Routes expected = AllRoutes(model);
      UseKernelPath(c.path);
      ASSERT_STREQ(KernelPath(), c.path.c_str());
      const Routes got = AllRoutes(model);
      ASSERT_EQ(got.logits.size(), expected.logits.size());
      for (size_t i = 0; i < got.logits.size(); ++i) {
        const RowMatrix& a = got.logits[i];
        const RowMatrix& b = expected.logits[i];
        ASSERT_EQ(a.size(), b.size()) << got.names[i];
        EXPECT_EQ(std::memcmp(a.data(), b.data(), sizeof(float) * a.size()), 0)
            << c.path << " against scalar, " << got.names[i] << ": max |diff| "
            << testing::RowDiff(a, a.rows() - 1, b, b.rows() - 1) << " on the last row";
      }
    }
  }
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  for (const std::string& path : CompiledKernelPaths()) {
    if (path == "scalar") continue;
    cases.push_back({path, DType::kF32, "float32"});
    cases.push_back({path, DType::kBF16, "bfloat16"});
    cases.push_back({path, DType::kF16, "float16"});
  }
  // Compiled but unknown to this build: named so the skip says so (KVDIFF_AVX512=OFF).
  if (cases.empty() || cases.front().path != "avx512") {
    cases.insert(cases.begin(), {"avx512", DType::kF32, "float32"});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Paths, KernelPathTest, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.path + "_" + info.param.storage;
                         });

// Decode attention's two kernels on their own, over the shapes a model's few decode steps do not
// reach: 1..9 query heads per KV head (past one block of kScoreQueries), head widths with and
// without Dot's tail, and key counts on both sides of the vector width (blocks of keys folded
// together, then single rows); the weighted sums with padded weight rows, and run in two calls.
TEST(KernelPath, DecodeAttentionKernelsAreTheScalarPathsBitForBit) {
  RestoreAuto restore;
  for (const std::string& path : AvailableKernelPaths()) {
    if (path == "scalar") continue;
    for (int64_t d : {20, 32, 64, 96}) {
      for (int64_t n_rep : {1, 2, 3, 4, 5, 7, 9}) {
        for (int64_t visible : {1, 7, 8, 9, 15, 16, 17, 33, 50}) {
          SCOPED_TRACE(::testing::Message() << path << ": d " << d << ", " << n_rep << " queries, "
                                            << visible << " keys");
          const int64_t kv_dim = 3 * d, stride = visible + 5;  // a KV head of three; padded rows
          const uint32_t seed = static_cast<uint32_t>(d * 1000 + n_rep * 100 + visible);
          const std::vector<float> q = testing::RandomVector(n_rep * d, seed);
          const std::vector<float> keys = testing::RandomVector(visible * kv_dim, seed + 1);
          const std::vector<float> p = testing::RandomVector(n_rep * stride, seed + 2);
          const float* values = keys.data() + 2 * d;
          const auto run = [&](const std::string& name) {
            UseKernelPath(name);
            std::vector<float> scores(n_rep * stride, 0.0f), sums(n_rep * (d + 1), 0.0f);
            Kernels().attention_scores(q.data(), n_rep, keys.data() + d, kv_dim, visible, d, 0.125f,
                                       scores.data(), stride);
            Kernels().weighted_sums(p.data(), stride, n_rep, visible, values, kv_dim, d,
                                    sums.data(), d + 1, false);
            // The same chains run in two calls, the second continuing from the first's sums.
            const int64_t half = visible / 2;
            std::vector<float> split(n_rep * (d + 1), 0.0f);
            Kernels().weighted_sums(p.data(), stride, n_rep, half, values, kv_dim, d, split.data(),
                                    d + 1, false);
            Kernels().weighted_sums(p.data() + half, stride, n_rep, visible - half,
                                    values + half * kv_dim, kv_dim, d, split.data(), d + 1, true);
            EXPECT_EQ(std::memcmp(split.data(), sums.data(), sizeof(float) * sums.size()), 0)
                << name << ": the sums in two calls differ from one";
            scores.insert(scores.end(), sums.begin(), sums.end());
            return scores;
          };
          const std::vector<float> expected = run("scalar"), got = run(path);
          ASSERT_EQ(got.size(), expected.size());
          EXPECT_EQ(std::memcmp(got.data(), expected.data(), sizeof(float) * got.size()), 0);
        }
      }
    }
  }
}

TEST(KernelPath, ListsThePathsAndChoosesTheFirstAvailable) {
  RestoreAuto restore;
  const std::vector<std::string> compiled = CompiledKernelPaths();
  const std::vector<std::string> available = AvailableKernelPaths();
  std::printf("kernel paths compiled: %s; this CPU runs: %s\n", Join(compiled).c_str(),
              Join(available).c_str());
  ASSERT_FALSE(available.empty());
  EXPECT_EQ(compiled.back(), "scalar");
  EXPECT_EQ(available.back(), "scalar");
  UseKernelPath("auto");
  EXPECT_EQ(KernelPath(), available.front());
}

TEST(KernelPath, AnUnknownOrUnavailablePathIsAnInputError) {
  RestoreAuto restore;
  try {
    UseKernelPath("avx512bf16");
    FAIL() << "no throw";
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(), ("KVDIFF_KERNELS=avx512bf16: expected auto or one of this build's "
                            "kernel paths: " +
                            Join(CompiledKernelPaths()))
                               .c_str());
  }
  for (const std::string& path : CompiledKernelPaths()) {
    if (Available(path)) continue;
    try {
      UseKernelPath(path);
      FAIL() << "no throw for " << path;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("this CPU lacks the instructions"), std::string::npos)
          << e.what();
    }
  }
  // A refused choice keeps the path in use.
  UseKernelPath("scalar");
  EXPECT_THROW(UseKernelPath("sse9"), InputError);
  EXPECT_STREQ(KernelPath(), "scalar");
}

}  // namespace
}  // namespace kvdiff::impl
