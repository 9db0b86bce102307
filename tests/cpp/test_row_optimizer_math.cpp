// Tests for csrc/core/row_optimizer_math.h's stochastic rounding of 16-bit weights: only the two neighbours of a
// value, in proportions that make the expected value exact, reproducible from (step, row, element).
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <set>

#include "core/row_optimizer_math.h"

namespace speedtorch {
namespace {

template <typename T>
void expect_unbiased(float x) {
  constexpr int kDraws = 1 << 16;
  double sum = 0.0;
  std::set<float> seen;
  for (int i = 0; i < kDraws; ++i) {
    const float r = static_cast<float>(round_stochastic<T>(x, rounding_bits(7, i, 3)));
    seen.insert(r);
    sum += r;
  }
  EXPECT_LE(seen.size(), 2u) << x;
  for (float r : seen) EXPECT_LT(std::fabs(r - x), std::fabs(x) * 0.01f + 1e-6f) << x;  // neighbours only
  const float spacing = seen.size() == 2 ? *seen.rbegin() - *seen.begin() : 0.f;
  EXPECT_NEAR(sum / kDraws, x, 5.0 * spacing / std::sqrt(static_cast<double>(kDraws)) + 1e-9) << x;
}

TEST(StochasticRounding, ExpectedValueIsExact) {
  for (float x : {0.9999f, 1.0001f, -0.9999f, 3.14159f, -1e-3f, 1e-6f, 65000.3f}) {
    expect_unbiased<c10::BFloat16>(x);
    expect_unbiased<c10::Half>(x);
  }
  expect_unbiased<c10::Half>(3e-7f);  // a float16 subnormal
}

TEST(StochasticRounding, RepresentableAndNonFiniteValuesStay) {
  for (float x : {1.0f, -2.5f, 0.0f}) {
    EXPECT_EQ(static_cast<float>(round_stochastic<c10::BFloat16>(x, 0xffffffffu)), x);
    EXPECT_EQ(static_cast<float>(round_stochastic<c10::Half>(x, 0xffffffffu)), x);
  }
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(static_cast<float>(round_stochastic<c10::Half>(inf, 0)), inf);
  EXPECT_TRUE(std::isnan(static_cast<float>(round_stochastic<c10::BFloat16>(std::nanf(""), 0))));
  // Just above float16's largest value: rounds down to it, never up to infinity.
  for (uint32_t bits : {0u, 0x7fffffffu, 0xffffffffu}) {
    EXPECT_EQ(static_cast<float>(round_stochastic<c10::Half>(65510.f, bits)), 65504.f);
  }
}

TEST(StochasticRounding, RoundedWeightFollowsTheOption) {
  OptimizerHyper h;
  const float x = 1.0f - 1e-4f;
  EXPECT_EQ(static_cast<float>(rounded_weight<c10::BFloat16>(h, x, 1, 2, 3)), 1.0f);  // to nearest: lost
  EXPECT_EQ(rounded_weight<float>(h, x, 1, 2, 3), x);
  h.stochastic_rounding = true;
  int down = 0;
  for (int64_t row = 0; row < 10000; ++row) {
    down += static_cast<float>(rounded_weight<c10::BFloat16>(h, x, 1, row, 3)) < 1.0f;
  }
  EXPECT_GT(down, 150);  // p = 1e-4 / 2^-8 = 0.0256: about 256 of 10000
  EXPECT_LT(down, 370);
  EXPECT_EQ(rounding_bits(1, 2, 3), rounding_bits(1, 2, 3));
  EXPECT_NE(rounding_bits(1, 2, 3), rounding_bits(2, 2, 3));
}

}  // namespace
}  // namespace speedtorch
