// llama.cpp (engines/llama_cpp) through the plugin loader, against impl's uncached ForwardFull on
// the tiny preset: with an f32 KV cache and flash attention off it is held to the 1e-4 gate cached
// in chunks, after truncate, after fork; the other cache types are measured and printed.
// Self-consistency is not enough here: a GGUF with unpermuted q/k rows agrees with itself cached
// and uncached while missing impl by 8-19, so every check compares against impl.
// append_batch (ABI 2) is held both to the same items appended alone through the same engine and
// to impl; its test-only faults (fault=NAME) prove the comparison catches batching bugs.
#include <dlfcn.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "format/gguf.h"
#include "format/llama2c.h"
#include "format/model_files.h"
#include "impl/model.h"
#include "kvdiff/engine.h"
#include "plugin_host/plugin_loader.h"
#include "tests/engines/conformance.h"
#include "tests/test_support.h"

namespace kvdiff::engines {
namespace {

using ::kvdiff::engines::conformance::BatchRun;
using ::kvdiff::engines::conformance::BatchTestItem;
using ::kvdiff::engines::conformance::Conversation;
using ::kvdiff::engines::conformance::RowsDiff;
using ::kvdiff::testing::MaxAbsDiff;
using ::testing::HasSubstr;

// The project's gate: llama.cpp with an f32 cache and flash attention off is within ~5e-6 of a
// float64 reference on tiny (summation order only).
constexpr float kTolerance = 1e-4f;
constexpr const char* kExact = "kv=f32,flash_attn=off";

class LlamaCppEngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    // Conversions go to this test's folder, not the user's cache.
    setenv("KVDIFF_GGUF_CACHE", (dir_->path() / "gguf-cache").c_str(), 1);
    format::SaveModel(dir_->path() / "tiny",
                      format::MakeRandomModel(format::PresetConfig("tiny"), 3),
                      format::DType::kF32);
    model_ = new impl::Model(impl::Model::Load(dir_->path() / "tiny", 1));
    // tiny's head_dim 16 is below q8_0's block of 32, which llama.cpp refuses for the cache: a
    // head_dim 32 variant carries the q8_0 figure.
    format::LlamaConfig c = format::PresetConfig("tiny");
    c.hidden_size = 128;
    c.head_dim = 32;
    format::SaveModel(dir_->path() / "tiny-hd32", format::MakeRandomModel(c, 3),
                      format::DType::kF32);
    model_hd32_ = new impl::Model(impl::Model::Load(dir_->path() / "tiny-hd32", 1));
    plugin_ = new Plugin(Plugin::Load(KVDIFF_LLAMACPP_ENGINE));
  }
  static void TearDownTestSuite() {
    delete plugin_;
    delete model_;
    delete model_hd32_;
    delete dir_;
  }
  static Engine Open(const std::string& options = kExact) {
    return plugin_->Open(dir_->path() / "tiny", options);
  }
  static Logits Oracle(const Tokens& history, int64_t rows) {
    return model_->ForwardFull(history).bottomRows(rows);
  }
  static Tokens Range(int first, int n) {
    Tokens t;
    for (int i = 0; i < n; ++i) t.push_back((first + 37 * i) % 256);
    return t;
  }
  // Max |llama.cpp - impl| over a chunked prefill of 40 tokens and 8 decode steps.
  static float ChunkedMaxDiff(const std::string& options, const std::string& model = "tiny") {
    const impl::Model& oracle = model == "tiny" ? *model_ : *model_hd32_;
    Session s = plugin_->Open(dir_->path() / model, options).NewSession();
    Tokens history;
    float worst = 0;
    for (int n : {13, 1, 26, 1, 1, 1, 1, 1, 1, 1, 1}) {
      const Tokens chunk = Range(static_cast<int>(history.size()) * 7 + 1, n);
      history.insert(history.end(), chunk.begin(), chunk.end());
      worst =
          std::max(worst, MaxAbsDiff(s.Append(chunk), oracle.ForwardFull(history).bottomRows(n)));
    }
    return worst;
  }

