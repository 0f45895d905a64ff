// Batched calls (ABI 2's append_batch, issue 33). The example engine's ONE call gives, bit for bit,
// what the same items appended one at a time give, with output flags (every row, the last row
// only, no row), in process, isolated and through the plugin backend; a version-1 plugin's batch
// runs through Backend's default; the refusals come before anything runs and name the items; a
// child that crashes, hangs or lies about its reply during a batch is an EngineError, never a dead
// kvdiff. Each case names its parameters in the test name so `--gtest_filter` reruns it alone.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "format/model_files.h"
#include "harness/backend/registry.h"
#include "plugin_host/isolated_engine.h"
#include "plugin_host/plugin_loader.h"
#include "tests/test_support.h"

namespace kvdiff::engines {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

format::ModelWeights TinyWeights() {
  return format::MakeRandomModel(format::PresetConfig("tiny"), 3);
}

// The tiny model as a plugin reads it, written once per test process.
const std::filesystem::path& TinyModelDir() {
  static const testing::TempDir dir;  // removed when the process exits
  static const std::filesystem::path path = [] {
    format::SaveModel(dir / "tiny", TinyWeights(), format::DType::kF32);
    return dir / "tiny";
  }();
  return path;
}

Tokens Range(int first, int n) {
  Tokens t;
  for (int i = 0; i < n; ++i) t.push_back((first + 37 * i) % 256);
  return t;
}

// One conversation's part of a batch: what its session holds before, what the batch appends, and
// which of those rows come back (empty: every row).
struct Part {
  Tokens prefix, tokens;
  std::vector<bool> output;
};

// Three conversations at different positions: every row, the last row only, no row at all.
std::vector<Part> EveryLastNone() {
  return {{Range(5, 6), Range(40, 3), {}},
          {{}, Range(90, 4), {false, false, false, true}},
          {Range(7, 2), Range(200, 2), {false, false}}};
}

// The rows of `all` that `output` flags, in order.
Logits Flagged(const Logits& all, const std::vector<bool>& output) {
  if (output.empty()) return all;
  Logits kept(std::count(output.begin(), output.end(), true), all.cols());
  for (int64_t r = 0, k = 0; r < all.rows(); ++r) {
    if (output[r]) kept.row(k++) = all.row(r);
  }
  return kept;
}

// Bit-for-bit equality of every item's logits, each difference a failure naming the item.
void ExpectSameBits(const std::vector<Logits>& got, const std::vector<Logits>& want,
                    const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].rows(), want[i].rows()) << what << ", item " << i;
    ASSERT_EQ(got[i].cols(), want[i].cols()) << what << ", item " << i;
    if (got[i].size() == 0) continue;  // no rows asked for: data() may be null (memcmp's UB)
    EXPECT_EQ(std::memcmp(got[i].data(), want[i].data(), got[i].size() * sizeof(float)), 0)
        << what << ", item " << i << ": the batch's logits differ from one append at a time";
  }
}

// Fresh sessions of `engine` (engines::Engine or IsolatedEngine), each holding its part's prefix.
template <class EngineT>
auto SessionsWithPrefixes(const EngineT& engine, const std::vector<Part>& parts) {
  std::vector<decltype(engine.NewSession())> sessions;
  for (const Part& part : parts) {
    sessions.push_back(engine.NewSession());
    if (!part.prefix.empty()) sessions.back().Append(part.prefix);
  }
  return sessions;
}

// The oracle: each part appended on its own, then its flagged rows kept.
template <class EngineT>
std::vector<Logits> OneAtATime(const EngineT& engine, const std::vector<Part>& parts) {
  auto sessions = SessionsWithPrefixes(engine, parts);
  std::vector<Logits> out;
  for (size_t i = 0; i < parts.size(); ++i) {
    out.push_back(Flagged(sessions[i].Append(parts[i].tokens), parts[i].output));
  }
  return out;
}

