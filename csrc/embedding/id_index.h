// IdIndex: the host-RAM index of a table that grows (issue 33, docs/dynamic_tables.md): raw int64 ids of any value
// -> slots (rows) of a fixed-capacity PinnedEmbedding, with admission after k sightings and eviction of the
// lowest-scored rows when the table is full. A torch::CustomClass (registered in ops/id_index_class.cpp), so Python,
// TorchScript and C++ share one object. It holds keys only: the rows are the PinnedEmbedding's, and whoever owns both
// (speedtorch/nn/dynamic_embedding.py) initialises the rows assign() admits and reads the rows it evicts.
//
// The map is Tessil's robin_map (Debian robin-map-dev: open addressing, Robin Hood probing, deletion by backward
// shift, so evictions leave no tombstones), header-only: the built library needs nothing more at run time. Abseil's
// flat_hash_map was measured beside it (docs/dynamic_tables.md): lookups within noise of each other; abseil's static
// archives cannot go into a shared library (initial-exec TLS) and its shared ones would be a run-time dependency.
// Keys are mixed (murmur3's finaliser) before probing: std::hash of an integer is the integer itself, and raw ids
// with a common stride would otherwise share buckets. Candidates (ids seen fewer than k times) live in a bounded pool
// of their own, laid out as the slots are.
//
// Memory (docs/dynamic_tables.md measures it): the key is kept once, in a per-slot array; the map is a robin_set of
// 32-bit slots (8-byte buckets) whose hash and equality read the key through that array, with buckets for the keys
// held at a load of at most 0.9 (a bucket count of any size: FastRangeBuckets maps the mixed key's high bits
// onto it, so the map is not rounded up to a power of two). Per slot: the key (8 bytes), then a 12-byte record: its
// two neighbours in its recency list (LRU: one list, oldest first; LFU: one list per count, its buckets chained by
// increasing count) and two 16-bit fields:
//  - its sighting count (exact up to 2^32 - 1, where it saturates);
//  - its gap: the steps from its predecessor's last sighting to its own. A list is in the order its rows were last
//    seen, so gaps are >= 0; the list holds the steps its first and last rows were seen (its first row's gap is 0),
//    which is all that eviction (the first row's age) and appending read; a row's own last step (last_steps(),
//    state()) is the sum along its list. Taking a row out adds its gap to its successor's. Steps are exact int64s.
// A value of 65,535 or more does not fit: the field holds kSpilled and the value is in a small map (spilled_counts_,
// spilled_gaps_). A count spills after 65,535 sightings, so T sightings in all spill at most T / 65,535 counts; the
// gaps of a list add up to its last step minus its first, so a list spills at most (steps so far) / 65,535 gaps:
// both maps stay small beside the table. In all 8 + 8.9 + 12 = 28.9 bytes a key (32.9 with the 16-byte record of
// before, a 32-bit count and a 32-bit last step: 3.7 GiB less for a billion keys). A map load of up to 0.95 instead
// would save 0.5 byte a key more, for finds 15-25% slower (docs/dynamic_tables.md).
// Slots are 32-bit: capacity <= 2^32 - 1. The arrays and the map's buckets are in transparent huge pages once they
// reach 32 MiB (HugePageAllocator): their accesses are random, over gigabytes for a billion keys.
//
// Semantics of assign(ids) = touch(ids), then admit() of the ids it did not find (the Python reference in
// tests/python/test_dynamic_table.py is the same, line by line):
//  1. Ids present in the table are touched, in the batch's order: count += 1, last step = the current step, and they
//     become the most recent (LRU: the end of the list; LFU: the end of their new count's list).
//  2. Ids not present are counted: sightings = the candidate pool's count (if it remembers the id) + occurrences in
//     this batch. Those with sightings >= admit_after are admitted, in the order of their first occurrence in the
//     batch; the others go (back) to the candidate pool with their sightings.
//  3. An admitted id takes the next never-used slot while there is one. Once every slot has been used, it takes the
//     slot of the lowest-scored row not protected (LRU: the least recently seen; LFU: the lowest count, the least
//     recently seen among equal counts), which is evicted: its key leaves the index and assign returns (key, slot).
//     Protected: rows seen in the current step, or since the step `protect_from` given to admit() (a pipeline's
//     oldest step still in flight). When every row is protected, the id is not admitted (it goes back to the
//     candidate pool with its sightings) and neither are the ids after it in this batch.
//  4. An admitted id starts with count = its sightings and is the most recent row. Every occurrence of an id in the
//     batch gets its slot after the admissions; ids not admitted get -1.
// The step advances only by advance_step() (HostEmbedding advances it when no gradient is waiting for the
// optimizer): rows seen in the current step are never evicted, so a slot that has a pending gradient keeps its key.
// The split (touch, then admit) lets a pipeline touch batch t+1 while step t computes and admit its new ids once step
// t's update is done: nothing else changes the index in between, so the slots, admissions and evictions are those of
// one assign() at the admit.
// Candidate pool: holds at most candidate_capacity ids; when it is full, the id seen least recently is forgotten
// (its sightings are lost) to make room.
//
// Threads: as PinnedEmbedding (embedding/table_lock.h): find() and the accessors share the lock; assign(), touch(),
// admit(), advance_step() and load_state() hold it alone, so each call sees the index entirely before or after another.
// Inside a call, the map lookups of a batch of more than 4,096 ids run on several threads (cpu/helped_parallel_for.h:
// they only read), each reading the map ahead of its probes (id_index.cpp, find_slots); counts, recency, admission
// and eviction run on the calling thread, in the batch's order.
//
// CUDA ids are copied to the host, mapped, and their slots copied back to the ids' device (a synchronising copy each
// way; a mapping on the GPU is not yet written).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/custom_class.h>
#include <tsl/robin_map.h>
#include <tsl/robin_set.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "core/id_mix.h"
#include "embedding/table_lock.h"
#include "memory/huge_page_output.h"