  // ---- append_batch ----

  static void Prefill(Conversation& c, const Tokens& tokens) {
    c.session.Append(tokens);
    c.history.insert(c.history.end(), tokens.begin(), tokens.end());
  }
  static BatchRun BatchVsAlone(const Engine& engine, std::vector<BatchTestItem> items) {
    return conformance::BatchVsAlone(engine, *model_, std::move(items));
  }
  // Six conversations at lengths 10, 3, 0, 6, 6 (twins: a fork) and 5, in one batch of prefill and
  // decode items with all, last-only and no output rows, then one decode step for each.
  static BatchRun MixedBatch(const std::string& options) {
    const Engine engine = Open(options);
    std::vector<Conversation> c;
    c.reserve(6);
    for (int i = 0; i < 4; ++i) c.push_back({engine.NewSession(), {}});
    Prefill(c[0], Range(1, 10));
    Prefill(c[1], Range(2, 3));
    Prefill(c[3], Range(4, 6));                        // c[2] stays empty
    c.push_back({c[3].session.Fork(), c[3].history});  // c[4]: c[3]'s twin
    c.push_back({engine.NewSession(), {}});
    Prefill(c[5], Range(5, 5));
    const Tokens twin_tokens = Range(50, 4);
    BatchRun run = BatchVsAlone(engine, {{&c[0], {99}, {}},
                                         {&c[1], Range(7, 7), {0, 0, 0, 0, 0, 0, 1}},
                                         {&c[2], Range(8, 12), {}},
                                         {&c[3], twin_tokens, {}},
                                         {&c[4], twin_tokens, {}},
                                         {&c[5], Range(9, 5), std::vector<bool>(5, false)}});
    const float twins = RowsDiff(run.rows[3], run.rows[4], "its twin's");
    std::cout << "figure: llama.cpp batch " << options << ": twins differ by " << twins << "\n";
    EXPECT_LE(twins, kTolerance);
    std::vector<BatchTestItem> step;
    for (size_t i = 0; i < c.size(); ++i) step.push_back({&c[i], {static_cast<Token>(i * 31)}, {}});
    const BatchRun decode = BatchVsAlone(engine, step);
    run.vs_alone = std::max(run.vs_alone, decode.vs_alone);
    run.vs_impl = std::max(run.vs_impl, decode.vs_impl);
    return run;
  }

  static testing::TempDir* dir_;
  static impl::Model* model_;
  static impl::Model* model_hd32_;
  static Plugin* plugin_;
};
testing::TempDir* LlamaCppEngineTest::dir_ = nullptr;
impl::Model* LlamaCppEngineTest::model_ = nullptr;
impl::Model* LlamaCppEngineTest::model_hd32_ = nullptr;
Plugin* LlamaCppEngineTest::plugin_ = nullptr;

TEST_F(LlamaCppEngineTest, InfoReportsCacheDtypeAndSizes) {
  const Engine engine = Open("kv=f16,ubatch=16,max_length=64,sessions=2");
  const EngineInfo& info = engine.Info();
  EXPECT_EQ(info.name, "llama.cpp");
  EXPECT_THAT(info.version, HasSubstr("node-llama-cpp 3.22.1"));
  EXPECT_EQ(info.vocab_size, 256);
  EXPECT_EQ(info.max_length, 64);
  EXPECT_EQ(info.cache_dtype, "f16");
  ASSERT_FALSE(info.sizes.empty());
  EXPECT_EQ(info.sizes[0], (std::pair<std::string, int64_t>("n_ubatch", 16)));
  // n_batch defaults to max_length x sessions: every session's whole room fits one batched call.
  EXPECT_EQ(info.sizes[1], (std::pair<std::string, int64_t>("n_batch", 128)));
  const EngineInfo small = Open("ubatch=1,batch=70,max_length=64,sessions=2").Info();
  EXPECT_EQ(small.sizes[0], (std::pair<std::string, int64_t>("n_ubatch", 1)));
  EXPECT_EQ(small.sizes[1], (std::pair<std::string, int64_t>("n_batch", 70)));
}

