// The "ref"/"ref64" backends: the Backend/BackendSession interface over ReferenceModel and
// DynamicCache (Append = forward with the cache, Length, Truncate = Crop, Fork, Reset), loaded as
// a module when the first of them is built.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "format/error.h"
#include "harness/backend/registry.h"
#include "tests/reference/reference_test_util.h"

namespace kvdiff::harness {
namespace {

using ::kvdiff::testing::MakeWeights;
using ::kvdiff::testing::MaxAbsDiff;
using ::kvdiff::testing::RandomTokens;
using ::kvdiff::testing::Rows;
using ::kvdiff::testing::TinyConfig;
using ::testing::HasSubstr;

constexpr double kTolerance = 1e-4;

// Whether this process has LibTorch's main library mapped.
bool LibTorchIsLoaded() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find("/libtorch_cpu.so") != std::string::npos) return true;
  }
  return false;
}

// kvdiff links no LibTorch: the reference module (reference/reference_module.h) is loaded when the
// first ref backend is built, so a process that never builds one (`kvdiff --version`, a refusal,
// an isolated engine's child) does not pay LibTorch's start. ctest runs each test in a process of
// its own; this one is also the binary's first, so a whole-binary run holds it too.
TEST(ReferenceBackend, LibTorchIsLoadedOnlyWhenARefBackendIsBuilt) {
  EXPECT_FALSE(LibTorchIsLoaded()) << "LibTorch was loaded at the process's start";
  auto weights = MakeWeights(TinyConfig(true), 1);
  auto impl = MakeBackend("impl", weights, 1);
  EXPECT_TRUE(BackendRegistry::Global().Info("ref").in_default_set);
  EXPECT_FALSE(LibTorchIsLoaded()) << "LibTorch was loaded before any ref backend was built";
  auto ref = MakeBackend("ref", weights, 1);
  EXPECT_TRUE(LibTorchIsLoaded());
  const Tokens tokens = {5, 9, 2};
  EXPECT_LT(MaxAbsDiff(ref->NewSession()->Append(tokens), impl->NewSession()->Append(tokens),
                       "ref against impl"),
            kTolerance);
}

TEST(ReferenceBackend, NamesAndConfig) {
  auto weights = MakeWeights(TinyConfig(true), 1);
  for (const std::string name : {"ref", "ref64"}) {
    auto backend = MakeBackend(name, weights, 2);
    EXPECT_EQ(backend->Name(), name);
    EXPECT_EQ(backend->config().hidden_size, weights->config.hidden_size);
    EXPECT_TRUE(backend->Info().gemms_in_blas) << "LibTorch's GEMMs: bench names the BLAS";
  }
  EXPECT_EQ(BackendRegistry::Global().Arbiter(), "ref64");
}

TEST(ReferenceBackend, UnknownNameIsAnInputError) {
  try {
    MakeBackend("ref32", MakeWeights(TinyConfig(true), 1), 2);
    FAIL() << "expected an InputError";
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(), HasSubstr("unknown backend 'ref32'"));
    // Whatever else this build registered (llama.cpp where it is installed), the list is the
    // registry's own.
    EXPECT_THAT(e.what(), HasSubstr("(available: " + BackendRegistry::Global().NamesText() + ")"));
    EXPECT_THAT(e.what(), HasSubstr("ref64"));
  }
}

TEST(ReferenceBackend, SessionAppendTruncateForkReset) {
  auto weights = MakeWeights(TinyConfig(false), 2);
  for (const std::string name : {"ref", "ref64"}) {
    SCOPED_TRACE(name);
    auto backend = MakeBackend(name, weights, 2);
    const Tokens tokens = RandomTokens(16, weights->config.vocab_size, 9);
    const Logits full = backend->ForwardFull(tokens);

    auto session = backend->NewSession();
    EXPECT_EQ(session->Length(), 0);
    const Logits head = session->Append(Tokens(tokens.begin(), tokens.begin() + 10));
    EXPECT_EQ(session->Length(), 10);
    EXPECT_LE(MaxAbsDiff(head, Rows(full, 0, 10), "append"), kTolerance);

    auto fork = session->Fork();
    session->Truncate(4);
    EXPECT_EQ(session->Length(), 4);
    EXPECT_EQ(fork->Length(), 10);
    const Logits tail = fork->Append(Tokens(tokens.begin() + 10, tokens.end()));
    EXPECT_LE(MaxAbsDiff(tail, Rows(full, 10, 6), "fork"), kTolerance);

    const Logits redo = session->Append(Tokens(tokens.begin() + 4, tokens.begin() + 6));
    EXPECT_LE(MaxAbsDiff(redo, Rows(full, 4, 2), "truncate"), kTolerance);

    session->Reset();
    EXPECT_EQ(session->Length(), 0);
    EXPECT_LE(MaxAbsDiff(session->Append({tokens[0]}), Rows(full, 0, 1), "reset"), kTolerance);
  }
}

TEST(ReferenceBackend, SessionOutlivesItsBackend) {
  auto weights = MakeWeights(TinyConfig(true), 3);
  std::unique_ptr<BackendSession> session;
  {
    auto backend = MakeBackend("ref", weights, 2);
    session = backend->NewSession();
  }
  EXPECT_EQ(session->Append({1, 2, 3}).rows(), 3);
}

