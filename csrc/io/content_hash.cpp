// Content hash of byte streams: XXH64 per 1 MiB block, blocks hashed in parallel and folded in order (see
// content_hash.h).
#include "io/content_hash.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

namespace speedtorch::io {
namespace {

constexpr uint64_t kP1 = 0x9E3779B185EBCA87ull;
constexpr uint64_t kP2 = 0xC2B2AE3D27D4EB4Full;
constexpr uint64_t kP3 = 0x165667B19E3779F9ull;
constexpr uint64_t kP4 = 0x85EBCA77C2B2AE63ull;
constexpr uint64_t kP5 = 0x27D4EB2F165667C5ull;

inline uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

// Little-endian loads without alignment requirements (the hosts we build for are little-endian).
inline uint64_t load64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
inline uint32_t load32(const unsigned char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

inline uint64_t round64(uint64_t acc, uint64_t input) {
  acc += input * kP2;
  acc = rotl(acc, 31);
  return acc * kP1;
}

inline uint64_t merge_round(uint64_t acc, uint64_t val) {
  acc ^= round64(0, val);
  return acc * kP1 + kP4;
}

inline uint64_t avalanche(uint64_t h) {
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  h *= kP3;
  h ^= h >> 32;
  return h;
}

}  // namespace

uint64_t xxh64(const void* data, std::size_t size, uint64_t seed) {
  const auto* p = static_cast<const unsigned char*>(data);
  const unsigned char* const end = p + size;
  uint64_t h;
  if (size >= 32) {
    uint64_t v1 = seed + kP1 + kP2;
    uint64_t v2 = seed + kP2;
    uint64_t v3 = seed;
    uint64_t v4 = seed - kP1;
    const unsigned char* const limit = end - 32;
    do {
      v1 = round64(v1, load64(p));
      v2 = round64(v2, load64(p + 8));
      v3 = round64(v3, load64(p + 16));
      v4 = round64(v4, load64(p + 24));
      p += 32;
    } while (p <= limit);
    h = rotl(v1, 1) + rotl(v2, 7) + rotl(v3, 12) + rotl(v4, 18);
    h = merge_round(h, v1);
    h = merge_round(h, v2);
    h = merge_round(h, v3);
    h = merge_round(h, v4);
  } else {
    h = seed + kP5;
  }
  h += static_cast<uint64_t>(size);
  while (p + 8 <= end) {
    h ^= round64(0, load64(p));
    h = rotl(h, 27) * kP1 + kP4;
    p += 8;
  }
  if (p + 4 <= end) {
    h ^= static_cast<uint64_t>(load32(p)) * kP1;
    h = rotl(h, 23) * kP2 + kP3;
    p += 4;
  }
  while (p < end) {
    h ^= static_cast<uint64_t>(*p) * kP5;
    h = rotl(h, 11) * kP1;
    ++p;
  }
  return avalanche(h);
}

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
