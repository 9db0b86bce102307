// Tests for csrc/io/content_hash: XXH64 against reference vectors, and a stream hash that depends only on the bytes.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <vector>

#include "io/content_hash.h"

namespace speedtorch::io {
namespace {

std::vector<unsigned char> pattern(std::size_t n) {
  std::vector<unsigned char> out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<unsigned char>(i & 0xff);
  return out;
}

std::vector<unsigned char> random_bytes(std::size_t n, int64_t seed) {
  at::manual_seed(seed);
  at::Tensor t = at::randint(0, 256, {static_cast<int64_t>(n)}, at::kByte);
  return std::vector<unsigned char>(t.data_ptr<uint8_t>(), t.data_ptr<uint8_t>() + n);
}

TEST(ContentHash, Xxh64MatchesReferenceVectors) {
  // Values from the reference implementation (python-xxhash).
  EXPECT_EQ(xxh64("", 0, 0), 0xef46db3751d8e999ull);
  EXPECT_EQ(xxh64("a", 1, 0), 0xd24ec4f1a98c6e5bull);
  EXPECT_EQ(xxh64("abc", 3, 0), 0x44bc2cf5ad770999ull);
  EXPECT_EQ(xxh64("", 0, 7), 0x95f0626f6f0a4409ull);
  EXPECT_EQ(xxh64("abc", 3, 7), 0x9e755206156676d7ull);
  const auto bytes = pattern(1280);
  EXPECT_EQ(xxh64(bytes.data(), bytes.size(), 0), 0xafc184ad7938a354ull);
  EXPECT_EQ(xxh64(bytes.data(), bytes.size(), 7), 0x133cf6ca9d1c1256ull);
}

TEST(ContentHash, DoesNotDependOnHowBytesAreFed) {
  const auto bytes = random_bytes(3 * ContentHasher::kBlockBytes + 12345, 1);
  ContentHasher whole;
  whole.update(bytes.data(), bytes.size());
  for (const std::size_t piece : {std::size_t{1} << 20, std::size_t{4093}, std::size_t{7} << 19}) {
    ContentHasher pieces;
    for (std::size_t at = 0; at < bytes.size(); at += piece) {
      pieces.update(bytes.data() + at, std::min(piece, bytes.size() - at));
    }
    EXPECT_EQ(pieces.digest(), whole.digest()) << "pieces of " << piece;
    EXPECT_EQ(pieces.bytes(), bytes.size());
  }
}

TEST(ContentHash, DoesNotDependOnThreads) {
  const auto bytes = random_bytes(5 * ContentHasher::kBlockBytes + 3, 2);
  const int previous = at::get_num_threads();
  at::set_num_threads(1);
  ContentHasher one;
  one.update(bytes.data(), bytes.size());
  at::set_num_threads(2);
  ContentHasher two;
  two.update(bytes.data(), bytes.size());
  at::set_num_threads(previous);
  EXPECT_EQ(one.digest(), two.digest());
}

TEST(ContentHash, ChangesWithAnyByteAndWithLength) {
  auto bytes = random_bytes(2 * ContentHasher::kBlockBytes + 100, 3);
  ContentHasher base;
  base.update(bytes.data(), bytes.size());
  for (const std::size_t at : {std::size_t{0}, ContentHasher::kBlockBytes + 5, bytes.size() - 1}) {
    bytes[at] ^= 1;
    ContentHasher flipped;
    flipped.update(bytes.data(), bytes.size());
    EXPECT_NE(flipped.digest(), base.digest()) << "byte " << at;
    bytes[at] ^= 1;
  }
  ContentHasher shorter;
  shorter.update(bytes.data(), bytes.size() - 1);
  EXPECT_NE(shorter.digest(), base.digest());
  // Swapping two whole blocks changes the hash: blocks are folded in order.
  std::vector<unsigned char> swapped(bytes);
  std::swap_ranges(swapped.begin(), swapped.begin() + ContentHasher::kBlockBytes,
                   swapped.begin() + ContentHasher::kBlockBytes);
  ContentHasher other;
  other.update(swapped.data(), swapped.size());
  EXPECT_NE(other.digest(), base.digest());
}

TEST(ContentHash, HexForm) { EXPECT_EQ(hash_to_hex(0x00ab000000000001ull), "00ab000000000001"); }

}  // namespace
}  // namespace speedtorch::io
