// The "ref"/"ref64" backends: the Backend/BackendSession interface over ReferenceModel and
// DynamicCache (Append = forward with the cache, Length, Truncate = Crop, Fork, Reset).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace kvdiff::harness