// The parts in ONE AppendBatch call on `sessions`.
template <class EngineT, class SessionT>
std::vector<Logits> Batched(const EngineT& engine, std::vector<SessionT>& sessions,
                            const std::vector<Part>& parts) {
  std::vector<BatchItemOf<SessionT>> items;
  for (size_t i = 0; i < parts.size(); ++i) {
    items.push_back({&sessions[i], parts[i].tokens, parts[i].output});
  }
  return engine.AppendBatch(items);
}

// Both calls on one engine type: three parts, then a decode step of every session (a batch of
// one token each, every row), each equal to the same appends made one at a time.
template <class EngineT>
void ExpectBatchesEqualOneAtATime(const EngineT& engine) {
  const std::vector<Part> parts = EveryLastNone();
  auto sessions = SessionsWithPrefixes(engine, parts);
  ExpectSameBits(Batched(engine, sessions, parts), OneAtATime(engine, parts), "first batch");
  std::vector<Part> decode;
  for (size_t i = 0; i < parts.size(); ++i) {
    EXPECT_EQ(sessions[i].Length(),
              static_cast<int64_t>(parts[i].prefix.size() + parts[i].tokens.size()))
        << "item " << i;
    Tokens history = parts[i].prefix;
    history.insert(history.end(), parts[i].tokens.begin(), parts[i].tokens.end());
    decode.push_back({history, {static_cast<Token>(11 * i + 3)}, {}});
  }
  ExpectSameBits(Batched(engine, sessions, decode), OneAtATime(engine, decode), "decode batch");
}

// `call` throws InputError whose message holds `text`.
template <class Call>
void ExpectInputError(Call&& call, const std::string& text) {
  try {
    call();
    ADD_FAILURE() << "expected InputError with: " << text;
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(), HasSubstr(text));
  }
}

// `call` throws EngineError whose message holds every one of `texts`.
template <class Call>
void ExpectEngineError(Call&& call, const std::vector<std::string>& texts) {
  try {
    call();
    ADD_FAILURE() << "expected EngineError with: " << texts.front();
  } catch (const EngineError& e) {
    for (const std::string& text : texts) EXPECT_THAT(e.what(), HasSubstr(text));
  }
}

// Each batch is refused with an InputError whose message holds its text.
template <class Item, class EngineT>
void ExpectRefusals(const EngineT& engine,
                    const std::vector<std::pair<std::vector<Item>, std::string>>& batches) {
  for (const auto& batch : batches) {  // not a structured binding: C++17 lambdas cannot capture one
    ExpectInputError([&] { engine.AppendBatch(batch.first); }, batch.second);
  }
}

// ---- engines::Engine: the example in this process ----

Engine OpenInProcess(const char* plugin, const std::string& options = "") {
  return Plugin::Load(plugin).Open(TinyModelDir(), options);
}

TEST(ExampleEngineBatchTest, Items3FlagsEveryLastNoneThenDecodeEqualOneAtATimeBitForBit) {
  const Engine engine = OpenInProcess(KVDIFF_EXAMPLE_ENGINE);
  ASSERT_TRUE(engine.HasBatch());
  ExpectBatchesEqualOneAtATime(engine);
}

TEST(ExampleEngineBatchTest, OneItemOf5FlagsEveryLastNoneEqualsAppendBitForBit) {
  const Engine engine = OpenInProcess(KVDIFF_EXAMPLE_ENGINE);
  const std::vector<std::vector<bool>> flags = {
      {}, {false, false, false, false, true}, {false, false, false, false, false}};
  for (const std::vector<bool>& output : flags) {
    const std::vector<Part> parts = {{Range(3, 4), Range(60, 5), output}};
    auto sessions = SessionsWithPrefixes(engine, parts);
    const std::vector<Logits> got = Batched(engine, sessions, parts);
    ExpectSameBits(got, OneAtATime(engine, parts), "flags " + std::to_string(output.size()));
    EXPECT_EQ(sessions[0].Length(), 9);
  }
}

