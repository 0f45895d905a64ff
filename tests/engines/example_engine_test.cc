// The example engine (engines/example, plain C) through the plugin loader, against impl's uncached
// ForwardFull: every op, every error path, fork independence, reset, determinism; and the loader's
// refusals. Each case names its parameters in the test name so `--gtest_filter` reruns it alone.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <iostream>
#include <string>

#include "format/model_files.h"
#include "impl/model.h"
#include "kvdiff/engine.h"
#include "plugin_host/plugin_loader.h"
#include "tests/engines/conformance.h"
#include "tests/test_support.h"

namespace kvdiff::engines {
namespace {

using ::kvdiff::testing::MaxAbsDiff;
using ::testing::HasSubstr;

// The project's gate. Both sides compute in float32 and differ only in summation order (the
// example sums one token at a time in plain loops, impl in Eigen tiles): ~1e-6 on tiny.
constexpr float kTolerance = 1e-4f;

class ExampleEngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    format::SaveModel(dir_->path() / "tiny",
                      format::MakeRandomModel(format::PresetConfig("tiny"), 3),
                      format::DType::kF32);
    model_ = new impl::Model(impl::Model::Load(dir_->path() / "tiny", 1));
  }
  static void TearDownTestSuite() {
    delete model_;
    delete dir_;
  }
  static std::filesystem::path ModelDir() { return dir_->path() / "tiny"; }
  static Engine OpenExample(const std::string& options = "") {
    return Plugin::Load(KVDIFF_EXAMPLE_ENGINE).Open(ModelDir(), options);
  }
  // impl's uncached logits of the last `rows` positions of `history`.
  static Logits Oracle(const Tokens& history, int64_t rows) {
    return model_->ForwardFull(history).bottomRows(rows);
  }
  static Tokens Range(int first, int n) {
    Tokens t;
    for (int i = 0; i < n; ++i) t.push_back((first + 37 * i) % 256);
    return t;
  }

  static testing::TempDir* dir_;
  static impl::Model* model_;
};
testing::TempDir* ExampleEngineTest::dir_ = nullptr;
impl::Model* ExampleEngineTest::model_ = nullptr;

TEST_F(ExampleEngineTest, InfoNamesTheEngineAndItsCache) {
  const Engine engine = OpenExample();
  const EngineInfo& info = engine.Info();
  EXPECT_EQ(info.name, "example");
  EXPECT_EQ(info.abi_version, KVDIFF_ENGINE_ABI_VERSION);
  EXPECT_EQ(info.vocab_size, 256);
  EXPECT_EQ(info.max_length, 512);
  EXPECT_EQ(info.cache_dtype, "f32");
  EXPECT_TRUE(info.sizes.empty());
  EXPECT_EQ(OpenExample("max_length=64").Info().max_length, 64);
}

TEST_F(ExampleEngineTest, PrefillN24MatchesImpl) {
  Session s = OpenExample().NewSession();
  const Tokens tokens = Range(5, 24);
  EXPECT_LE(MaxAbsDiff(s.Append(tokens), Oracle(tokens, 24)), kTolerance);
  EXPECT_EQ(s.Length(), 24);
}

TEST_F(ExampleEngineTest, ChunkedPrefillChunks7_1_9_Decode5MatchesImpl) {
  Session s = OpenExample().NewSession();
  Tokens history;
  float worst = 0;
  for (int n : {7, 1, 9, 1, 1, 1, 1, 1}) {
    const Tokens chunk = Range(static_cast<int>(history.size()) * 11 + 3, n);
    history.insert(history.end(), chunk.begin(), chunk.end());
    const float diff = MaxAbsDiff(s.Append(chunk), Oracle(history, n));
    EXPECT_LE(diff, kTolerance) << "chunk of " << n << " at position " << history.size() - n;
    worst = std::max(worst, diff);
  }
  std::cout << "figure: example vs impl, chunks 7+1+9 then 5 decodes: max|diff| " << worst << "\n";
  EXPECT_EQ(s.Length(), static_cast<int64_t>(history.size()));
}