TEST_F(LlamaCppEngineTest, PrefillN24F32MatchesImpl) {
  Session s = Open().NewSession();
  const Tokens t = Range(5, 24);
  EXPECT_LE(MaxAbsDiff(s.Append(t), Oracle(t, 24)), kTolerance);
}

TEST_F(LlamaCppEngineTest, ChunkedPrefillAndDecodeF32MatchesImpl) {
  const float diff = ChunkedMaxDiff(kExact);
  std::cout << "figure: llama.cpp kv=f32 flash_attn=off vs impl, chunked 40+8: max|diff| " << diff
            << "\n";
  EXPECT_LE(diff, kTolerance);
}

TEST_F(LlamaCppEngineTest, AppendLongerThanUbatch4RunsInPassesAndMatchesImpl) {
  Session s = Open(std::string(kExact) + ",ubatch=4").NewSession();
  const Tokens t = Range(3, 11);
  EXPECT_LE(MaxAbsDiff(s.Append(t), Oracle(t, 11)), kTolerance);
}

TEST_F(LlamaCppEngineTest, TruncateTo6Of12ThenAppend4MatchesImpl) {
  Session s = Open().NewSession();
  Tokens history = Range(1, 12);
  s.Append(history);
  s.Truncate(6);
  EXPECT_EQ(s.Length(), 6);
  history.resize(6);
  const Tokens more = Range(200, 4);
  history.insert(history.end(), more.begin(), more.end());
  EXPECT_LE(MaxAbsDiff(s.Append(more), Oracle(history, 4)), kTolerance);
  EXPECT_THROW(s.Truncate(11), InputError);
  EXPECT_EQ(s.Length(), 10);
}

TEST_F(LlamaCppEngineTest, ForkAt8EvolvesIndependently) {
  const Engine engine = Open();
  Session a = engine.NewSession();
  const Tokens prefix = Range(9, 8);
  a.Append(prefix);
  Session b = a.Fork();
  Tokens ha = prefix, hb = prefix;
  const Tokens ta = Range(40, 3), tb = Range(90, 5);
  ha.insert(ha.end(), ta.begin(), ta.end());
  hb.insert(hb.end(), tb.begin(), tb.end());
  EXPECT_LE(MaxAbsDiff(a.Append(ta), Oracle(ha, 3)), kTolerance);
  EXPECT_LE(MaxAbsDiff(b.Append(tb), Oracle(hb, 5)), kTolerance);
  // Truncating the parent below the fork point must not touch the fork's shared prefix.
  a.Truncate(2);
  { Session gone = std::move(a); }
  hb.push_back(17);
  EXPECT_LE(MaxAbsDiff(b.Append({17}), Oracle(hb, 1)), kTolerance);
}

TEST_F(LlamaCppEngineTest, ResetAfter10StartsANewConversation) {
  Session s = Open().NewSession();
  s.Append(Range(2, 10));
  s.Reset();
  EXPECT_EQ(s.Length(), 0);
  const Tokens t = Range(77, 5);
  EXPECT_LE(MaxAbsDiff(s.Append(t), Oracle(t, 5)), kTolerance);
}

TEST_F(LlamaCppEngineTest, GgufFileLoadsDirectly) {
  format::ConvertHfToGguf(dir_->path() / "tiny", dir_->path() / "tiny.gguf", format::DType::kF32);
  Session s = plugin_->Open(dir_->path() / "tiny.gguf", kExact).NewSession();
  const Tokens t = Range(11, 9);
  EXPECT_LE(MaxAbsDiff(s.Append(t), Oracle(t, 9)), kTolerance);
}