TEST(ExampleEngineBatchTest, RefusalsNameTheItemsAndChangeNothing) {
  const Engine engine = OpenInProcess(KVDIFF_EXAMPLE_ENGINE, "max_length=8");
  Session a = engine.NewSession(), b = engine.NewSession();
  a.Append(Range(1, 3));
  b.Append(Range(2, 6));
  Session stranger = OpenInProcess(KVDIFF_EXAMPLE_ENGINE).NewSession();
  // Refused by the loader before the plugin is called ...
  ExpectRefusals<BatchItem>(
      engine,
      {{{}, "example: a batch of no items"},
       {{{&a, {1}, {}}, {&a, {2}, {}}}, "example: batch items 0 and 1 name the same session"},
       {{{&a, {1}, {}}, {&b, {}, {}}},
        "example: batch item 1 has no tokens (expected at least one)"},
       {{{&stranger, {1}, {}}}, "example: batch item 0 is not a session of this engine"},
       {{{&a, {1, 2}, {true}}}, "example: batch item 0 has 1 output flags for 2 tokens"}});
  // ... and by the engine, which checks every item before running any.
  ExpectRefusals<BatchItem>(
      engine, {{{{&a, {4}, {}}, {&b, {5, 256}, {}}},
                "example: batch item 1: token id 256 at index 1 is out of range for vocab_size "
                "256"},
               {{{&a, {4}, {}}, {&b, {5, 6, 7}, {}}},
                "example: batch item 1: session holds 6 positions of max_length 8: 3 more tokens "
                "do not fit"}});
  EXPECT_EQ(a.Length(), 3);
  EXPECT_EQ(b.Length(), 6);
  // Item 0 ran nowhere: its next rows are those of a session that never saw the refused batches.
  Session fresh = engine.NewSession();
  fresh.Append(Range(1, 3));
  ExpectSameBits(engine.AppendBatch({{&a, {4}, {}}}), {fresh.Append({4})}, "after the refusals");
}

TEST(ExampleEngineBatchTest, AVersion1PluginHasNoBatchCall) {
  const Engine engine = OpenInProcess(KVDIFF_BROKEN_ENGINE);
  EXPECT_EQ(engine.Info().abi_version, 1u);
  EXPECT_FALSE(engine.HasBatch());
  Session s = engine.NewSession();
  ExpectRefusals<BatchItem>(
      engine, {{{{&s, {1}, {}}}, "broken-example: a version-1 plugin has no append_batch"}});
}

// ---- IsolatedEngine: the example in a child process ----

IsolatedEngine StartIsolated(const char* plugin, const std::string& options = "",
                             double timeout_seconds = 600, const char* host = KVDIFF_BINARY) {
  return IsolatedEngine::Start({host, plugin, TinyModelDir(), options, timeout_seconds});
}

TEST(IsolatedEngineBatchTest, Items3FlagsEveryLastNoneThenDecodeEqualOneAtATimeBitForBit) {
  const IsolatedEngine engine = StartIsolated(KVDIFF_EXAMPLE_ENGINE);
  ASSERT_TRUE(engine.HasBatch());
  ExpectBatchesEqualOneAtATime(engine);
  // And what the child computes is what this process computes.
  ExpectSameBits(OneAtATime(engine, EveryLastNone()),
                 OneAtATime(OpenInProcess(KVDIFF_EXAMPLE_ENGINE), EveryLastNone()),
                 "isolated against in process");
}

TEST(IsolatedEngineBatchTest, RefusalsAreMadeInTheParentAndNameTheItems) {
  const IsolatedEngine engine = StartIsolated(KVDIFF_EXAMPLE_ENGINE);
  IsolatedSession a = engine.NewSession(), b = engine.NewSession();
  a.Append(Range(1, 3));
  IsolatedSession stranger = StartIsolated(KVDIFF_EXAMPLE_ENGINE).NewSession();
  // The parent's wording for an empty item, not the engine's ("tokens is empty"): nothing was
  // sent. The engine's own refusal (the token) comes back from the child as it is.
  ExpectRefusals<IsolatedBatchItem>(
      engine, {{{}, "example: a batch of no items"},
               {{{&b, {1}, {}}, {&a, {2}, {}}, {&b, {3}, {}}},
                "example: batch items 0 and 2 name the same session"},
               {{{&a, {1}, {}}, {&b, {}, {}}},
                "example: batch item 1 has no tokens (expected at least one)"},
               {{{&a, {1}, {}}, {&stranger, {2}, {}}},
                "example: batch item 1 is not a session of this engine"},
               {{{&a, {4}, {}}, {&b, {-1}, {}}},
                "example: batch item 1: token id -1 at index 0 is out of range"}});
  EXPECT_EQ(a.Length(), 3);
  EXPECT_EQ(b.Length(), 0);
  const IsolatedEngine v1 = StartIsolated(KVDIFF_BROKEN_ENGINE);
  IsolatedSession s = v1.NewSession();
  EXPECT_FALSE(v1.HasBatch());
  ExpectRefusals<IsolatedBatchItem>(
      v1, {{{{&s, {1}, {}}}, "broken-example: a version-1 engine has no append_batch"}});
}

