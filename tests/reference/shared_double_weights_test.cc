// ref64's double weights are converted once per process and shared (reference/
// shared_double_weights.h): a campaign's jobs each build a ref64 over one copy of the weights.
#include "reference/shared_double_weights.h"

#include <gtest/gtest.h>

namespace kvdiff::ref {
namespace {

format::Tensor SomeWeights() {
  format::Tensor t;
  t.shape = {2, 3};
  t.data = {1.5f, -2.25f, 3.1f, 1e-30f, -7e30f, 0.1f};
  return t;
}

TEST(SharedDoubleCopy, ConvertsExactlyAndSharesOneCopyWhileHeld) {
  const format::Tensor t = SomeWeights();
  const at::Tensor a = SharedDoubleCopy(t);
  const at::Tensor b = SharedDoubleCopy(t);
  EXPECT_EQ(a.data_ptr<double>(), b.data_ptr<double>()) << "a second ref64 converted again";
  ASSERT_EQ(a.sizes().vec(), t.shape);
  ASSERT_EQ(a.scalar_type(), at::kDouble);
  for (size_t i = 0; i < t.data.size(); ++i)
    EXPECT_EQ(a.data_ptr<double>()[i], static_cast<double>(t.data[i])) << i;

  const format::Tensor other = SomeWeights();  // another tensor: its own copy
  EXPECT_NE(SharedDoubleCopy(other).data_ptr<double>(), a.data_ptr<double>());
}

TEST(SharedDoubleCopy, ACopyNobodyHoldsIsFreedAndMadeAgain) {
  format::Tensor t = SomeWeights();
  { const at::Tensor a = SharedDoubleCopy(t); }
  t.data[0] = 4.0f;  // were the old copy kept, it would still say 1.5
  EXPECT_EQ(SharedDoubleCopy(t).data_ptr<double>()[0], 4.0);
}

}  // namespace
}  // namespace kvdiff::ref