TEST_F(LlamaCppEngineTest, ErrorsAreInputErrorsAndChangeNothing) {
  const Engine engine = Open(std::string(kExact) + ",sessions=2,max_length=16");
  Session s = engine.NewSession();
  s.Append(Range(1, 4));
  EXPECT_THROW(s.Append({3, 256}), InputError);
  EXPECT_THROW(s.Append(Range(1, 13)), InputError);  // 4 + 13 > max_length 16
  EXPECT_EQ(s.Length(), 4);
  Session f = s.Fork();
  try {
    s.Fork();
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(), HasSubstr("all 2 sequences are in use"));
  }
  EXPECT_THROW(Open("kv=q4"), InputError);
  EXPECT_THROW(Open("kv=q8_0,flash_attn=off"), InputError);
  try {
    Open("kv=q8_0,flash_attn=on");  // tiny's head_dim 16
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(), HasSubstr("head_dim 16 is not a multiple of q8_0's block of 32"));
  }
  EXPECT_THROW(Open("bogus=1"), InputError);
  EXPECT_THROW(Open("max_length=100000"), InputError);
  EXPECT_THROW(plugin_->Open(dir_->path() / "nothing-here"), InputError);
}

TEST_F(LlamaCppEngineTest, RandomWalkSeeds1To3Steps150MaxLength64MatchesImpl) {
  const Engine engine = Open(std::string(kExact) + ",max_length=64,sessions=4,ubatch=8");
  for (uint64_t seed : {1, 2, 3}) {
    const float worst = conformance::RandomWalkMaxDiff(engine, *model_, seed, 150, 64);
    std::cout << "figure: llama.cpp random walk seed " << seed << ": max|diff| " << worst << "\n";
  }
}

// ---- append_batch (ABI 2) ----

TEST_F(LlamaCppEngineTest, BatchOfPrefillsDecodesAndTwinsEqualsEachItemAlone) {
  EXPECT_EQ(Open().Info().abi_version, 3u);
  const BatchRun run = MixedBatch(kExact);
  std::cout << "figure: llama.cpp batch " << kExact << ": vs alone " << run.vs_alone << ", vs impl "
            << run.vs_impl << "\n";
  EXPECT_LE(run.vs_alone, kTolerance);
  EXPECT_LE(run.vs_impl, kTolerance);
}

// n_ubatch 1, 2 and 7: llama.cpp splits the 33-token call into micro-batches, some across items.
TEST_F(LlamaCppEngineTest, BatchSplitIntoMicroBatchesOfUbatch1To7EqualsEachItemAlone) {
  for (const char* ubatch : {",ubatch=1", ",ubatch=2", ",ubatch=7"}) {
    const std::string options = std::string(kExact) + ubatch;
    const BatchRun run = MixedBatch(options);
    std::cout << "figure: llama.cpp batch " << options << ": vs alone " << run.vs_alone
              << ", vs impl " << run.vs_impl << "\n";
    EXPECT_LE(run.vs_alone, kTolerance) << ubatch;
    EXPECT_LE(run.vs_impl, kTolerance) << ubatch;
  }
}

// Forks share cells and truncates free some: the batch's tokens land in scattered free cells.
TEST_F(LlamaCppEngineTest, BatchAfterForksAndTruncatesEqualsEachItemAlone) {
  const Engine engine = Open(std::string(kExact) + ",max_length=48,sessions=4,ubatch=3");
  std::vector<Conversation> c;
  c.reserve(4);
  c.push_back({engine.NewSession(), {}});
  Prefill(c[0], Range(3, 20));
  c.push_back({c[0].session.Fork(), c[0].history});
  c[0].session.Truncate(5);
  c[0].history.resize(5);
  c[1].session.Truncate(12);  // positions 12..19 were the fork's alone: freed
  c[1].history.resize(12);
  Prefill(c[0], Range(60, 3));
  c.push_back({engine.NewSession(), {}});
  Prefill(c[2], Range(70, 9));
  c[2].session.Truncate(2);
  c[2].history.resize(2);
  c.push_back({engine.NewSession(), {}});
  BatchRun run = BatchVsAlone(engine, {{&c[0], Range(80, 4), {}},
                                       {&c[1], {7}, {}},
                                       {&c[2], Range(90, 6), {0, 0, 0, 0, 0, 1}},
                                       {&c[3], Range(100, 5), {}}});
  // No row flagged in the whole call: the cache is still written, as the next call shows.
  const std::vector<bool> none(3, false);
  BatchVsAlone(engine, {{&c[3], Range(110, 3), none}, {&c[1], Range(120, 3), none}});
  const BatchRun again = BatchVsAlone(engine, {{&c[3], {1, 2}, {}}, {&c[1], Range(5, 9), {}}});
  std::cout << "figure: llama.cpp batch after forks and truncates: vs alone "
            << std::max(run.vs_alone, again.vs_alone) << ", vs impl "
            << std::max(run.vs_impl, again.vs_impl) << "\n";
  EXPECT_LE(std::max(run.vs_alone, again.vs_alone), kTolerance);
  EXPECT_LE(std::max(run.vs_impl, again.vs_impl), kTolerance);
}

