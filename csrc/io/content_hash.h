// A 64-bit content hash of a byte stream, cheap enough to run over a whole table on every save and load: it tells a
// table file from another save of the same shape (a sidecar overwritten later, a state file of another checkpoint).
// Not cryptographic.
//
// The stream is cut into 1 MiB blocks, each hashed with XXH64 (seeded by its block number) on CPU threads; the
// block hashes are folded in order. The result depends only on the bytes, never on how they were fed in (one call
// or many, any chunk sizes) nor on the thread count.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace speedtorch::io {

// XXH64 of `size` bytes with `seed` (the xxHash library's; exposed for tests).
uint64_t xxh64(const void* data, std::size_t size, uint64_t seed);

class ContentHasher {
 public:
  static constexpr std::size_t kBlockBytes = std::size_t{1} << 20;

  // Feeds the next `size` bytes of the stream.
  void update(const void* data, std::size_t size);
  // The hash of everything fed so far (the hasher can keep going afterwards).
  uint64_t digest() const;
  std::size_t bytes() const { return total_; }

 private:
  void fold(uint64_t block_hash);

  uint64_t folded_ = 0x53504545445452ull;  // "SPEEDTR": a non-zero start
  uint64_t blocks_ = 0;
  std::size_t total_ = 0;
  std::vector<unsigned char> partial_;  // the start of a block not yet complete
};

// A hash as 16 lowercase hex digits (how meta files and pickled models store it).
std::string hash_to_hex(uint64_t hash);

}  // namespace speedtorch::io
