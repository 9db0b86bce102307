// Content hash of byte streams: XXH64 per 1 MiB block, blocks hashed in parallel and folded in order (see
// content_hash.h). XXH64 itself is the xxHash library's (Debian: libxxhash-dev), compiled into this file
// (XXH_INLINE_ALL): the shared library gains no run-time dependency (a pip-installed speedtorch loads where
// libxxhash0 is absent) and exports no XXH64 symbol that another copy of xxHash in the process could interpose on.
#include "io/content_hash.h"

#include <ATen/Parallel.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <algorithm>
#include <cstdio>

static_assert(XXH_VERSION_NUMBER >= 700, "speedtorch needs xxHash >= 0.7 (XXH_INLINE_ALL)");

namespace speedtorch::io {
namespace {

// The fold of block hashes is ours (part of the file format, not of XXH64): it mixes with XXH64's primes and final
// avalanche, as it always has.
constexpr uint64_t kP1 = 0x9E3779B185EBCA87ull;
constexpr uint64_t kP2 = 0xC2B2AE3D27D4EB4Full;
constexpr uint64_t kP3 = 0x165667B19E3779F9ull;
constexpr uint64_t kP4 = 0x85EBCA77C2B2AE63ull;
constexpr uint64_t kP5 = 0x27D4EB2F165667C5ull;

inline uint64_t avalanche(uint64_t h) {
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  h *= kP3;
  h ^= h >> 32;
  return h;
}

}  // namespace

uint64_t xxh64(const void* data, std::size_t size, uint64_t seed) { return XXH64(data, size, seed); }

void ContentHasher::fold(uint64_t block_hash) {
  folded_ = avalanche((folded_ ^ block_hash) * kP1 + kP4);
  ++blocks_;
}

void ContentHasher::update(const void* data, std::size_t size) {
  const auto* p = static_cast<const unsigned char*>(data);
  total_ += size;
  if (!partial_.empty()) {  // complete the block started by an earlier call
    const std::size_t take = std::min(size, kBlockBytes - partial_.size());
    partial_.insert(partial_.end(), p, p + take);
    p += take;
    size -= take;
    if (partial_.size() < kBlockBytes) return;
    fold(xxh64(partial_.data(), kBlockBytes, blocks_));
    partial_.clear();
  }
  const std::size_t whole = size / kBlockBytes;
  if (whole > 0) {
    std::vector<uint64_t> hashes(whole);
    const uint64_t first_block = blocks_;
    at::parallel_for(0, static_cast<int64_t>(whole), 8, [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) {
        hashes[b] = xxh64(p + static_cast<std::size_t>(b) * kBlockBytes, kBlockBytes, first_block + b);
      }
    });
    for (const uint64_t h : hashes) fold(h);
    p += whole * kBlockBytes;
    size -= whole * kBlockBytes;
  }
  partial_.assign(p, p + size);
}

uint64_t ContentHasher::digest() const {
  uint64_t h = folded_;
  if (!partial_.empty()) h = avalanche((h ^ xxh64(partial_.data(), partial_.size(), blocks_)) * kP1 + kP4);
  return avalanche(h ^ (static_cast<uint64_t>(total_) * kP5));
}

std::string hash_to_hex(uint64_t hash) {
  char text[17];
  std::snprintf(text, sizeof(text), "%016llx", static_cast<unsigned long long>(hash));
  return text;
}

}  // namespace speedtorch::io