// Refused calls change nothing: neither the lengths nor the cells (the next batch still matches).
TEST_F(LlamaCppEngineTest, BatchRefusalsAreInputErrorsAndChangeNothing) {
  const Engine engine = Open(std::string(kExact) + ",max_length=16,sessions=2,batch=20,ubatch=1");
  std::vector<Conversation> c;
  c.reserve(2);
  c.push_back({engine.NewSession(), {}});
  c.push_back({engine.NewSession(), {}});
  Prefill(c[0], Range(1, 4));
  Prefill(c[1], Range(2, 6));
  const std::pair<std::vector<BatchItem>, const char*> refused[] = {
      {{{&c[0].session, {1, 2}, {}}, {&c[0].session, {3}, {}}}, "name the same session"},
      {{{&c[0].session, {1, 2}, {}}, {&c[1].session, Range(3, 11), {}}},
       "batch item 1: session holds 6 positions of max_length 16: 11 more tokens do not fit"},
      {{{&c[0].session, Range(4, 12), {}}, {&c[1].session, Range(5, 10), {}}},
       "append_batch of 22 tokens in 2 items: more than n_batch 20"},
      {{{&c[0].session, {1}, {}}, {&c[1].session, {2, 256}, {}}},
       "batch item 1: token id 256 at index 1 is out of range for vocab_size 256"},
  };
  for (const auto& [items, message] : refused) {
    try {
      engine.AppendBatch(items);
      ADD_FAILURE() << "expected InputError: " << message;
    } catch (const InputError& e) {
      EXPECT_THAT(e.what(), HasSubstr(message));
    }
    EXPECT_EQ(c[0].session.Length(), 4) << message;
    EXPECT_EQ(c[1].session.Length(), 6) << message;
  }
  const BatchRun run = BatchVsAlone(engine, {{&c[0], Range(6, 3), {}}, {&c[1], Range(7, 2), {}}});
  EXPECT_LE(run.vs_alone, kTolerance);
  EXPECT_LE(run.vs_impl, kTolerance);
  for (const char* bad : {"max_length=16,sessions=2,batch=8", "max_length=16,sessions=2,batch=33",
                          "max_length=16,sessions=2,ubatch=33", "fault=bogus"}) {
    EXPECT_THROW(Open(bad), InputError) << bad;
  }
}