TEST(IsolatedEngineBatchTest, ACrashInAppendBatchIsAnEngineErrorAndEverySessionOfTheChildThrows) {
  // bug=crash strikes once a session would pass 24 positions: item 0 goes from 20 to 28.
  const IsolatedEngine engine = StartIsolated(KVDIFF_BROKEN_V2_ENGINE, "bug=crash");
  ASSERT_TRUE(engine.HasBatch());
  IsolatedSession a = engine.NewSession(), b = engine.NewSession();
  a.Append(Range(1, 20));
  const std::vector<IsolatedBatchItem> items = {{&a, Range(2, 8), {}}, {&b, Range(3, 2), {}}};
  // SIGSEGV (11); under AddressSanitizer its handler turns the crash into SIGABRT (6).
  ExpectEngineError([&] { engine.AppendBatch(items); },
                    {"broken-example: the isolated engine process was killed by signal ",
                     "during append_batch of 2 items (10 tokens)"});
  ExpectEngineError([&] { a.Length(); }, {"during append_batch of 2 items"});
  ExpectEngineError([&] { b.Append({1}); }, {"during append_batch of 2 items"});
  ExpectEngineError([&] { engine.AppendBatch({{&b, {1}, {}}}); }, {"killed by signal"});
  // A new session starts a new child, and batches run there again.
  IsolatedSession c = engine.NewSession();
  ExpectRefusals<IsolatedBatchItem>(
      engine, {{{{&b, {1}, {}}}, "batch item 0 is not a session of this engine"}});
  EXPECT_EQ(engine.AppendBatch({{&c, Range(4, 3), {false, true, false}}})[0].rows(), 1);
}

TEST(IsolatedEngineBatchTest, ACrashWhileStartingPromisesNoNewProcess) {
  // No engine came up: there are no sessions to lose, and the caller learns of it from Start.
  // (The crash of a running engine says "its sessions are gone, a new session starts a new
  // process", which is what NewSession then does.)
  try {
    StartIsolated(KVDIFF_BROKEN_ENGINE, "fault=open:segv");
    ADD_FAILURE() << "a plugin that crashes in open started";
  } catch (const EngineError& e) {
    EXPECT_THAT(e.what(), HasSubstr("libkvdiff_engine_broken.so: the isolated engine process was "
                                    "killed by signal "));
    EXPECT_THAT(e.what(), HasSubstr("during loading the plugin and opening the engine"));
    EXPECT_THAT(e.what(), Not(HasSubstr("session")));
  }
}

// 3 s: room for the child to start (a kvdiff process, LibTorch and all) on a loaded machine.
TEST(IsolatedEngineBatchTest, AHangInAppendBatchIsKilledAfterTheTimeout3s) {
  const IsolatedEngine engine = StartIsolated(KVDIFF_BROKEN_V2_ENGINE, "bug=hang", 3);
  IsolatedSession a = engine.NewSession();
  const std::vector<IsolatedBatchItem> items = {{&a, Range(1, 30), {}}};
  ExpectEngineError(
      [&] { engine.AppendBatch(items); },
      {"did not answer within 3 s (killed) during append_batch of 1 item (30 tokens)"});
  ExpectEngineError([&] { a.Append({1}); }, {"did not answer within 3 s"});
  // Unlike after a crash, a new session starts no new child (it would most likely hang as long):
  // it is refused at once, with the time-out's type and story.
  EXPECT_THROW(engine.NewSession(), EngineHungError);
  ExpectEngineError([&] { engine.NewSession(); },
                    {"not called: earlier, the isolated engine process did not answer within 3 s "
                     "(killed) during append_batch of 1 item (30 tokens); it is not called again"});
}