namespace speedtorch {

// Every bit of the id reaches the low bits the map's power-of-two buckets use (core/id_mix.h).
struct IdHash {
  size_t operator()(int64_t id) const { return static_cast<size_t>(mix_id(id)); }
};
using IdMap = tsl::robin_map<int64_t, int64_t, IdHash>;

// robin_map's GrowthPolicy (tsl/robin_growth_policy.h's interface) for a bucket count of any size: a hash goes to
// bucket (hash * count) >> 64 (Lemire's fast range: a multiply, no division), which uses the hash's high bits, all of
// them mixed by mix_id. Grows by 2x when the map grows by itself; IdIndex reserves what it needs first.
class FastRangeBuckets {
 public:
  explicit FastRangeBuckets(std::size_t& min_bucket_count_in_out) {
    if (min_bucket_count_in_out > max_bucket_count()) {
      throw std::length_error("speedtorch.IdIndex: the hash map exceeds its maximum size");
    }
    count_ = min_bucket_count_in_out;
  }
  std::size_t bucket_for_hash(std::size_t hash) const noexcept { return bucket_of(hash, count_); }
  // The bucket of a hash among `count` buckets (the batched lookups compute it to read a bucket ahead of its probe).
  static std::size_t bucket_of(std::size_t hash, std::size_t count) noexcept {
    return static_cast<std::size_t>((static_cast<unsigned __int128>(hash) * count) >> 64);
  }
  std::size_t next_bucket_count() const {
    if (count_ > max_bucket_count() / 2) {
      throw std::length_error("speedtorch.IdIndex: the hash map exceeds its maximum size");
    }
    return count_ < 8 ? 16 : count_ * 2;
  }
  std::size_t max_bucket_count() const { return std::size_t{1} << 40; }
  void clear() noexcept { count_ = 0; }