// The loader refuses a duplicate session or a short buffer before the plugin is called; the
// plugin's own refusals are reached through its raw table.
TEST_F(LlamaCppEngineTest, RawAppendBatchRefusesDuplicatesAndShortBuffersChangingNothing) {
  void* lib = dlopen(KVDIFF_LLAMACPP_ENGINE, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(lib, nullptr) << dlerror();
  const auto entry =
      reinterpret_cast<kvdiff_engine_entry_fn>(dlsym(lib, KVDIFF_ENGINE_ENTRY_SYMBOL));
  const kvdiff_engine_api* api = entry();
  ASSERT_EQ(api->abi_version, 3u);
  kvdiff_engine* e = nullptr;
  ASSERT_EQ(api->open((dir_->path() / "tiny").c_str(), kExact, &e), KVDIFF_OK);
  kvdiff_session *a = nullptr, *b = nullptr;
  ASSERT_EQ(api->session_new(e, &a), KVDIFF_OK);
  ASSERT_EQ(api->session_new(e, &b), KVDIFF_OK);
  const int32_t tokens[3] = {1, 2, 3};
  const uint8_t last[3] = {0, 0, 1};
  std::vector<float> out(4 * 256);
  const kvdiff_batch_item twice[2] = {{a, tokens, 3, nullptr}, {a, tokens, 1, nullptr}};
  EXPECT_EQ(api->append_batch(e, twice, 2, out.data(), 4 * 256), KVDIFF_INVALID_INPUT);
  EXPECT_THAT(api->engine_error(e), HasSubstr("batch items 0 and 1 name the same session"));
  const kvdiff_batch_item two[2] = {{a, tokens, 3, nullptr}, {b, tokens, 3, last}};
  EXPECT_EQ(api->append_batch(e, two, 2, out.data(), 4 * 256 - 1), KVDIFF_INVALID_INPUT);
  EXPECT_THAT(api->engine_error(e), HasSubstr("logits buffer holds 1023 floats, 4 flagged rows"));
  EXPECT_EQ(api->append_batch(e, two, 0, out.data(), 4 * 256), KVDIFF_INVALID_INPUT);
  EXPECT_EQ(api->length(a), 0);
  EXPECT_EQ(api->length(b), 0);
  EXPECT_EQ(api->append_batch(e, two, 2, out.data(), 4 * 256), KVDIFF_OK) << api->engine_error(e);
  EXPECT_EQ(api->length(b), 3);
  api->session_free(a);
  api->session_free(b);
  api->close(e);
  dlclose(lib);
}

// Proof of power: every fault of the batched path moves the logits far beyond the tolerance on
// one of two batches over three conversations of length 6 (items of 1, 5 and 2 tokens; a decode
// step of one token each), while the healthy engine agrees with the items appended alone on both.
// A batch llama.cpp itself refuses (its positions checks) is printed, not counted.
TEST_F(LlamaCppEngineTest, BatchFaultsAreCaughtByComparingWithItemsAlone) {
  const std::pair<const char*, std::vector<int>> batches[] = {{"items of 1+5+2", {1, 5, 2}},
                                                              {"a decode step", {1, 1, 1}}};
  for (const char* fault :
       {"none", "batch-shared-positions", "batch-rows-swapped", "batch-one-seq"}) {
    float worst = 0;
    for (const auto& [name, sizes] : batches) {
      const Engine engine = Open(std::string(kExact) + ",ubatch=4,fault=" + fault);
      std::vector<Conversation> c;
      std::vector<BatchTestItem> items;
      c.reserve(sizes.size());
      for (size_t i = 0; i < sizes.size(); ++i) {
        c.push_back({engine.NewSession(), {}});
        Prefill(c[i], Range(10 * i + 1, 6));
        items.push_back({&c[i], Range(40 * i + 3, sizes[i]), {}});
      }
      try {
        const BatchRun run = BatchVsAlone(engine, items);
        std::cout << "figure: llama.cpp batch fault=" << fault << ", " << name << ": vs alone "
                  << run.vs_alone << ", vs impl " << run.vs_impl << "\n";
        worst = std::max(worst, run.vs_alone);
      } catch (const EngineError& e) {
        std::cout << "figure: llama.cpp batch fault=" << fault << ", " << name
                  << ": refused by llama.cpp: " << e.what() << "\n";
        EXPECT_NE(std::string(fault), "none") << e.what();
      }
    }
    if (std::string(fault) == "none") {
      EXPECT_LE(worst, kTolerance);
    } else {
      EXPECT_GT(worst, 1e-3f) << fault << " was not caught";
    }
  }
}

// Proof of power: a GGUF whose q/k rows were not permuted to the interleaved RoPE layout agrees
// with itself cached and uncached, and only the comparison with impl catches it.
TEST_F(LlamaCppEngineTest, UnpermutedQkRowsAreCaughtByImplNotBySelfConsistency) {
  format::ConvertHfToGguf(dir_->path() / "tiny", dir_->path() / "wrong.gguf", format::DType::kF32,
                          /*permute_qk=*/false);
  const Engine engine = plugin_->Open(dir_->path() / "wrong.gguf", kExact);
  const Tokens t = Range(5, 24);
  Session whole = engine.NewSession(), chunked = engine.NewSession();
  const Logits all = whole.Append(t);
  chunked.Append(Tokens(t.begin(), t.begin() + 16));
  const Logits last = chunked.Append(Tokens(t.begin() + 16, t.end()));
  const float self = MaxAbsDiff(last, all.bottomRows(8));
  const float vs_impl = MaxAbsDiff(all, Oracle(t, 24));
  std::cout << "figure: unpermuted q/k: cached vs uncached " << self << ", vs impl " << vs_impl
            << "\n";
  EXPECT_LE(self, kTolerance);
  EXPECT_GT(vs_impl, 100 * kTolerance);
}

// A real trained model with its SentencePiece vocabulary in the GGUF (llama.cpp then loads an SPM
// vocab, not "none"): stories260K, head_dim 8, 4 KV heads for 8 query heads.
TEST(LlamaCppStoriesTest, Stories260KMatchesImplCachedInChunks) {
  KVDIFF_REQUIRE_SHARED_DATA(data);
  testing::TempDir dir;
  setenv("KVDIFF_GGUF_CACHE", (dir.path() / "gguf-cache").c_str(), 1);
  format::ConvertLlama2c(data / "stories260K" / "stories260K.bin",
                         data / "stories260K" / "tok512.bin", dir / "hf");
  const impl::Model model = impl::Model::Load(dir / "hf", 1);
  Session s = Plugin::Load(KVDIFF_LLAMACPP_ENGINE).Open(dir / "hf", kExact).NewSession();
  Tokens history;
  float worst = 0;
  for (int n : {9, 1, 20, 1, 1, 1}) {
    for (int i = 0; i < n; ++i)
      history.push_back(static_cast<Token>((history.size() * 53 + 7) % 512));
    const Logits rows = s.Append(Tokens(history.end() - n, history.end()));
    worst = std::max(worst, MaxAbsDiff(rows, model.ForwardFull(history).bottomRows(n)));
  }
  std::cout << "figure: llama.cpp stories260K kv=f32 flash_attn=off vs impl: max|diff| " << worst
            << "\n";
  EXPECT_LE(worst, kTolerance);
}

// Not gated: measured and printed, so docs/llama-cpp.md's figures come from a run.
TEST_F(LlamaCppEngineTest, MeasuredF16Q8AndFlashAttentionFigures) {
  const std::pair<const char*, const char*> runs[] = {
      {"tiny", "kv=f16,flash_attn=off"},      {"tiny", "kv=f32,flash_attn=on"},
      {"tiny", "kv=f16,flash_attn=on"},       {"tiny-hd32", "kv=f32,flash_attn=off"},
      {"tiny-hd32", "kv=f16,flash_attn=off"}, {"tiny-hd32", "kv=f32,flash_attn=on"},
      {"tiny-hd32", "kv=q8_0,flash_attn=on"},
  };
  for (const auto& [model, options] : runs) {
    const float diff = ChunkedMaxDiff(options, model);
    std::cout << "figure: llama.cpp " << model << " " << options
              << " vs impl, chunked 40+8: max|diff| " << diff << "\n";
    RecordProperty(std::string(model) + " " + options, std::to_string(diff));
    EXPECT_TRUE(std::isfinite(diff));
    EXPECT_LT(diff, 1.0f) << "far beyond any cache rounding: a wrong cache, not a lossy one";
  }
}

}  // namespace
}  // namespace kvdiff::engines