TEST(ReferenceBackend, SessionErrorsAreInputErrors) {
  auto backend = MakeBackend("ref", MakeWeights(TinyConfig(true), 4), 2);
  auto session = backend->NewSession();
  session->Append({1, 2});
  EXPECT_THROW(session->Truncate(3), InputError);
  EXPECT_THROW(session->Append({}), InputError);
  EXPECT_EQ(session->Length(), 2);
}

// ---- batched calls: transformers' padded batch (ReferenceModel::ForwardBatch) ----

// Sessions of different lengths (0 included), each forked so the same items can run twice.
struct BatchFixture {
  std::vector<std::unique_ptr<BackendSession>> sessions;
  std::vector<BatchItem> items;
};

BatchFixture MixedBatch(const Backend& backend, const std::vector<int64_t>& pasts) {
  BatchFixture f;
  const int64_t vocab = backend.config().vocab_size;
  const std::vector<Tokens> fresh = {RandomTokens(6, vocab, 1), RandomTokens(1, vocab, 2),
                                     RandomTokens(9, vocab, 3), RandomTokens(3, vocab, 4)};
  const std::vector<std::vector<bool>> output = {
      {},
      {true},
      {false, false, false, false, false, false, false, false, true},
      {false, false, false}};
  for (size_t i = 0; i < pasts.size(); ++i) {
    f.sessions.push_back(backend.NewSession());
    if (pasts[i] > 0) f.sessions.back()->Append(RandomTokens(pasts[i], vocab, 10 + i));
  }
  for (size_t i = 0; i < pasts.size(); ++i)
    f.items.push_back({f.sessions[i].get(), fresh[i], output[i]});
  return f;
}

BatchFixture Forked(const BatchFixture& f) {
  BatchFixture copy;
  for (size_t i = 0; i < f.items.size(); ++i) {
    copy.sessions.push_back(f.items[i].session->Fork());
    copy.items.push_back({copy.sessions.back().get(), f.items[i].tokens, f.items[i].output});
  }
  return copy;
}

// The padded batch against Backend::AppendBatch's default (the items one after another), rows
// asked for all / last / none, and the sessions' lengths after it.
TEST(ReferenceBackend, BatchedCallEqualsTheItemsOneAfterAnother) {
  auto weights = MakeWeights(TinyConfig(false), 5);
  for (const std::string name : {"ref", "ref64"}) {
    SCOPED_TRACE(name);
    auto backend = MakeBackend(name, weights, 2);
    BatchFixture batched = MixedBatch(*backend, {0, 7, 2, 11});
    BatchFixture alone = Forked(batched);
    const std::vector<Logits> rows = backend->AppendBatch(batched.items);
    const std::vector<Logits> expected = backend->Backend::AppendBatch(alone.items);
    ASSERT_EQ(rows.size(), expected.size());
    const std::vector<int64_t> rows_asked = {6, 1, 1, 0};
    for (size_t i = 0; i < rows.size(); ++i) {
      EXPECT_EQ(rows[i].rows(), rows_asked[i]) << "item " << i;
      EXPECT_LE(MaxAbsDiff(rows[i], expected[i], "item " + std::to_string(i)), 2e-5);
      EXPECT_EQ(batched.sessions[i]->Length(), alone.sessions[i]->Length());
    }
  }
}

TEST(ReferenceBackend, BatchOptionReproducesTheMissingPositionIds) {
  auto weights = MakeWeights(TinyConfig(false), 5);
  const BackendInfo& info = BackendRegistry::Global().Info("ref?batch=no-position-ids");
  EXPECT_FALSE(info.in_default_set) << "a user bug is never run by default";
  EXPECT_EQ(info.rope_angles, "f32");
  EXPECT_THAT(info.description, HasSubstr("no position_ids"));
  EXPECT_EQ(BackendRegistry::Global().Info("ref64?batch=no-position-ids").dtype, "float64");
  EXPECT_EQ(BackendRegistry::Global().Arbiter(), "ref64");

  for (const std::string name : {"ref", "ref64"}) {
    SCOPED_TRACE(name);
    auto right = MakeBackend(name + "?batch=position-ids", weights, 2);
    auto buggy = MakeBackend(name + "?batch=no-position-ids", weights, 2);
    BatchFixture a = MixedBatch(*right, {0, 7, 2, 11});
    BatchFixture b = MixedBatch(*buggy, {0, 7, 2, 11});
    const std::vector<Logits> good = right->AppendBatch(a.items);
    const std::vector<Logits> bad = buggy->AppendBatch(b.items);
    EXPECT_GT(MaxAbsDiff(good[1], bad[1], "item 1"), 1e-2) << "7 cached, 1 new, padded by 8";
  }
}

TEST(ReferenceBackend, UnknownBatchOptionNamesTheChoices) {
  try {
    MakeBackend("ref?batch=none", MakeWeights(TinyConfig(true), 1), 2);
    FAIL() << "expected an InputError";
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(), HasSubstr("expected ref?batch=position-ids or ref?batch=no-position-ids, "
                                    "found option 'batch=none'"));
  }
}

}  // namespace
}  // namespace kvdiff::harness
