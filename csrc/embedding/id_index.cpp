// IdIndex (id_index.h): raw id -> slot with admission and eviction. The semantics are written at the top of
// id_index.h; this file keeps the recency structures (one list for LRU, lists per count for LFU, each row's last
// step as its gap from its predecessor's) and the candidate pool consistent with them, in the compact per-slot
// arrays id_index.h lays out.
#include "embedding/id_index.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <limits>
#include <mutex>
#include <numeric>
#include <shared_mutex>
#include <sstream>
#include <tuple>
#include <utility>

#include "cpu/helped_parallel_for.h"

namespace speedtorch {

namespace {

constexpr int64_t kStateFormat = 1;
constexpr int64_t kHeaderRows = 3;
// Ids per task of the parallel lookups (16 tasks for a batch of 65,536): below this a batch is looked up on the
// calling thread alone.
constexpr int64_t kLookupGrain = 4096;
// The maps' load at most (robin_map's limit is 0.95; Robin Hood probing stays short at 0.9).
constexpr double kMaxLoad = 0.9;
constexpr int64_t kMaxEntries = static_cast<int64_t>(IdIndex::kNone);  // 32-bit entries, kNone excluded

// ids as a flat, contiguous int64 CPU tensor (a copy to the host for CUDA ids).
at::Tensor host_ids(const at::Tensor& ids, const char* op) {
  TORCH_CHECK(ids.defined(), "speedtorch.IdIndex.", op, ": ids must be a tensor, got an undefined one");
  TORCH_CHECK(ids.scalar_type() == at::kLong || ids.scalar_type() == at::kInt, "speedtorch.IdIndex.", op,
              ": ids must be int64 (or int32) raw ids, got ", ids.scalar_type(),
              "; convert them with ids.to(torch.int64)");
  return ids.to(at::kCPU, at::kLong).contiguous().view({-1});
}

// Reading ahead of a probe of a set of entries whose keys are in `keys` (tsl/robin_hash.h's find_impl), for a key
// of this hash among `count` buckets from `buckets`: first its buckets are asked for; once they have arrived, the
// keys the probe compares first (its ideal bucket's entry, and the next bucket's if the probe reaches it: an entry
// at least as far from its own ideal bucket). Prefetches only: they change nothing.
inline void ask_for_bucket(const EntryBucket* buckets, std::size_t count, std::size_t hash) {
  const std::size_t at = FastRangeBuckets::bucket_of(hash, count);
  __builtin_prefetch(buckets + at);
  __builtin_prefetch(buckets + std::min(at + 4, count - 1));  // a probe's later buckets, when on the next line
}

inline void ask_for_probe_keys(const EntryBucket* buckets, std::size_t count, const int64_t* keys, std::size_t hash) {
  // Two keys, without a branch: a probe compares about 1.5 keys at a load of 0.45 and 5 at 0.9, but a loop over
  // the probe's buckets (an unpredictable exit) cost more than the later keys' waits (bench/RESULTS.md, the
  // fourteenth session). Where the probe ends sooner, keys[0] is asked for: in cache already.
  constexpr int kProbeReads = 2;
  std::size_t at = FastRangeBuckets::bucket_of(hash, count);
  for (int distance = 0; distance < kProbeReads; ++distance) {
    const EntryBucket& bucket = buckets[at];
    const std::size_t entry = bucket.dist_from_ideal_bucket() >= distance ? bucket.value() : 0;
    __builtin_prefetch(keys + entry);
    at = at + 1 == count ? 0 : at + 1;
  }
}

// Counts saturate at the largest 32-bit value.
constexpr uint32_t kMaxCount = std::numeric_limits<uint32_t>::max();

uint32_t saturated(int64_t count) {
  return static_cast<uint32_t>(std::min<int64_t>(count, static_cast<int64_t>(kMaxCount)));
}

// Makes `keys` fit in `set` and `arrays` (vectors of one entry per key) without growing again while the count stays
// below it: they grow to max(keys, 2 x their size), never past `limit`, so a full index holds exactly what its
// capacity needs (no power-of-two rounding) and the map never rehashes by itself.
template <typename... Arrays>
void reserve_entries(EntrySet& set, int64_t keys, int64_t limit, Arrays&... arrays) {
  const double room = static_cast<double>(set.bucket_count()) * kMaxLoad * (1.0 - 1e-5) - 2.0;
  if (static_cast<double>(keys) <= room) {
    return;
  }
  const int64_t target = std::max(keys, std::min(limit, 2 * static_cast<int64_t>(set.size())));
  set.rehash(static_cast<size_t>(static_cast<double>(target) / kMaxLoad * (1.0 + 1e-5)) + 16);
  (arrays.reserve(static_cast<size_t>(target)), ...);
}

}  // namespace

template <typename Metas>
void IdIndex::push_back(Metas& metas, List& list, uint32_t at) {
  metas[at].prev = list.tail;
  metas[at].next = kNone;
  if (list.tail == kNone) {
    list.head = at;
  } else {
    metas[list.tail].next = at;
  }
  list.tail = at;
}

template <typename Metas>
void IdIndex::unlink(Metas& metas, List& list, uint32_t at) {
  const uint32_t before = metas[at].prev, after = metas[at].next;
  if (before == kNone) {
    list.head = after;
  } else {
    metas[before].next = after;
  }
  if (after == kNone) {
    list.tail = before;
  } else {
    metas[after].prev = before;
  }
  metas[at].prev = metas[at].next = kNone;
}

IdIndex::IdIndex(int64_t capacity, int64_t admit_after, const std::string& policy, int64_t candidate_capacity)
    : capacity_(capacity),
      admit_after_(admit_after),
      candidate_capacity_(candidate_capacity),
      slot_of_(0, EntryKeyHash{&keys_}, EntryKeyEqual{&keys_}, BucketRecordingAllocator<uint32_t>(&slot_buckets_)),
      candidate_of_(0, EntryKeyHash{&candidate_keys_}, EntryKeyEqual{&candidate_keys_}) {
  TORCH_CHECK(capacity >= 1 && capacity <= kMaxEntries, "speedtorch.IdIndex: capacity must be >= 1 (the table's rows) and <= ",
              kMaxEntries, " (slots are 32-bit), got ", capacity);
  TORCH_CHECK(admit_after >= 1, "speedtorch.IdIndex: admit_after must be >= 1 (sightings before an id gets a row), "
              "got ", admit_after);
  TORCH_CHECK(policy == "lru" || policy == "lfu", "speedtorch.IdIndex: policy must be 'lru' or 'lfu', got '", policy,
              "'");
  TORCH_CHECK(candidate_capacity >= 0 && candidate_capacity <= kMaxEntries,
              "speedtorch.IdIndex: candidate_capacity must be >= 0 and <= ", kMaxEntries, ", got ",
              candidate_capacity);
  TORCH_CHECK(admit_after == 1 || candidate_capacity >= 1, "speedtorch.IdIndex: admit_after=", admit_after,
              " needs a candidate pool to count sightings across batches: candidate_capacity must be >= 1, got 0");
  policy_ = policy == "lru" ? Policy::kLru : Policy::kLfu;
  slot_of_.max_load_factor(static_cast<float>(kMaxLoad));
  candidate_of_.max_load_factor(static_cast<float>(kMaxLoad));
}

// --- the recency structures -----------------------------------------------------------------------------------------

uint32_t IdIndex::bucket_for_count_after(uint32_t below, uint32_t count) {
  // Walks up from `below` (a bucket of a count <= `count`; kNone: from the lowest) to the bucket of `count`, making
  // it where it belongs when there is none.
  uint32_t lower = kNone, at = lowest_bucket_;
  if (below != kNone) {
    lower = buckets_[below].lower;
    at = below;
  }
  while (at != kNone && buckets_[at].count < count) {
    lower = at;
    at = buckets_[at].higher;
  }
  if (at != kNone && buckets_[at].count == count) {
    return at;
  }
  uint32_t made;
  if (!free_buckets_.empty()) {
    made = free_buckets_.back();
    free_buckets_.pop_back();
  } else {
    made = static_cast<uint32_t>(buckets_.size());
    buckets_.emplace_back();
  }
  buckets_[made] = Bucket{count, SlotList{}, lower, at};
  if (lower == kNone) {
    lowest_bucket_ = made;
  } else {
    buckets_[lower].higher = made;
  }
  if (at != kNone) {
    buckets_[at].lower = made;
  }
  bucket_of_count_[count] = made;
  return made;
}

void IdIndex::drop_bucket_if_empty(uint32_t bucket) {
  Bucket& b = buckets_[bucket];
  if (b.rows.head != kNone) {
    return;
  }
  if (b.lower == kNone) {
    lowest_bucket_ = b.higher;
  } else {
    buckets_[b.lower].higher = b.higher;
  }
  if (b.higher != kNone) {
    buckets_[b.higher].lower = b.lower;
  }
  bucket_of_count_.erase(b.count);
  b = Bucket{};
  free_buckets_.push_back(bucket);
}

// A 16-bit field of a slot's record with its spill map (id_index.h): the value, or kSpilled and the value in the map.
template <typename Map>
inline typename Map::mapped_type read_field(uint16_t field, const Map& spilled, uint32_t slot) {
  return field != IdIndex::kSpilled ? field : spilled.find(slot)->second;
}

template <typename Map>
inline void write_field(uint16_t& field, Map& spilled, uint32_t slot, typename Map::mapped_type value) {
  if (value < IdIndex::kSpilled) {
    if (field == IdIndex::kSpilled) {
      spilled.erase(slot);
    }
    field = static_cast<uint16_t>(value);
  } else {
    field = IdIndex::kSpilled;
    spilled[slot] = value;
  }
}

// The per-sighting helpers below are inline (defined and used in this file only) so that they are inlined: a member
// of the library's exported class is otherwise called through the PLT (-fPIC, default visibility), which costs more
// than their work.
inline uint32_t IdIndex::count_of(uint32_t slot) const { return read_field(meta_[slot].count, spilled_counts_, slot); }

inline void IdIndex::set_count(uint32_t slot, uint32_t count) {
  write_field(meta_[slot].count, spilled_counts_, slot, count);
}

inline uint64_t IdIndex::gap_of(uint32_t slot) const { return read_field(meta_[slot].gap, spilled_gaps_, slot); }

inline void IdIndex::set_gap(uint32_t slot, uint64_t gap) { write_field(meta_[slot].gap, spilled_gaps_, slot, gap); }

inline void IdIndex::append_slot(SlotList& list, uint32_t slot, int64_t seen) {
  if (list.tail == kNone) {
    list.first_step = seen;
    set_gap(slot, 0);
  } else {
    set_gap(slot, static_cast<uint64_t>(seen - list.last_step));
  }
  list.last_step = seen;
  push_back(meta_, list, slot);
}

inline void IdIndex::remove_slot(SlotList& list, uint32_t slot) {
  // The row after it takes its gap over (the first row's gap goes to the list's first step), so every other row's
  // step stays what it was; without a row after it, the list's last row is now the one before it.
  const uint32_t before = meta_[slot].prev, after = meta_[slot].next;
  const uint64_t gap = gap_of(slot);
  if (after != kNone) {
    if (before == kNone) {
      list.first_step += static_cast<int64_t>(gap_of(after));
      set_gap(after, 0);
    } else {
      set_gap(after, gap_of(after) + gap);
    }
  } else if (before != kNone) {
    list.last_step -= static_cast<int64_t>(gap);
  }
  unlink(meta_, list, slot);  // its own gap is set when it is appended again
}

void IdIndex::link_slot(uint32_t slot) {
  if (policy_ == Policy::kLru) {
    append_slot(lru_, slot, step_);
    return;
  }
  const uint32_t bucket = bucket_for_count_after(kNone, count_of(slot));
  append_slot(buckets_[bucket].rows, slot, step_);
}

void IdIndex::unlink_slot(uint32_t slot) {
  if (policy_ == Policy::kLru) {
    remove_slot(lru_, slot);
    return;
  }
  const uint32_t bucket = bucket_of_count_.find(count_of(slot))->second;
  remove_slot(buckets_[bucket].rows, slot);
  drop_bucket_if_empty(bucket);
}

template <typename Visit>
void IdIndex::for_each_slot_in_order(Visit&& visit) const {
  auto walk = [&](const SlotList& list) {
    int64_t seen = list.first_step;
    for (uint32_t slot = list.head; slot != kNone; slot = meta_[slot].next) {
      seen += static_cast<int64_t>(gap_of(slot));
      visit(slot, seen);
    }
  };
  if (policy_ == Policy::kLru) {
    walk(lru_);
    return;
  }
  for (uint32_t b = lowest_bucket_; b != kNone; b = buckets_[b].higher) {
    walk(buckets_[b].rows);
  }
}

inline void IdIndex::touch_slot(uint32_t slot) {
  const uint32_t count = count_of(slot);
  if (policy_ == Policy::kLru) {
    if (count != kMaxCount) {
      set_count(slot, count + 1);
    }
    remove_slot(lru_, slot);
    append_slot(lru_, slot, step_);
    return;
  }
  const uint32_t from = bucket_of_count_.find(count)->second;
  remove_slot(buckets_[from].rows, slot);
  if (count == kMaxCount) {  // saturated: the most recent of its count
    append_slot(buckets_[from].rows, slot, step_);
    return;
  }
  set_count(slot, count + 1);
  const uint32_t to = bucket_for_count_after(from, count + 1);
  append_slot(buckets_[to].rows, slot, step_);
  drop_bucket_if_empty(from);
}

uint32_t IdIndex::victim(uint64_t protect_age) const {
  // In the LRU list, and within each LFU bucket, rows are in the order they were last seen, so in the order of
  // their last steps: when the first one is protected, so are all the others.
  auto oldest_unprotected = [&](const SlotList& list) {
    const bool old = list.head != kNone && static_cast<uint64_t>(step_ - list.first_step) > protect_age;
    return old ? list.head : kNone;
  };
  if (policy_ == Policy::kLru) {
    return oldest_unprotected(lru_);
  }
  for (uint32_t b = lowest_bucket_; b != kNone; b = buckets_[b].higher) {
    const uint32_t oldest = oldest_unprotected(buckets_[b].rows);
    if (oldest != kNone) {
      return oldest;
    }
  }
  return kNone;
}

// --- the candidate pool ---------------------------------------------------------------------------------------------

void IdIndex::remember_candidate(int64_t key, int64_t sightings) {
  if (admit_after_ == 1 || candidate_capacity_ == 0) {
    return;  // every id qualifies at its first sighting: nothing to count
  }
  auto found = candidate_of_.find(key);
  if (found != candidate_of_.end()) {
    const uint32_t entry = *found;
    candidate_meta_[entry].count = saturated(sightings);
    unlink(candidate_meta_, candidate_recency_, entry);
    push_back(candidate_meta_, candidate_recency_, entry);
    return;
  }
  if (static_cast<int64_t>(candidate_of_.size()) == candidate_capacity_) {
    forget_candidate(candidate_keys_[candidate_recency_.head]);  // full: the one seen least recently goes
  }
  uint32_t entry;
  if (!free_candidates_.empty()) {
    entry = free_candidates_.back();
    free_candidates_.pop_back();
    candidate_keys_[entry] = key;
  } else {
    reserve_entries(candidate_of_, static_cast<int64_t>(candidate_keys_.size()) + 1, candidate_capacity_,
                    candidate_keys_, candidate_meta_);
    entry = static_cast<uint32_t>(candidate_keys_.size());
    candidate_keys_.push_back(key);
    candidate_meta_.emplace_back();
  }
  candidate_meta_[entry].count = saturated(sightings);
  push_back(candidate_meta_, candidate_recency_, entry);
  candidate_of_.insert(entry);
}

void IdIndex::forget_candidate(int64_t key) {
  auto found = candidate_of_.find(key);
  if (found == candidate_of_.end()) {
    return;
  }
  const uint32_t entry = *found;
  candidate_of_.erase(found);
  unlink(candidate_meta_, candidate_recency_, entry);
  free_candidates_.push_back(entry);
}

// --- lookups --------------------------------------------------------------------------------------------------------

void IdIndex::lookup_locked(const int64_t* ids, int64_t* slots, int64_t n) const {
  helped_parallel_for(n, kLookupGrain,
                      [&](int64_t begin, int64_t end) { find_slots(ids + begin, slots + begin, end - begin); });
}

const EntryBucket* IdIndex::slot_bucket_start() const {
  // The block the allocator wrote down is the set's when it has bucket_count() buckets and holds the bucket of a
  // key in the set (find's iterator refers into it); otherwise (an empty set) nothing is read ahead.
  if (size_ == 0 || slot_buckets_.count != slot_of_.bucket_count()) {
    return nullptr;
  }
  const auto held = slot_of_.find(keys_[0]);  // slot 0 holds a key once size_ > 0
  if (held == slot_of_.end()) {
    return nullptr;
  }
  const auto* first = reinterpret_cast<const unsigned char*>(&*held);
  const auto* start = reinterpret_cast<const unsigned char*>(slot_buckets_.start);
  const bool inside = first >= start && first < start + slot_buckets_.count * sizeof(EntryBucket);
  return inside ? slot_buckets_.start : nullptr;
}

void IdIndex::find_slots(const int64_t* ids, int64_t* slots, int64_t n) const {
  // A probe is two random reads at least: the id's bucket, then the key of each entry it compares, through keys_
  // (about 1.5 at a load of 0.45, 5 at 0.9). Asked for one at a time, each waits for memory. So the lookups run as
  // a pipeline: id i + 2 * kReadAhead is hashed and its bucket asked for; id i + kReadAhead's bucket (arrived by
  // now) tells which keys its probe compares first, and those are asked for; id i is found by robin_set's own find,
  // with the hash computed at the first stage, in what is in cache by then. The reads ahead only prefetch: they
  // change no result.
  constexpr int64_t kRing = 32;  // the hashes of ids i .. i + 2 * kReadAhead
  static_assert(2 * kReadAhead < kRing && (kRing & (kRing - 1)) == 0, "the ring holds the ids between the stages");
  const EntryBucket* buckets = slot_bucket_start();
  const std::size_t count = slot_of_.bucket_count();
  if (buckets == nullptr) {
    for (int64_t i = 0; i < n; ++i) {
      auto found = slot_of_.find(ids[i]);
      slots[i] = found == slot_of_.end() ? -1 : static_cast<int64_t>(*found);
    }
    return;
  }
  std::size_t hashes[kRing];
  for (int64_t i = 0; i < n + 2 * kReadAhead; ++i) {
    if (i < n) {
      const std::size_t hash = static_cast<std::size_t>(mix_id(ids[i]));
      hashes[i & (kRing - 1)] = hash;
      ask_for_bucket(buckets, count, hash);
    }
    const int64_t probed = i - kReadAhead, found_now = i - 2 * kReadAhead;
    if (probed >= 0 && probed < n) {
      ask_for_probe_keys(buckets, count, keys_.data(), hashes[probed & (kRing - 1)]);
    }
    if (found_now >= 0) {
      auto found = slot_of_.find(ids[found_now], hashes[found_now & (kRing - 1)]);
      slots[found_now] = found == slot_of_.end() ? -1 : static_cast<int64_t>(*found);
    }
  }
}

void IdIndex::touch_locked(const int64_t* ids, const int64_t* slots, int64_t n) {
  (void)ids;
  // Per-slot records are random accesses: ask for the one kAhead sightings on early, and for its list neighbours
  // (which a sighting relinks) kAhead / 2 sightings on, once the record itself has arrived. A record is 12 bytes:
  // one in eight spans two cache lines, so both of its ends are asked for. (A sighting reads its successor's gap,
  // a load that waits for the record where the unlinking's stores did not: 16 sightings ahead, as before the gaps,
  // made assign of LRU 5-15% slower on the 2-core machine; 32 is within noise of before, docs/dynamic_tables.md.)
  constexpr int64_t kAhead = 32;
  auto ask_for_record = [&](int64_t slot) {
    const char* record = reinterpret_cast<const char*>(&meta_[slot]);
    __builtin_prefetch(record, 1);
    __builtin_prefetch(record + sizeof(SlotMeta) - 1, 1);
  };
  for (int64_t i = 0; i < n; ++i) {
    if (i + kAhead < n && slots[i + kAhead] != -1) {
      ask_for_record(slots[i + kAhead]);
    }
    if (i + kAhead / 2 < n && slots[i + kAhead / 2] != -1) {
      const SlotMeta& ahead = meta_[slots[i + kAhead / 2]];
      if (ahead.prev != kNone) {
        ask_for_record(ahead.prev);
      }
      if (ahead.next != kNone) {
        ask_for_record(ahead.next);
      }
    }
    if (slots[i] != -1) {
      touch_slot(static_cast<uint32_t>(slots[i]));
    }
  }
}

void IdIndex::admit_locked(const int64_t* ids, int64_t* slots, int64_t n, uint64_t protect_age, bool recheck,
                           std::vector<int64_t>& admitted, std::vector<int64_t>& evicted_keys,
                           std::vector<int64_t>& evicted_slots) {
  // 2. The ids touch() did not find, counted in the order of their first occurrence. Until its slot is known, each
  // of them holds its place among them in slots, as -2 - place: no id is looked up twice.
  const int64_t misses = std::count(slots, slots + n, int64_t{-1});
  if (misses == 0) {
    return;
  }
  IdMap place(static_cast<size_t>(misses) * 2);  // key -> its place in new_keys (robin_map's load <= 0.5)
  std::vector<int64_t> new_keys, outcome;        // outcome: its sightings, then its slot (or -1)
  new_keys.reserve(static_cast<size_t>(misses));
  outcome.reserve(static_cast<size_t>(misses));
  for (int64_t i = 0; i < n; ++i) {
    if (slots[i] != -1) {
      continue;
    }
    auto placed = place.try_emplace(ids[i], static_cast<int64_t>(new_keys.size()));
    if (placed.second) {
      new_keys.push_back(ids[i]);
      outcome.push_back(0);
    }
    outcome[placed.first->second] += 1;
    slots[i] = -2 - placed.first->second;
  }
  place = IdMap();
  reserve_entries(slot_of_, std::min(capacity_, size_ + static_cast<int64_t>(new_keys.size())), capacity_, keys_,
                  meta_);
  // 3. Admissions, evicting where the table is full. Each new key's probe of slot_of_ (the lookup of recheck, the
  // insert) is read ahead as find_slots' are.
  const int64_t added = static_cast<int64_t>(new_keys.size());
  const EntryBucket* buckets = slot_bucket_start();
  std::size_t bucket_count = slot_of_.bucket_count();
  auto hash_of = [&](int64_t j) { return static_cast<std::size_t>(mix_id(new_keys[static_cast<size_t>(j)])); };
  bool table_busy = false;  // every row is protected: nothing more is admitted in this batch
  for (int64_t j = 0; j < added; ++j) {
    if (buckets != nullptr) {
      if (j + 2 * kReadAhead < added) {
        ask_for_bucket(buckets, bucket_count, hash_of(j + 2 * kReadAhead));
      }
      if (j + kReadAhead < added) {
        ask_for_probe_keys(buckets, bucket_count, keys_.data(), hash_of(j + kReadAhead));
      }
    }
    const int64_t key = new_keys[j];
    if (recheck) {
      auto found = slot_of_.find(key);
      if (found != slot_of_.end()) {  // admitted since touch() (not by this batch): it reads its slot
        outcome[j] = *found;
        continue;
      }
    }
    int64_t sightings = outcome[j];
    outcome[j] = -1;
    auto remembered = candidate_of_.find(key);
    if (remembered != candidate_of_.end()) {
      sightings += candidate_meta_[*remembered].count;
    }
    uint32_t slot = kNone;
    if (!table_busy && sightings >= admit_after_) {
      if (size_ < capacity_) {
        slot = static_cast<uint32_t>(size_++);
        keys_.push_back(key);
        meta_.emplace_back();
      } else {
        slot = victim(protect_age);
        if (slot == kNone) {
          table_busy = true;
        } else {
          evicted_keys.push_back(keys_[slot]);
          evicted_slots.push_back(slot);
          slot_of_.erase(keys_[slot]);
          unlink_slot(slot);
          keys_[slot] = key;
        }
      }
    }
    if (slot == kNone) {
      remember_candidate(key, sightings);
      continue;
    }
    // 4. The new row: count = its sightings, the most recent.
    forget_candidate(key);
    set_count(slot, saturated(sightings));
    slot_of_.insert(slot);
    if (slot_of_.bucket_count() != bucket_count) {  // the set grew by itself: its buckets moved
      bucket_count = slot_of_.bucket_count();
      buckets = slot_bucket_start();
    }
    link_slot(slot);
    admitted.push_back(slot);
    outcome[j] = slot;
  }
  for (int64_t i = 0; i < n; ++i) {
    if (slots[i] <= -2) {
      slots[i] = outcome[static_cast<size_t>(-2 - slots[i])];
    }
  }
}

namespace {

template <typename Vector>
at::Tensor as_tensor(const Vector& values) {
  return at::tensor(c10::ArrayRef<int64_t>(values.data(), values.size()), at::TensorOptions().dtype(at::kLong));
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> IdIndex::assign(const at::Tensor& ids) {
  const at::Tensor host = host_ids(ids, "assign");
  const int64_t n = host.numel();
  at::Tensor slots = at::empty({n}, at::TensorOptions().dtype(at::kLong));
  const int64_t* in = host.data_ptr<int64_t>();
  int64_t* out = slots.data_ptr<int64_t>();
  std::vector<int64_t> admitted, evicted_keys, evicted_slots;
  {
    std::unique_lock<TableLock> guard(lock_);
    // The lookups only read the map: they run on several threads first (this thread holds the lock for all).
    lookup_locked(in, out, n);
    touch_locked(in, out, n);
    admit_locked(in, out, n, 0, /*recheck=*/false, admitted, evicted_keys, evicted_slots);
  }
  return {slots.view(ids.sizes()).to(ids.device()), as_tensor(admitted), as_tensor(evicted_keys),
          as_tensor(evicted_slots)};
}

at::Tensor IdIndex::touch(const at::Tensor& ids) {
  const at::Tensor host = host_ids(ids, "touch");
  const int64_t n = host.numel();
  at::Tensor slots = at::empty({n}, at::TensorOptions().dtype(at::kLong));
  {
    std::unique_lock<TableLock> guard(lock_);
    lookup_locked(host.data_ptr<int64_t>(), slots.data_ptr<int64_t>(), n);
    touch_locked(host.data_ptr<int64_t>(), slots.data_ptr<int64_t>(), n);
  }
  return slots.view(ids.sizes()).to(ids.device());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> IdIndex::admit(const at::Tensor& ids,
                                                                          const at::Tensor& given_slots,
                                                                          std::optional<int64_t> protect_from) {
  const at::Tensor host = host_ids(ids, "admit");
  TORCH_CHECK(given_slots.defined() && given_slots.scalar_type() == at::kLong &&
                  given_slots.numel() == host.numel(),
              "speedtorch.IdIndex.admit: slots must be touch(ids)'s int64 slots, one per id (", host.numel(),
              "), got ", given_slots.defined() ? given_slots.numel() : 0, " of type ",
              given_slots.defined() ? c10::toString(given_slots.scalar_type()) : "undefined");
  const int64_t n = host.numel();
  at::Tensor slots = given_slots.to(at::kCPU).contiguous().view({-1}).clone();
  TORCH_CHECK(n == 0 || slots.min().item<int64_t>() >= -1, "speedtorch.IdIndex.admit: slots must be touch(ids)'s "
              "(-1 for an id not in the table, else its slot), got ", slots.min().item<int64_t>());
  std::vector<int64_t> admitted, evicted_keys, evicted_slots;
  {
    std::unique_lock<TableLock> guard(lock_);
    const int64_t from = protect_from.has_value() ? std::min(*protect_from, step_) : step_;
    admit_locked(host.data_ptr<int64_t>(), slots.data_ptr<int64_t>(), n, static_cast<uint64_t>(step_ - from), true,
                 admitted, evicted_keys, evicted_slots);
  }
  return {slots.view(ids.sizes()).to(ids.device()), as_tensor(admitted), as_tensor(evicted_keys),
          as_tensor(evicted_slots)};
}

at::Tensor IdIndex::find(const at::Tensor& ids) const {
  const at::Tensor host = host_ids(ids, "find");
  at::Tensor slots = at::empty({host.numel()}, at::TensorOptions().dtype(at::kLong));
  {
    std::shared_lock<TableLock> guard(lock_);
    lookup_locked(host.data_ptr<int64_t>(), slots.data_ptr<int64_t>(), host.numel());
  }
  return slots.view(ids.sizes()).to(ids.device());
}

// --- steps and accessors --------------------------------------------------------------------------------------------

int64_t IdIndex::step() const {
  std::shared_lock<TableLock> guard(lock_);
  return step_;
}

void IdIndex::advance_step() {
  std::unique_lock<TableLock> guard(lock_);
  ++step_;
}

void IdIndex::reserve(int64_t keys) {
  TORCH_CHECK(keys >= 0, "speedtorch.IdIndex.reserve: keys must be >= 0, got ", keys);
  std::unique_lock<TableLock> guard(lock_);
  const int64_t wanted = std::min(keys, capacity_);
  reserve_entries(slot_of_, wanted, wanted, keys_, meta_);
}

std::string IdIndex::policy() const { return policy_ == Policy::kLru ? "lru" : "lfu"; }

int64_t IdIndex::size() const {
  std::shared_lock<TableLock> guard(lock_);
  return size_;
}

int64_t IdIndex::candidates() const {
  std::shared_lock<TableLock> guard(lock_);
  return static_cast<int64_t>(candidate_of_.size());
}

at::Tensor IdIndex::keys() const {
  std::shared_lock<TableLock> guard(lock_);
  return as_tensor(keys_);
}

at::Tensor IdIndex::counts() const {
  std::shared_lock<TableLock> guard(lock_);
  at::Tensor out = at::empty({size_}, at::TensorOptions().dtype(at::kLong));
  int64_t* values = out.data_ptr<int64_t>();
  for (int64_t slot = 0; slot < size_; ++slot) {
    values[slot] = count_of(static_cast<uint32_t>(slot));
  }
  return out;
}

at::Tensor IdIndex::last_steps() const {
  std::shared_lock<TableLock> guard(lock_);
  at::Tensor out = at::empty({size_}, at::TensorOptions().dtype(at::kLong));
  int64_t* values = out.data_ptr<int64_t>();
  for_each_slot_in_order([&](uint32_t slot, int64_t seen) { values[slot] = seen; });
  return out;
}

int64_t IdIndex::memory_bytes() const {
  std::shared_lock<TableLock> guard(lock_);
  auto bytes = [](const auto& vector) {
    return static_cast<int64_t>(vector.capacity() * sizeof(typename std::decay_t<decltype(vector)>::value_type));
  };
  // A robin_set / robin_map bucket: the value (a 32-bit entry, or a key and its value), its distance from its ideal
  // bucket and a last-bucket flag (8 bytes for a 32-bit entry).
  auto buckets = [](const auto& map) {
    using Map = std::decay_t<decltype(map)>;
    using Bucket = tsl::detail_robin_hash::bucket_entry<typename Map::value_type, false>;
    return static_cast<int64_t>(map.bucket_count() * sizeof(Bucket));
  };
  return bytes(keys_) + bytes(meta_) + bytes(buckets_) + bytes(free_buckets_) + bytes(candidate_keys_) +
         bytes(candidate_meta_) + bytes(free_candidates_) + buckets(slot_of_) + buckets(candidate_of_) +
         buckets(bucket_of_count_) + buckets(spilled_counts_) + buckets(spilled_gaps_);
}

std::string IdIndex::repr() const {
  std::shared_lock<TableLock> guard(lock_);
  std::ostringstream out;
  out << "IdIndex(capacity=" << capacity_ << ", size=" << size_ << ", policy=" << policy()
      << ", admit_after=" << admit_after_ << ", step=" << step_ << ", candidates=" << candidate_of_.size() << "/"
      << candidate_capacity_ << ")";
  return out.str();
}

// --- state ----------------------------------------------------------------------------------------------------------

at::Tensor IdIndex::state() const {
  std::shared_lock<TableLock> guard(lock_);
  at::Tensor out = at::zeros({kHeaderRows + capacity_ + candidate_capacity_, 4}, at::TensorOptions().dtype(at::kLong));
  auto rows = out.accessor<int64_t, 2>();
  // Stamps: ranks in the order rows were last seen (LRU: the list; LFU: each count's list, the lowest count first),
  // then the candidates'.
  int64_t stamp = 0;
  for_each_slot_in_order([&](uint32_t slot, int64_t seen) {
    rows[kHeaderRows + slot][0] = keys_[slot];
    rows[kHeaderRows + slot][1] = count_of(slot);
    rows[kHeaderRows + slot][2] = seen;
    rows[kHeaderRows + slot][3] = ++stamp;
  });
  int64_t row = kHeaderRows + capacity_;
  for (uint32_t entry = candidate_recency_.head; entry != kNone; entry = candidate_meta_[entry].next, ++row) {
    rows[row][0] = candidate_keys_[entry];
    rows[row][1] = candidate_meta_[entry].count;
    rows[row][2] = ++stamp;
  }
  const int64_t header[kHeaderRows][4] = {
      {kStateFormat, capacity_, candidate_capacity_, admit_after_},
      {policy_ == Policy::kLru ? 0 : 1, step_, stamp, size_},
      {static_cast<int64_t>(candidate_of_.size()), 0, 0, 0}};
  for (int64_t r = 0; r < kHeaderRows; ++r) {
    for (int64_t c = 0; c < 4; ++c) {
      rows[r][c] = header[r][c];
    }
  }
  return out;
}

void IdIndex::check_state(const at::Tensor& state) const {
  TORCH_CHECK(state.defined() && state.dim() == 2 && state.size(1) == 4 && state.scalar_type() == at::kLong &&
                  state.size(0) >= kHeaderRows,
              "speedtorch.IdIndex.load_state: expected an int64 tensor of shape (3 + capacity + candidate_capacity, "
              "4) from IdIndex.state(), got ", state.scalar_type(), " of shape ", state.sizes());
  auto rows = state.accessor<int64_t, 2>();
  TORCH_CHECK(rows[0][0] == kStateFormat, "speedtorch.IdIndex.load_state: unknown state format ", rows[0][0],
              " (this library writes ", kStateFormat, ")");
  TORCH_CHECK(rows[0][1] == capacity_ && rows[0][2] == candidate_capacity_ && rows[0][3] == admit_after_ &&
                  rows[1][0] == (policy_ == Policy::kLru ? 0 : 1),
              "speedtorch.IdIndex.load_state: the state is of an index with capacity=", rows[0][1],
              ", candidate_capacity=", rows[0][2], ", admit_after=", rows[0][3], ", policy=",
              rows[1][0] == 0 ? "lru" : "lfu", "; this one has capacity=", capacity_, ", candidate_capacity=",
              candidate_capacity_, ", admit_after=", admit_after_, ", policy=", policy(),
              " (IdIndex.from_state builds a matching one)");
  TORCH_CHECK(state.size(0) == kHeaderRows + capacity_ + candidate_capacity_,
              "speedtorch.IdIndex.load_state: the state has ", state.size(0), " rows, expected ",
              kHeaderRows + capacity_ + candidate_capacity_);
  const int64_t size = rows[1][3], candidates = rows[2][0];
  TORCH_CHECK(size >= 0 && size <= capacity_ && candidates >= 0 && candidates <= candidate_capacity_,
              "speedtorch.IdIndex.load_state: the state holds ", size, " keys and ", candidates,
              " candidates, more than the index's ", capacity_, " and ", candidate_capacity_);
  // Each key once (in one slot or among the candidates), no sighting after the current step: all checked before
  // anything changes, so a refused state leaves the index as it was.
  const int64_t step = rows[1][1];
  std::vector<int64_t> keys;
  keys.reserve(static_cast<std::size_t>(size + candidates));
  for (int64_t slot = 0; slot < size; ++slot) {
    TORCH_CHECK(rows[kHeaderRows + slot][1] >= 1, "speedtorch.IdIndex.load_state: slot ", slot,
                " has a sighting count of ", rows[kHeaderRows + slot][1], " (must be >= 1)");
    TORCH_CHECK(rows[kHeaderRows + slot][2] <= step, "speedtorch.IdIndex.load_state: slot ", slot,
                " was last seen at step ", rows[kHeaderRows + slot][2], ", after the state's current step ", step);
    keys.push_back(rows[kHeaderRows + slot][0]);
  }
  for (int64_t i = 0; i < candidates; ++i) {
    keys.push_back(rows[kHeaderRows + capacity_ + i][0]);
  }
  std::sort(keys.begin(), keys.end());
  const auto twice = std::adjacent_find(keys.begin(), keys.end());
  TORCH_CHECK(twice == keys.end(), "speedtorch.IdIndex.load_state: key ", *twice,
              " is held twice (in two slots, a slot and a candidate, or two candidates); the state is not an "
              "IdIndex.state()");
}

void IdIndex::clear() {
  keys_.clear();
  meta_.clear();
  spilled_counts_.clear();
  spilled_gaps_.clear();
  slot_of_.clear();
  lru_ = SlotList{};
  buckets_.clear();
  free_buckets_.clear();
  bucket_of_count_.clear();
  lowest_bucket_ = kNone;
  size_ = 0;
  candidate_keys_.clear();
  candidate_meta_.clear();
  candidate_of_.clear();
  free_candidates_.clear();
  candidate_recency_ = List{};
}

void IdIndex::load_state(const at::Tensor& given) {
  const at::Tensor state = given.to(at::kCPU).contiguous();
  check_state(state);
  auto rows = state.accessor<int64_t, 2>();
  const int64_t size = rows[1][3], candidates = rows[2][0];
  std::unique_lock<TableLock> guard(lock_);
  clear();
  step_ = rows[1][1];
  size_ = size;
  reserve_entries(slot_of_, size, capacity_, keys_, meta_);
  keys_.resize(size);
  meta_.resize(size);
  for (int64_t slot = 0; slot < size; ++slot) {
    keys_[slot] = rows[kHeaderRows + slot][0];
    set_count(static_cast<uint32_t>(slot), saturated(rows[kHeaderRows + slot][1]));
    const bool fresh = slot_of_.insert(static_cast<uint32_t>(slot)).second;
    TORCH_INTERNAL_ASSERT(fresh, "speedtorch.IdIndex.load_state: key ", keys_[slot], " twice (check_state passed it)");
  }
  // Recency: LRU by (last step, stamp); LFU by (count, last step, stamp), appended in that order so each list is
  // built oldest first. The stamps of a state() follow its last steps within a list, so this is the stamps' order;
  // a state whose stamps did not is put in the order of its last steps, which the lists' gaps need.
  std::vector<uint32_t> order(size);
  std::iota(order.begin(), order.end(), 0u);
  auto seen = [&](uint32_t slot) { return rows[kHeaderRows + slot][2]; };
  auto stamp = [&](uint32_t slot) { return rows[kHeaderRows + slot][3]; };
  if (policy_ == Policy::kLru) {
    std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
      return std::make_pair(seen(a), stamp(a)) < std::make_pair(seen(b), stamp(b));
    });
    for (const uint32_t slot : order) {
      append_slot(lru_, slot, seen(slot));
    }
  } else {
    auto count = [&](uint32_t slot) { return saturated(rows[kHeaderRows + slot][1]); };
    std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
      return std::make_tuple(count(a), seen(a), stamp(a)) < std::make_tuple(count(b), seen(b), stamp(b));
    });
    uint32_t highest = kNone;
    for (const uint32_t slot : order) {
      if (highest == kNone || buckets_[highest].count != count(slot)) {
        highest = bucket_for_count_after(highest, count(slot));  // above every bucket made so far
      }
      append_slot(buckets_[highest].rows, slot, seen(slot));
    }
  }
  const int64_t first = kHeaderRows + capacity_;
  reserve_entries(candidate_of_, candidates, candidate_capacity_, candidate_keys_, candidate_meta_);
  for (int64_t i = 0; i < candidates; ++i) {
    const uint32_t entry = static_cast<uint32_t>(candidate_keys_.size());
    candidate_keys_.push_back(rows[first + i][0]);
    candidate_meta_.push_back(CandidateMeta{saturated(rows[first + i][1]), kNone, kNone});
    push_back(candidate_meta_, candidate_recency_, entry);  // state() wrote them least recently seen first
    candidate_of_.insert(entry);
  }
}

c10::intrusive_ptr<IdIndex> IdIndex::from_state(const at::Tensor& given) {
  const at::Tensor state = given.to(at::kCPU).contiguous();
  TORCH_CHECK(state.dim() == 2 && state.size(0) >= kHeaderRows && state.size(1) == 4 &&
                  state.scalar_type() == at::kLong,
              "speedtorch.IdIndex.from_state: expected an int64 tensor of shape (3 + capacity + candidate_capacity, "
              "4) from IdIndex.state(), got ", state.scalar_type(), " of shape ", state.sizes());
  auto rows = state.accessor<int64_t, 2>();
  auto index = c10::make_intrusive<IdIndex>(rows[0][1], rows[0][3], rows[1][0] == 0 ? "lru" : "lfu", rows[0][2]);
  index->load_state(state);
  return index;
}

}  // namespace speedtorch
