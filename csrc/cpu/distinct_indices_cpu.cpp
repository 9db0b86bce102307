// Distinct row ids and their inverse on the calling thread (see distinct_indices_cpu.h).
#include "cpu/distinct_indices_cpu.h"

#include <algorithm>
#include <vector>

namespace speedtorch {
namespace {

// One slot of the open-addressing table: an index value and the order in which it was first seen.
struct Entry {
  int64_t value;
  int64_t first_seen;  // -1: empty
};

inline uint64_t slot_hash(int64_t value, int shift) {
  return (static_cast<uint64_t>(value) * 0x9E3779B97F4A7C15ull) >> shift;
}

// The entry holding `value`, or the empty one where it belongs (linear probing).
inline Entry& find_entry(std::vector<Entry>& table, int64_t value, int shift) {
  const uint64_t mask = table.size() - 1;
  uint64_t h = slot_hash(value, shift);
  while (table[h].first_seen >= 0 && table[h].value != value) h = (h + 1) & mask;
  return table[h];
}

// Ids within a span of at most this many 64-bit words per id take the bitmap (with its ranks, 16 bytes a word: no
// more memory than the hash table's 32 bytes an id); sparser ones the hash table.
constexpr uint64_t kBitmapWordsPerId = 2;

// The bitmap's inverse pass: each id's place is the distinct values below its word plus the set bits below it in
// its word.
__attribute__((always_inline)) inline void bitmap_places(const uint64_t* offsets, int64_t count, const uint64_t* bits,
                                                         const int64_t* rank, int64_t* inverse) {
  for (int64_t i = 0; i < count; ++i) {
    const uint64_t o = offsets[i];
    const uint64_t below = bits[o >> 6] & ((uint64_t{1} << (o & 63)) - 1);
    inverse[i] = rank[o >> 6] + __builtin_popcountll(below);
  }
}

#if defined(__x86_64__)
// The same with the popcnt instruction, chosen at run time (the library still runs on any x86-64; without it, a call
// to libgcc a count). Not target_clones: its resolver runs while the library is relocated, before ThreadSanitizer's
// runtime is ready, and crashed make tsan.
__attribute__((target("popcnt"))) void bitmap_places_popcnt(const uint64_t* offsets, int64_t count,
                                                             const uint64_t* bits, const int64_t* rank,
                                                             int64_t* inverse) {
  bitmap_places(offsets, count, bits, rank, inverse);
}

const bool kHasPopcnt = __builtin_cpu_supports("popcnt");
#endif

void bitmap_places_best(const uint64_t* offsets, int64_t count, const uint64_t* bits, const int64_t* rank,
                        int64_t* inverse) {
#if defined(__x86_64__)
  if (kHasPopcnt) return bitmap_places_popcnt(offsets, count, bits, rank, inverse);
#endif
  bitmap_places(offsets, count, bits, rank, inverse);
}

// Ids within a small span (a table's rows: HostEmbedding's ids): a bit per value of the span, set for each id, then
// read in order; no sort. `inverse` first holds each id's offset from `lo`.
template <typename Index>
int64_t distinct_by_bitmap(const Index* indices, int64_t count, int64_t lo, uint64_t span, int64_t* distinct,
                           int64_t* inverse) {
  const uint64_t words = span / 64 + 1;
  std::vector<uint64_t> bits(words, 0);
  uint64_t* offsets = reinterpret_cast<uint64_t*>(inverse);
  for (int64_t i = 0; i < count; ++i) {
    const uint64_t o = static_cast<uint64_t>(static_cast<int64_t>(indices[i])) - static_cast<uint64_t>(lo);
    offsets[i] = o;
    bits[o >> 6] |= uint64_t{1} << (o & 63);
  }
  std::vector<int64_t> rank(words);  // distinct values in the words before
  int64_t n = 0;
  for (uint64_t w = 0; w < words; ++w) {
    rank[w] = n;
    for (uint64_t b = bits[w]; b != 0; b &= b - 1) {
      const uint64_t offset = w * 64 + static_cast<uint64_t>(__builtin_ctzll(b));
      distinct[n++] = static_cast<int64_t>(static_cast<uint64_t>(lo) + offset);  // wraps back into int64's range
    }
  }
  bitmap_places_best(offsets, count, bits.data(), rank.data(), inverse);
  return n;
}

// Any ids: a hash table finds the distinct values in first-seen order, only those are sorted, and each position
// is mapped to its value's place.
template <typename Index>
int64_t distinct_by_hash(const Index* indices, int64_t count, int64_t* distinct, int64_t* inverse) {
  // At most half full, so probes stay short.
  int bits = 4;
  while ((int64_t{1} << bits) < 2 * count) ++bits;
  std::vector<Entry> table(size_t{1} << bits, Entry{0, -1});
  const int shift = 64 - bits;
  int64_t n = 0;
  for (int64_t i = 0; i < count; ++i) {  // inverse[i]: first-seen order for now
    const int64_t value = static_cast<int64_t>(indices[i]);
    Entry& e = find_entry(table, value, shift);
    if (e.first_seen < 0) {
      e = Entry{value, n};
      distinct[n++] = value;
    }
    inverse[i] = e.first_seen;
  }
  std::sort(distinct, distinct + n);
  std::vector<int64_t> place(static_cast<size_t>(n));  // first-seen order -> place in ascending order
  for (int64_t r = 0; r < n; ++r) place[find_entry(table, distinct[r], shift).first_seen] = r;
  for (int64_t i = 0; i < count; ++i) inverse[i] = place[inverse[i]];
  return n;
}

}  // namespace

template <typename Index>
int64_t distinct_indices_cpu(const Index* indices, int64_t count, int64_t* distinct, int64_t* inverse) {
  if (count == 0) return 0;
  int64_t lo = INT64_MAX;
  int64_t hi = INT64_MIN;
  for (int64_t i = 0; i < count; ++i) {
    lo = std::min<int64_t>(lo, indices[i]);
    hi = std::max<int64_t>(hi, indices[i]);
  }
  const uint64_t span = static_cast<uint64_t>(hi) - static_cast<uint64_t>(lo);  // hi - lo, without overflow
  if (span / 64 / kBitmapWordsPerId < static_cast<uint64_t>(count)) {
    return distinct_by_bitmap(indices, count, lo, span, distinct, inverse);
  }
  return distinct_by_hash(indices, count, distinct, inverse);
}

template int64_t distinct_indices_cpu<int32_t>(const int32_t*, int64_t, int64_t*, int64_t*);
template int64_t distinct_indices_cpu<int64_t>(const int64_t*, int64_t, int64_t*, int64_t*);

}  // namespace speedtorch
