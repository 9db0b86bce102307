// Tests for ops/ngram_hash_op.h (speedtorch::ngram_hash through the dispatcher, as C++ callers use it) and the hash
// of csrc/core/ngram_hash_math.h, on values worked out by hand.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "error_text.h"
#include "ngram_hash_op.h"

namespace speedtorch {
namespace {

using testing::error_of;

at::Tensor longs(std::vector<int64_t> values, std::vector<int64_t> shape) {
  return at::tensor(values).reshape(shape);
}

// One head, orders 2 and 3, multipliers (1, 2, 3), columns of 11 and 13 rows: the ids are offset + mix % size with
// mix2 = v0 ^ 2 v1, mix3 = mix2 ^ 3 v2, and v_k the token k back (pad 0 before the row or its document).
TEST(NgramHash, HandComputedIds) {
  const at::Tensor multipliers = longs({1, 2, 3}, {1, 3});
  const at::Tensor sizes = longs({11, 13}, {2, 1});
  const at::Tensor tokens = longs({3, 5, 7}, {1, 3});
  // t=0: v=(3,0,0): 3 -> 3, 14.  t=1: v=(5,3,0): 5^6=3 -> 3, 14.  t=2: v=(7,5,3): 7^10=13 -> 2; 13^9=4 -> 15.
  EXPECT_TRUE(at::equal(ops::ngram_hash(tokens, multipliers, sizes, 0), longs({3, 14, 3, 14, 2, 15}, {1, 3, 2})));
  // A document starting at t=2: v=(7,0,0): 7 -> 7, 11 + 7.
  at::Tensor starts = at::zeros({1, 3}, at::kBool);
  starts[0][2] = true;
  EXPECT_TRUE(at::equal(ops::ngram_hash(tokens.to(at::kInt), multipliers, sizes, 0, starts),
                        longs({3, 14, 3, 14, 7, 18}, {1, 3, 2})));
}

TEST(NgramHash, BadInputIsNamed) {
  const at::Tensor multipliers = longs({1, 2, 3}, {1, 3});
  const at::Tensor sizes = longs({11, 13}, {2, 1});
  EXPECT_NE(error_of([&] { ops::ngram_hash(longs({1, 2}, {1, 2}), multipliers, sizes, 0); })
                .find("fewer than the longest n-gram"),
            std::string::npos);
  EXPECT_NE(error_of([&] { ops::ngram_hash(longs({1, -2, 3}, {1, 3}), multipliers, sizes, 0); })
                .find("tokens holds -2 at flat position 1"),
            std::string::npos);
  EXPECT_NE(error_of([&] { ops::ngram_hash(longs({1, 2, 3}, {1, 3}), multipliers, longs({11, 0}, {2, 1}), 0); })
                .find("bucket_sizes holds 0"),
            std::string::npos);
}

}  // namespace
}  // namespace speedtorch