 private:
  std::size_t count_ = 0;
};

// The index's large arrays (gigabytes for a billion keys) live in huge pages: its accesses are random.
template <typename T>
using HugeVector = std::vector<T, HugePageAllocator<T>>;
using KeyArray = HugeVector<int64_t>;

// The hash and equality of a set of 32-bit entries (slots, or candidate entries) whose keys live in a vector: the
// set holds only the entry (4 bytes, in an 8-byte bucket), and looks up by key (is_transparent) or by entry.
struct EntryKeyHash {
  using is_transparent = void;
  const KeyArray* keys = nullptr;
  size_t operator()(uint32_t entry) const { return static_cast<size_t>(mix_id((*keys)[entry])); }
  size_t operator()(int64_t key) const { return static_cast<size_t>(mix_id(key)); }
};
struct EntryKeyEqual {
  using is_transparent = void;
  const KeyArray* keys = nullptr;
  bool operator()(uint32_t a, uint32_t b) const { return (*keys)[a] == (*keys)[b]; }
  bool operator()(uint32_t entry, int64_t key) const { return (*keys)[entry] == key; }
  bool operator()(int64_t key, uint32_t entry) const { return (*keys)[entry] == key; }
};

// A bucket of the sets below (tsl/robin_hash.h's bucket_entry: the distance from the entry's ideal bucket, -1 when
// empty, and the entry), read by the batched lookups ahead of a probe: which keys it compares first. (Were robin_set's
// buckets of another type, as another version of the library might make them, no block would be written down and
// the lookups would run without reading ahead, with the same results.)
using EntryBucket = tsl::detail_robin_hash::bucket_entry<uint32_t, false>;

// Where a set's buckets are: robin_set keeps them in one block of bucket_count() buckets, made by its allocator (a
// rehash makes the new block before it frees the old one), so the allocator that makes a block of EntryBuckets
// writes down where it is.
struct BucketBlock {
  const EntryBucket* start = nullptr;
  std::size_t count = 0;
};
template <typename T>
struct BucketRecordingAllocator : HugePageAllocator<T> {
  using value_type = T;
  BucketRecordingAllocator() = default;
  explicit BucketRecordingAllocator(BucketBlock* block) noexcept : block(block) {}
  template <typename U>
  BucketRecordingAllocator(const BucketRecordingAllocator<U>& other) noexcept  // NOLINT(google-explicit-constructor)
      : block(other.block) {}
  T* allocate(std::size_t n) {
    T* start = HugePageAllocator<T>::allocate(n);
    if constexpr (std::is_same_v<T, EntryBucket>) {
      if (block != nullptr) {
        *block = BucketBlock{start, n};
      }
    }
    return start;
  }
  BucketBlock* block = nullptr;
};

using EntrySet = tsl::robin_set<uint32_t, EntryKeyHash, EntryKeyEqual, BucketRecordingAllocator<uint32_t>, false,
                                FastRangeBuckets>;

class IdIndex : public torch::CustomClassHolder {
 public:
  // capacity: slots (rows of the table, 1 .. 2^32 - 1); admit_after: sightings before an id gets a slot (>= 1);
  // policy: "lru" or "lfu"; candidate_capacity: ids the candidate pool remembers (>= 1 when admit_after > 1; unused
  // when it is 1; at most 2^32 - 1).
  IdIndex(int64_t capacity, int64_t admit_after, const std::string& policy, int64_t candidate_capacity);
  IdIndex(const IdIndex&) = delete;  // the maps' hash and equality point at this index's key arrays
  IdIndex& operator=(const IdIndex&) = delete;

  // Maps ids (any shape, int32/int64, CPU or CUDA) to slots as the top of this file says. Returns (slots: ids'
  // shape, int64, on ids' device, -1 for ids not admitted; admitted: the slots given to new ids, in admission
  // order; evicted_keys, evicted_slots: the rows evicted to make room, in eviction order; the last three int64 on
  // the CPU). The owner must initialise the admitted slots' rows (and read the evicted ones first, if it keeps them).
  std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> assign(const at::Tensor& ids);
  // assign's first half (rule 1): the slots of the ids in the table, which are touched (count, last step, recency),
  // in the batch's order; -1 for the others. Admits and evicts nothing.
  at::Tensor touch(const at::Tensor& ids);
  // assign's second half (rules 2-4) for a batch touch() returned `slots` for, nothing else having changed the
  // index in between: the -1 entries are counted, admitted and evicted as assign would. `protect_from`: rows seen
  // in a step >= it are not evicted either (default: the current step only). Returns as assign.
  std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> admit(const at::Tensor& ids, const at::Tensor& slots,
                                                                   std::optional<int64_t> protect_from);
  // Slots of ids without changing anything (no admission, no count, no recency): -1 for ids not in the table.
  at::Tensor find(const at::Tensor& ids) const;

  // The current step, and moving to the next one (rows seen in the current step cannot be evicted).
  int64_t step() const;
  void advance_step();