TEST_F(ExampleEngineTest, TruncateTo6Of12ThenAppend4MatchesImpl) {
  Session s = OpenExample().NewSession();
  Tokens history = Range(1, 12);
  s.Append(history);
  s.Truncate(6);
  EXPECT_EQ(s.Length(), 6);
  history.resize(6);
  const Tokens more = Range(200, 4);
  history.insert(history.end(), more.begin(), more.end());
  EXPECT_LE(MaxAbsDiff(s.Append(more), Oracle(history, 4)), kTolerance);
  s.Truncate(0);
  EXPECT_EQ(s.Length(), 0);
  EXPECT_LE(MaxAbsDiff(s.Append(more), Oracle(more, 4)), kTolerance);
}

TEST_F(ExampleEngineTest, ForkAt8EvolvesIndependently) {
  const Engine engine = OpenExample();
  Session a = engine.NewSession();
  const Tokens prefix = Range(9, 8);
  a.Append(prefix);
  Session b = a.Fork();
  EXPECT_EQ(b.Length(), 8);
  Tokens ha = prefix, hb = prefix;
  const Tokens ta = Range(40, 3), tb = Range(90, 5);
  ha.insert(ha.end(), ta.begin(), ta.end());
  hb.insert(hb.end(), tb.begin(), tb.end());
  // Interleave the two so a shared buffer would show.
  const Logits la = a.Append(ta);
  const Logits lb = b.Append(tb);
  EXPECT_LE(MaxAbsDiff(la, Oracle(ha, 3)), kTolerance);
  EXPECT_LE(MaxAbsDiff(lb, Oracle(hb, 5)), kTolerance);
  EXPECT_EQ(a.Length(), 11);
  EXPECT_EQ(b.Length(), 13);
  // The fork outlives its parent.
  { Session gone = std::move(a); }
  const Tokens next = {17};
  hb.push_back(17);
  EXPECT_LE(MaxAbsDiff(b.Append(next), Oracle(hb, 1)), kTolerance);
}

TEST_F(ExampleEngineTest, ForkOfEmptySessionWorks) {
  Session a = OpenExample().NewSession();
  Session b = a.Fork();
  EXPECT_EQ(b.Length(), 0);
  const Tokens t = Range(3, 4);
  EXPECT_LE(MaxAbsDiff(b.Append(t), Oracle(t, 4)), kTolerance);
}

TEST_F(ExampleEngineTest, ResetAfter10StartsANewConversation) {
  Session s = OpenExample().NewSession();
  s.Append(Range(2, 10));
  s.Reset();
  EXPECT_EQ(s.Length(), 0);
  const Tokens t = Range(77, 5);
  EXPECT_LE(MaxAbsDiff(s.Append(t), Oracle(t, 5)), kTolerance);
}

TEST_F(ExampleEngineTest, SameInputsGiveBitIdenticalLogits) {
  const Engine engine = OpenExample();
  Session a = engine.NewSession(), b = engine.NewSession();
  const Tokens t = Range(8, 16);
  const Logits la = a.Append(t), lb = b.Append(t);
  EXPECT_EQ(std::memcmp(la.data(), lb.data(), la.size() * sizeof(float)), 0);
  // And an engine opened separately (fresh weights and buffers).
  const Logits lc = OpenExample().NewSession().Append(t);
  EXPECT_EQ(std::memcmp(la.data(), lc.data(), la.size() * sizeof(float)), 0);
}

TEST_F(ExampleEngineTest, RandomWalkSeeds1To3Steps150MaxLength64MatchesImpl) {
  const Engine engine = OpenExample("max_length=64");
  for (uint64_t seed : {1, 2, 3}) {
    const float worst = conformance::RandomWalkMaxDiff(engine, *model_, seed, 150, 64);
    std::cout << "figure: example random walk seed " << seed << ": max|diff| " << worst << "\n";
  }
}

// ---- errors: the message names the argument and both numbers; the session is unchanged ----

TEST_F(ExampleEngineTest, TokenOutOfRangeIsInputErrorAndChangesNothing) {
  Session s = OpenExample().NewSession();
  const Tokens prefix = Range(4, 3);
  s.Append(prefix);
  try {
    s.Append({5, 6, 256});
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(),
                HasSubstr("example: token id 256 at index 2 is out of range for vocab_size 256"));
  }
  EXPECT_THROW(s.Append({-1}), InputError);
  EXPECT_EQ(s.Length(), 3);
  Tokens history = prefix;
  history.push_back(9);
  EXPECT_LE(MaxAbsDiff(s.Append({9}), Oracle(history, 1)), kTolerance);
}

