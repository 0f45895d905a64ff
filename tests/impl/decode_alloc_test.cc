// A decode step allocates nothing but the logits it returns: the workspace, the attention scratch
// and the KV cache are all sized ahead. This binary replaces malloc and friends (forwarding to
// glibc) so that every allocation is seen, whoever makes it: operator new (std::vector), Eigen's
// aligned_malloc (Eigen::Matrix) and the pool's worker threads alike. A property, not a timing.
#include <gtest/gtest.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "impl/model.h"
#include "impl/session.h"
#include "tests/impl/impl_test_util.h"

namespace {
std::atomic<bool> g_counting{false};
std::atomic<int64_t> g_allocations{0};
std::atomic<int64_t> g_bytes{0};

void Count(size_t bytes) {
  if (g_counting.load(std::memory_order_relaxed)) {
    g_allocations.fetch_add(1);
    g_bytes.fetch_add(static_cast<int64_t>(bytes));
  }
}
}  // namespace

// glibc's own entry points (documented in "Replacing malloc" of the glibc manual).
extern "C" {
void* __libc_malloc(size_t);
void* __libc_calloc(size_t, size_t);
void* __libc_realloc(void*, size_t);
void* __libc_memalign(size_t, size_t);

void* malloc(size_t n) {
  Count(n);
  return __libc_malloc(n);
}
void* calloc(size_t count, size_t n) {
  Count(count * n);
  return __libc_calloc(count, n);
}
void* realloc(void* p, size_t n) {
  Count(n);
  return __libc_realloc(p, n);
}
void* memalign(size_t alignment, size_t n) {
  Count(n);
  return __libc_memalign(alignment, n);
}
void* aligned_alloc(size_t alignment, size_t n) {
  Count(n);
  return __libc_memalign(alignment, n);
}
int posix_memalign(void** out, size_t alignment, size_t n) {
  Count(n);
  void* p = __libc_memalign(alignment, n);
  if (p == nullptr) return 12;  // ENOMEM
  *out = p;
  return 0;
}
}

namespace kvdiff::impl {
namespace {

struct Counted {
  int64_t allocations;
  int64_t bytes;
};

template <typename Fn>
Counted CountAllocations(Fn&& fn) {
  g_allocations = 0;
  g_bytes = 0;
  g_counting = true;
  fn();
  g_counting = false;
  return {g_allocations.load(), g_bytes.load()};
}

// The counter works: a vector and an Eigen matrix are both seen.
TEST(DecodeAllocationTest, TheCounterSeesOperatorNewAndEigen) {
  const Counted counted = CountAllocations([] {
    std::vector<float> v(1000);
    RowMatrix m(10, 100);
    v[0] = m(0, 0) = 1;
  });
  EXPECT_EQ(counted.allocations, 2);
  EXPECT_GE(counted.bytes, 8000);
}

class DecodeAllocationTest : public ::testing::TestWithParam<int> {};

// After one warm-up call, every Append of one token allocates exactly the logits row it returns,
// at every context up to 40 positions past the prompt.
TEST_P(DecodeAllocationTest, AppendOfOneTokenAllocatesOnlyTheLogits) {
  const int threads = GetParam();
  Model model(testing::PresetModel("tiny", 3), threads);
  const int64_t vocab = model.config().vocab_size;
  const Tokens prompt = testing::RandomTokens(16, vocab, 5);
  Session session = model.NewSession();
  session.Append(prompt);
  session.Append({1});  // warm-up: the first decode-shaped call may size the workspace
  for (int step = 0; step < 40; ++step) {
    const Tokens next = {static_cast<Token>((step * 37 + 11) % vocab)};
    Logits logits;
    const Counted counted = CountAllocations([&] { logits = session.Append(next); });
    ASSERT_EQ(counted.allocations, 1) << "step " << step << " at length " << session.Length();
    // The logits (1, vocab) floats plus at most Eigen's alignment padding.
    EXPECT_GE(counted.bytes, vocab * 4);
    EXPECT_LE(counted.bytes, vocab * 4 + 128);
    EXPECT_EQ(logits.rows(), 1);
  }
}

// Truncating and appending again (a fork of the conversation) allocates nothing new either.
TEST_P(DecodeAllocationTest, AppendAfterTruncateAllocatesOnlyTheLogits) {
  Model model(testing::PresetModel("tiny", 4), GetParam());
  const int64_t vocab = model.config().vocab_size;
  Session session = model.NewSession();
  session.Append(testing::RandomTokens(24, vocab, 6));
  session.Append({2});
  session.Truncate(10);
  const Tokens next = {3};  // built outside the counted call
  const Counted counted = CountAllocations([&] { session.Append(next); });
  EXPECT_EQ(counted.allocations, 1);
}

// A sliding-window model's decode through its ring (tiny-swa, W = 32): the gather buffer of the
// window's keys is grown once, so decoding across the ring's wraps allocates only the logits too.
TEST_P(DecodeAllocationTest, WindowedDecodeAcrossTheRingsWrapsAllocatesOnlyTheLogits) {
  Model model(testing::PresetModel("tiny-swa", 3), GetParam());
  const int64_t vocab = model.config().vocab_size;
  Session session = model.NewSession();
  session.Append({5});  // one token: the window's keys in view grow by one at every step to W
  session.Append({1});  // warm-up
  for (int step = 0; step < 80; ++step) {
    const Tokens next = {static_cast<Token>((step * 37 + 11) % vocab)};
    const Counted counted = CountAllocations([&] { session.Append(next); });
    ASSERT_EQ(counted.allocations, 1) << "step " << step << " at length " << session.Length();
  }
}

INSTANTIATE_TEST_SUITE_P(Threads, DecodeAllocationTest, ::testing::Values(1, 2, 3),
                         [](const auto& info) { return std::to_string(info.param) + "_threads"; });

}  // namespace
}  // namespace kvdiff::impl