  int64_t capacity() const { return capacity_; }
  int64_t admit_after() const { return admit_after_; }
  std::string policy() const;
  int64_t candidate_capacity() const { return candidate_capacity_; }
  // Slots in use (keys held): slots [0, size()) hold keys, the others were never used.
  int64_t size() const;
  // Ids in the candidate pool.
  int64_t candidates() const;
  // Copies, one entry per used slot (slot order): the key, its sighting count, the step it was last seen.
  at::Tensor keys() const;
  at::Tensor counts() const;
  at::Tensor last_steps() const;
  // Room for `keys` keys (at most capacity) made now, so that the index does not grow (and copy itself) while it
  // fills: for a table filled up to its capacity, reserve(capacity) first keeps the peak at the final size.
  void reserve(int64_t keys);
  // Bytes the index holds in host RAM (its arrays' and maps' allocations), for the memory figures.
  int64_t memory_bytes() const;
  // "IdIndex(capacity=..., size=..., policy=lru, admit_after=1, step=..., candidates=...)".
  std::string repr() const;

  // Everything the index holds, as one int64 tensor of shape (3 + capacity + candidate_capacity, 4), so that a table
  // restored from it answers and evicts exactly as this one would:
  //   row 0: (format = 1, capacity, candidate_capacity, admit_after)
  //   row 1: (policy: 0 lru / 1 lfu, step, clock, size)
  //   row 2: (candidates, 0, 0, 0)
  //   rows 3 .. 3 + capacity: one per slot: (key, count, last step, recency stamp); zeros for unused slots
  //   the rest: the candidate pool: (key, sightings, recency stamp, 0) for its first `candidates` rows, then zeros
  // Recency stamps order the rows as they were last seen (LRU: all rows; LFU: rows of one count); this index writes
  // their ranks (1, 2, ...; the candidates after the slots) and clock = the last rank. load_state() puts each list
  // in the order of (last step, stamp), which is the stamps' order for a state() (and keeps the gaps >= 0 for any).
  at::Tensor state() const;
  // Replaces this index's contents with a state() of the same capacity, candidate capacity, admit_after and policy.
  void load_state(const at::Tensor& state);
  // A new index from a state().
  static c10::intrusive_ptr<IdIndex> from_state(const at::Tensor& state);

  static constexpr uint32_t kNone = std::numeric_limits<uint32_t>::max();
  // A slot record's 16-bit field whose value is in its spill map (the top of this file).
  static constexpr uint16_t kSpilled = std::numeric_limits<uint16_t>::max();

 private:
  // One used slot's record, 12 bytes; its key is in keys_. The two 16-bit fields hold kSpilled when their value is in
  // spilled_counts_ / spilled_gaps_ (the top of this file).
  struct SlotMeta {
    uint32_t prev = kNone;  // neighbours in its recency list (LRU: the one list; LFU: its count's)
    uint32_t next = kNone;
    uint16_t count = 0;  // sightings
    uint16_t gap = 0;    // steps from its predecessor's last sighting to its own (its list's first row: 0)
  };
  static_assert(sizeof(SlotMeta) == 12, "a used slot's record is 12 bytes");
  struct CandidateMeta {
    uint32_t count = 0;
    uint32_t prev = kNone;
    uint32_t next = kNone;
  };
  // An intrusive doubly linked list over the prev/next fields of an array of metas, oldest first.
  struct List {
    uint32_t head = kNone;
    uint32_t tail = kNone;
  };
  // A list of used slots, which also holds the steps its first and last rows were last seen (the rows between by
  // their gaps); both are meaningless while it is empty.
  struct SlotList : List {
    int64_t first_step = 0;
    int64_t last_step = 0;
  };
  template <typename Metas>
  static void push_back(Metas& metas, List& list, uint32_t at);
  template <typename Metas>
  static void unlink(Metas& metas, List& list, uint32_t at);
  // LFU: the rows of one count, in recency order; buckets are chained by increasing count, and found by count in
  // bucket_of_count_ (a small map: one entry per distinct count).
  struct Bucket {
    uint32_t count = 0;
    SlotList rows;
    uint32_t lower = kNone;
    uint32_t higher = kNone;
  };

  enum class Policy { kLru, kLfu };