// The child's reply to append_batch, rewritten by tests/engines/lying_engine_host.cc.
TEST(IsolatedEngineBatchTest, AReplyWithRowsTheFlagsDoNotAskForIsRefused) {
  for (const std::string lie : {"rows", "short"}) {
    const IsolatedEngine engine =
        StartIsolated(KVDIFF_EXAMPLE_ENGINE, "host_lie=" + lie, 600, KVDIFF_LYING_ENGINE_HOST);
    IsolatedSession a = engine.NewSession(), b = engine.NewSession();
    const std::vector<IsolatedBatchItem> items = {{&a, Range(1, 3), {}},
                                                  {&b, Range(2, 2), {false, true}}};
    const int64_t rows = lie == "rows" ? 5 : 3;
    ExpectEngineError(
        [&] { engine.AppendBatch(items); },
        {fmt::format(
            "example: the isolated engine process sent {} rows ({} bytes) for a batch of 2 items "
            "whose output flags ask for 4 rows of vocab 256 (4096 bytes)",
            rows, lie == "rows" ? 4096 : 3072)});
  }
}

// docs/protocol.md lets the engine choose any i64 as a session's id, negative ones too: the lying
// host tells each id as -id - 100 and maps it back. Batches, forks and frees work with them (the
// parent took -1 for "no session": batches were refused and no session was ever freed).
TEST(IsolatedEngineBatchTest, NegativeSessionIdsWorkAsAnyOther) {
  const IsolatedEngine engine =
      StartIsolated(KVDIFF_EXAMPLE_ENGINE, "host_lie=negative_ids", 600, KVDIFF_LYING_ENGINE_HOST);
  const std::vector<Part> parts = EveryLastNone();
  auto sessions = SessionsWithPrefixes(engine, parts);
  ExpectSameBits(Batched(engine, sessions, parts), OneAtATime(engine, parts), "negative ids");
  IsolatedSession fork = sessions[0].Fork();
  EXPECT_EQ(fork.Length(), sessions[0].Length());
  // The lying host holds at most 8 sessions at once: a few hundred come and go only if each is
  // freed.
  for (int i = 0; i < 300; ++i) engine.NewSession().Append({1});
}

TEST(IsolatedEngineBatchTest, AReplyLargerThanTheCallCanTakeKillsTheChild) {
  const IsolatedEngine engine =
      StartIsolated(KVDIFF_EXAMPLE_ENGINE, "host_lie=huge", 600, KVDIFF_LYING_ENGINE_HOST);
  IsolatedSession a = engine.NewSession();
  const std::vector<IsolatedBatchItem> items = {{&a, Range(1, 2), {}}};
  ExpectEngineError([&] { engine.AppendBatch(items); },
                    {"announced a reply of 1125899906842624 bytes, where this call takes at most "
                     "1048576 (killed) during append_batch of 1 item (2 tokens)"});
  ExpectEngineError([&] { a.Length(); }, {"announced a reply of"});
}

// ---- The plugin backend: Backend::AppendBatch over either engine type ----