TEST_F(ExampleEngineTest, EmptyAppendIsInputError) {
  Session s = OpenExample().NewSession();
  EXPECT_THROW(s.Append({}), InputError);
  EXPECT_EQ(s.Length(), 0);
}

TEST_F(ExampleEngineTest, TruncateBeyondLengthIsInputError) {
  Session s = OpenExample().NewSession();
  s.Append(Range(1, 5));
  try {
    s.Truncate(6);
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(), HasSubstr("truncate to 6: expected 0 <= length <= 5"));
  }
  EXPECT_THROW(s.Truncate(-1), InputError);
  EXPECT_EQ(s.Length(), 5);
}

TEST_F(ExampleEngineTest, AppendPastMaxLength8IsInputError) {
  Session s = OpenExample("max_length=8").NewSession();
  s.Append(Range(1, 6));
  try {
    s.Append(Range(1, 3));
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(),
                HasSubstr("session holds 6 positions of max_length 8: 3 more tokens do not fit"));
  }
  EXPECT_EQ(s.Length(), 6);
  s.Append(Range(1, 2));
  EXPECT_EQ(s.Length(), 8);
}

TEST_F(ExampleEngineTest, BadOptionsAreInputErrors) {
  const Plugin plugin = Plugin::Load(KVDIFF_EXAMPLE_ENGINE);
  try {
    plugin.Open(ModelDir(), "kv=f16");
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(), HasSubstr("option kv=f16: expected f32 or q8_0"));
  }
  try {
    plugin.Open(ModelDir(), "cache=f16");
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(), HasSubstr("unknown option 'cache' (the example engine knows: "
                                    "max_length, kv, fault)"));
  }
  EXPECT_THROW(plugin.Open(ModelDir(), "max_length=513"), InputError);
  EXPECT_THROW(plugin.Open(ModelDir(), "max_length=0"), InputError);
  EXPECT_THROW(plugin.Open(ModelDir(), "max_length"), InputError);
  EXPECT_NO_THROW(plugin.Open(ModelDir(), "max_length=16,\n"));
}

TEST_F(ExampleEngineTest, MissingOrWrongModelIsInputError) {
  const Plugin plugin = Plugin::Load(KVDIFF_EXAMPLE_ENGINE);
  testing::TempDir empty;
  try {
    plugin.Open(empty.path());
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(), HasSubstr("cannot read"));
    EXPECT_THAT(e.what(), HasSubstr("config.json"));
  }
  // A bfloat16 checkpoint: the template reads float32 only, and says so.
  format::SaveModel(empty.path() / "bf16", format::MakeRandomModel(format::PresetConfig("tiny"), 3),
                    format::DType::kBF16);
  try {
    plugin.Open(empty.path() / "bf16");
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(), HasSubstr("is BF16; the example engine reads F32 only"));
  }
}

// ---- the loader's refusals ----

TEST(PluginLoaderTest, AnotherAbiVersionIsRefusedWithBothNumbers) {
  try {
    Plugin::Load(KVDIFF_WRONG_ABI_ENGINE);
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(), HasSubstr("was built against kvdiff engine ABI version 999, this kvdiff "
                                    "speaks versions 1 to 3"));
  }
}

TEST(PluginLoaderTest, MissingFileIsInputError) {
  try {
    Plugin::Load("/nonexistent/libnothing.so");
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(), HasSubstr("cannot load engine plugin /nonexistent/libnothing.so"));
  }
}

TEST(PluginLoaderTest, LibraryWithoutEntryIsRefused) {
  // libm is a shared library that is certainly not a kvdiff engine.
  try {
    Plugin::Load("libm.so.6");
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(),
                HasSubstr("is not a kvdiff engine plugin: it exports no kvdiff_engine_entry"));
  }
}

TEST(PluginLoaderTest, PluginReportsNameAndVersion) {
  const Plugin plugin = Plugin::Load(KVDIFF_EXAMPLE_ENGINE);
  EXPECT_EQ(plugin.Name(), "example");
  EXPECT_EQ(plugin.Version(), "1.0");
}

}  // namespace
}  // namespace kvdiff::engines