  // The private helpers expect the caller to hold lock_ (exclusively for the ones that change anything).
  // slots[i] = the slot of ids[i] or -1, for n ids, on several threads (helped_parallel_for) for large batches.
  void lookup_locked(const int64_t* ids, int64_t* slots, int64_t n) const;
  // The same for one share of a batch, on the calling thread, reading ahead (id_index.cpp).
  void find_slots(const int64_t* ids, int64_t* slots, int64_t n) const;
  // The start of slot_of_'s buckets when slot_buckets_ is known to be them (nullptr otherwise: no reading ahead).
  const EntryBucket* slot_bucket_start() const;
  // How many keys ahead of its probe the keys that probe compares first are asked for (its bucket: twice as many).
  static constexpr int64_t kReadAhead = 12;
  // Rule 1 over a batch whose slots lookup_locked found.
  void touch_locked(const int64_t* ids, const int64_t* slots, int64_t n);
  // Rules 2-4: the -1 entries of slots (of ids) are counted, admitted and evicted; slots is filled in; rows not
  // older than protect_age steps are not evicted. recheck: look the new ids up again first (admit(): another call
  // may have admitted them since touch()).
  void admit_locked(const int64_t* ids, int64_t* slots, int64_t n, uint64_t protect_age, bool recheck,
                    std::vector<int64_t>& admitted, std::vector<int64_t>& evicted_keys,
                    std::vector<int64_t>& evicted_slots);
  // Room in the map for `keys` keys (reserves ahead, up to capacity, so the map does not grow by itself).
  void reserve_keys(int64_t keys);
  // A slot's count, and setting it (spilling into spilled_counts_ from 65,535 on).
  uint32_t count_of(uint32_t slot) const;
  void set_count(uint32_t slot, uint32_t count);
  // A slot's gap, and setting it (spilling into spilled_gaps_ from 65,535 on).
  uint64_t gap_of(uint32_t slot) const;
  void set_gap(uint32_t slot, uint64_t gap);
  // Appends a slot seen at step `seen` (>= the list's last step) as the list's most recent row, and takes one out;
  // both keep the list's steps and its rows' gaps.
  void append_slot(SlotList& list, uint32_t slot, int64_t seen);
  void remove_slot(SlotList& list, uint32_t slot);
  // Puts a slot in the recency structure as the most recent row of its count, seen in the current step (LRU: the
  // list; LFU: its count's bucket, created when missing).
  void link_slot(uint32_t slot);
  void unlink_slot(uint32_t slot);
  // Calls visit(slot, the step it was last seen) for every used slot, list by list in recency order (LRU: the list;
  // LFU: the lowest count's first).
  template <typename Visit>
  void for_each_slot_in_order(Visit&& visit) const;
  // A sighting of a row already in the table.
  void touch_slot(uint32_t slot);
  // The lowest-scored row seen more than protect_age steps ago, or kNone when there is none.
  uint32_t victim(uint64_t protect_age) const;
  // LFU bucket chain: the bucket of `count`, made above `below` (kNone: at the bottom) when missing.
  uint32_t bucket_for_count_after(uint32_t below, uint32_t count);
  void drop_bucket_if_empty(uint32_t bucket);
  // The candidate pool.
  void remember_candidate(int64_t key, int64_t sightings);
  void forget_candidate(int64_t key);
  void clear();
  void check_state(const at::Tensor& state) const;

  int64_t capacity_;
  int64_t admit_after_;
  Policy policy_;
  int64_t candidate_capacity_;

  KeyArray keys_;                // per used slot: its key (the only copy)
  HugeVector<SlotMeta> meta_;    // per used slot
  tsl::robin_map<uint32_t, uint32_t> spilled_counts_;  // slot -> its count, where it does not fit in its record
  tsl::robin_map<uint32_t, uint64_t> spilled_gaps_;    // slot -> its gap, where it does not fit in its record
  BucketBlock slot_buckets_;     // where slot_of_'s buckets are (its allocator writes it; before slot_of_)
  EntrySet slot_of_;             // the used slots, found by key through keys_
  SlotList lru_;                 // LRU: every used slot, least recently seen first
  std::vector<Bucket> buckets_;  // LFU: bucket storage (free ones reused through free_buckets_)
  std::vector<uint32_t> free_buckets_;
  tsl::robin_map<uint32_t, uint32_t> bucket_of_count_;  // LFU: count -> its bucket
  uint32_t lowest_bucket_ = kNone;                      // LFU: the bucket of the lowest count
  int64_t size_ = 0;
  int64_t step_ = 0;

  KeyArray candidate_keys_;  // per candidate entry (free ones reused through free_candidates_)
  HugeVector<CandidateMeta> candidate_meta_;
  EntrySet candidate_of_;  // the entries in the pool, found by key through candidate_keys_
  std::vector<uint32_t> free_candidates_;
  List candidate_recency_;  // least recently seen first

  mutable TableLock lock_;
};

}  // namespace speedtorch