class PluginBackendBatchTest : public ::testing::Test {
 protected:
  void SetUp() override { harness::SetEngineHost(KVDIFF_BINARY); }
  // `plugin` is a path, with "?key=value" options if any.
  static std::unique_ptr<harness::Backend> Make(const std::string& plugin, bool isolate) {
    static const auto weights = std::make_shared<const format::ModelWeights>(TinyWeights());
    return harness::BackendRegistry::Global().Make(harness::kPluginPrefix + plugin, weights,
                                                   harness::BackendOptions{1, isolate});
  }
  // The parts through `backend`: one AppendBatch on sessions holding the prefixes.
  static std::vector<Logits> Batched(const harness::Backend& backend,
                                     const std::vector<Part>& parts) {
    std::vector<std::unique_ptr<harness::BackendSession>> sessions;
    std::vector<harness::BatchItem> items;
    for (const Part& part : parts) {
      sessions.push_back(backend.NewSession());
      if (!part.prefix.empty()) sessions.back()->Append(part.prefix);
      items.push_back({sessions.back().get(), part.tokens, part.output});
    }
    return backend.AppendBatch(items);
  }
  // The oracle: one Append per part on fresh sessions, flagged rows kept.
  static std::vector<Logits> OneAtATime(const harness::Backend& backend,
                                        const std::vector<Part>& parts) {
    std::vector<Logits> out;
    for (const Part& part : parts) {
      const auto session = backend.NewSession();
      if (!part.prefix.empty()) session->Append(part.prefix);
      out.push_back(Flagged(session->Append(part.tokens), part.output));
    }
    return out;
  }
};

TEST_F(PluginBackendBatchTest, ExampleInProcessAndIsolatedEqualsOneAtATimeBitForBit) {
  for (bool isolate : {false, true}) {
    const auto backend = Make(KVDIFF_EXAMPLE_ENGINE, isolate);
    ExpectSameBits(Batched(*backend, EveryLastNone()), OneAtATime(*backend, EveryLastNone()),
                   isolate ? "isolated" : "in process");
  }
}

// The crash names the call it struck in: the backend made ONE append_batch call, not appends.
TEST_F(PluginBackendBatchTest, AVersion2PluginGetsOneAppendBatchCallAndItsCrashIsAnEngineError) {
  const auto backend = Make(std::string(KVDIFF_BROKEN_V2_ENGINE) + "?bug=crash", true);
  const auto a = backend->NewSession(), b = backend->NewSession();
  const std::vector<harness::BatchItem> items = {{a.get(), Range(1, 3), {}},
                                                 {b.get(), Range(2, 30), {}}};
  ExpectEngineError([&] { backend->AppendBatch(items); },
                    {"the isolated engine process was killed by signal ",
                     "during append_batch of 2 items (33 tokens)"});
  ExpectEngineError([&] { a->Length(); }, {"during append_batch of 2 items"});
}

// broken_plugin.c is a version-1 plugin around the example: the default's one append per item
// must give what the example's one append_batch call gives.
TEST_F(PluginBackendBatchTest, AVersion1PluginRunsBatchesThroughTheDefault) {
  const std::vector<Logits> want = Batched(*Make(KVDIFF_EXAMPLE_ENGINE, false), EveryLastNone());
  for (bool isolate : {false, true}) {
    const auto v1 = Make(KVDIFF_BROKEN_ENGINE, isolate);
    ExpectSameBits(Batched(*v1, EveryLastNone()), want, isolate ? "isolated v1" : "v1");
  }
}

TEST_F(PluginBackendBatchTest, RefusalsNameTheItemsForVersion1And2Alike) {
  for (const char* plugin : {KVDIFF_EXAMPLE_ENGINE, KVDIFF_BROKEN_ENGINE}) {
    const auto backend = Make(plugin, false);
    const auto other = Make(plugin, false);
    const auto impl = harness::MakeBackend(
        "impl", std::make_shared<const format::ModelWeights>(TinyWeights()), 1);
    const auto a = backend->NewSession(), b = backend->NewSession();
    const auto stranger = other->NewSession(), impl_session = impl->NewSession();
    const std::string who = std::string("backend plugin:") + plugin;
    ExpectRefusals<harness::BatchItem>(
        *backend,
        {{{{a.get(), {1}, {}}, {a.get(), {2}, {}}},
          who + ": batch items 0 and 1 name the same session"},
         {{{a.get(), {1}, {}}, {b.get(), {}, {}}}, who + ": batch item 1 has no tokens"},
         {{{stranger.get(), {1}, {}}}, who + ": batch item 0 is not a session of this engine"},
         {{{a.get(), {1}, {}}, {impl_session.get(), {2}, {}}},
          who + ": batch item 1 is not a session of this engine"}});
    EXPECT_EQ(a->Length(), 0) << plugin;
  }
}

}  // namespace
}  // namespace kvdiff::engines
