// IdIndex: the host-RAM index of a table that grows (issue 33, docs/dynamic_tables.md): raw int64 ids of any value
// -> slots (rows) of a fixed-capacity PinnedEmbedding, with admission after k sightings and eviction of the
// lowest-scored rows when the table is full. A torch::CustomClass (registered in ops/id_index_class.cpp), so Python,
// TorchScript and C++ share one object. It holds keys only: the rows are the PinnedEmbedding's, and whoever owns both
// (speedtorch/dynamic_embedding.py) initialises the rows assign() admits and reads the rows it evicts.
//
// The map is Tessil's robin_map (Debian robin-map-dev: open addressing, Robin Hood probing, deletion by backward
// shift, so evictions leave no tombstones), header-only: the built library needs nothing more at run time. Abseil's
// flat_hash_map was measured beside it (docs/dynamic_tables.md): lookups within noise of each other; abseil's static
// archives cannot go into a shared library (initial-exec TLS) and its shared ones would be a run-time dependency.
// Keys are mixed (murmur3's finaliser) before probing: std::hash of an integer is the integer itself, and raw ids
// with a common stride would otherwise share buckets. Per slot the index keeps the key, a sighting count, the step
// it was last seen and a recency order; candidates (ids seen fewer than k times) live in a bounded pool of their
// own.
//
// Semantics of assign(ids) (the Python reference in tests/python/test_dynamic_table.py is the same, line by line):
//  1. Ids present in the table are touched, in the batch's order: count += 1, last step = the current step, and they
//     become the most recent (LRU: appended to the queue of sightings; LFU: the end of their new count's list).
//  2. Ids not present are counted: sightings = the candidate pool's count (if it remembers the id) + occurrences in
//     this batch. Those with sightings >= admit_after are admitted, in the order of their first occurrence in the
//     batch; the others go (back) to the candidate pool with their sightings.
//  3. An admitted id takes the next never-used slot while there is one. Once every slot has been used, it takes the
//     slot of the lowest-scored row not seen in the current step (LRU: the least recently seen; LFU: the lowest
//     count, the least recently seen among equal counts), which is evicted: its key leaves the index and assign
//     returns (key, slot). When every row was seen in the current step, the id is not admitted (it goes back to the
//     candidate pool with its sightings) and neither are the ids after it in this batch.
//  4. An admitted id starts with count = its sightings and is the most recent row. Every occurrence of an id in the
//     batch gets its slot after the admissions; ids not admitted get -1.
// The step advances only by advance_step() (HostEmbedding advances it when no gradient is waiting for the
// optimizer): rows seen in the current step are never evicted, so a slot that has a pending gradient keeps its key.
// Candidate pool: holds at most candidate_capacity ids; when it is full, the id seen least recently is forgotten
// (its sightings are lost) to make room.
//
// Threads: as PinnedEmbedding (embedding/table_lock.h): find() and the accessors share the lock; assign(),
// advance_step() and load_state() hold it alone, so each call sees the index entirely before or after another.
// Inside a call, the map lookups of a batch of more than 8,192 ids run on several threads (cpu/helped_parallel_for.h:
// they only read); counts, recency, admission and eviction run on the calling thread, in the batch's order.
//
// CUDA ids are copied to the host, mapped, and their slots copied back to the ids' device (a synchronising copy each
// way; a mapping on the GPU is not yet written).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/custom_class.h>
#include <tsl/robin_map.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "core/id_mix.h"
#include "embedding/table_lock.h"

namespace speedtorch {

// Every bit of the id reaches the low bits the map's power-of-two buckets use (core/id_mix.h).
struct IdHash {
  size_t operator()(int64_t id) const { return static_cast<size_t>(mix_id(id)); }
};
using IdMap = tsl::robin_map<int64_t, int64_t, IdHash>;

class IdIndex : public torch::CustomClassHolder {
 public:
  // capacity: slots (rows of the table); admit_after: sightings before an id gets a slot (>= 1); policy: "lru" or
  // "lfu"; candidate_capacity: ids the candidate pool remembers (>= 1 when admit_after > 1; unused when it is 1).
  IdIndex(int64_t capacity, int64_t admit_after, const std::string& policy, int64_t candidate_capacity);

  // Maps ids (any shape, int32/int64, CPU or CUDA) to slots as the top of this file says. Returns (slots: ids'
  // shape, int64, on ids' device, -1 for ids not admitted; admitted: the slots given to new ids, in admission
  // order; evicted_keys, evicted_slots: the rows evicted to make room, in eviction order; the last three int64 on
  // the CPU). The owner must initialise the admitted slots' rows (and read the evicted ones first, if it keeps them).
  std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> assign(const at::Tensor& ids);
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
  // "IdIndex(capacity=..., size=..., policy=lru, admit_after=1, step=..., candidates=...)".
  std::string repr() const;

  // Everything the index holds, as one int64 tensor of shape (3 + capacity + candidate_capacity, 4), so that a table
  // restored from it answers and evicts exactly as this one would:
  //   row 0: (format = 1, capacity, candidate_capacity, admit_after)
  //   row 1: (policy: 0 lru / 1 lfu, step, clock, size)
  //   row 2: (candidates, 0, 0, 0)
  //   rows 3 .. 3 + capacity: one per slot: (key, count, last step, recency stamp); zeros for unused slots
  //   the rest: the candidate pool: (key, sightings, recency stamp, 0) for its first `candidates` rows, then zeros
  at::Tensor state() const;
  // Replaces this index's contents with a state() of the same capacity, candidate capacity, admit_after and policy.
  void load_state(const at::Tensor& state);
  // A new index from a state().
  static c10::intrusive_ptr<IdIndex> from_state(const at::Tensor& state);

 private:
  // An intrusive doubly linked list over the entries of prev/next arrays (slots or candidates), oldest first.
  struct List {
    int64_t head = -1;
    int64_t tail = -1;
  };
  // One used slot, in one record so that a sighting touches one cache line of it: its key, sighting count, the step
  // it was last seen, its recency stamp, and (LFU) its neighbours in its bucket's list and its bucket.
  struct Row {
    int64_t key = 0;
    int64_t count = 0;
    int64_t last_step = 0;
    int64_t stamp = 0;
    int64_t prev = -1;
    int64_t next = -1;
    int64_t bucket = -1;
  };
  struct Candidate {
    int64_t key = 0;
    int64_t count = 0;
    int64_t stamp = 0;
    int64_t prev = -1;
    int64_t next = -1;
  };
  template <typename Entry>
  static void push_back(std::vector<Entry>& entries, List& list, int64_t at);
  template <typename Entry>
  static void unlink(std::vector<Entry>& entries, List& list, int64_t at);
  // LFU: the rows of one count, in recency order; buckets are chained by increasing count.
  struct Bucket {
    int64_t count = 0;
    List rows;
    int64_t lower = -1;
    int64_t higher = -1;
  };

  enum class Policy { kLru, kLfu };

  // The private helpers expect the caller to hold lock_ (exclusively for the ones that change anything).
  // slots[i] = the slot of ids[i] or -1, for n ids, on several threads (helped_parallel_for) for large batches.
  void lookup_locked(const int64_t* ids, int64_t* slots, int64_t n) const;
  // Puts a slot in the recency structure as the most recent row of its count (LRU: the queue; LFU: its
  // count's bucket, created when missing).
  void link_slot(int64_t slot);
  void unlink_slot(int64_t slot);
  // A sighting of a row already in the table.
  void touch(int64_t slot);
  // The lowest-scored row not seen in the current step, or -1 when every row was (drops stale LRU entries).
  int64_t victim();
  // LRU: appends the slot's current stamp to the queue.
  void push_touch(int64_t slot);
  // LFU bucket chain.
  int64_t bucket_for_count_after(int64_t below, int64_t count);
  void drop_bucket_if_empty(int64_t bucket);
  // The candidate pool.
  void remember_candidate(int64_t key, int64_t sightings);
  void forget_candidate(int64_t key);
  void clear();
  void check_state(const at::Tensor& state) const;
  // One field of every used slot, as a tensor (keys(), counts(), last_steps()).
  template <typename Field>
  at::Tensor column(Field field) const;

  int64_t capacity_;
  int64_t admit_after_;
  Policy policy_;
  int64_t candidate_capacity_;

  IdMap slot_of_;  // key -> slot
  std::vector<Row> rows_;             // per used slot
  // LRU: (slot, stamp) of every sighting, oldest first, from lru_head_ on; an entry whose stamp is no longer its
  // slot's is stale and skipped. A sighting is then one write to its slot's record and an append here (no list to
  // relink); the queue is compacted to the valid entries when it holds more than 2 x size() + 1024.
  struct Touch {
    int64_t slot;
    int64_t stamp;
  };
  std::vector<Touch> lru_queue_;
  size_t lru_head_ = 0;
  std::vector<Bucket> buckets_;       // LFU: bucket storage (free ones reused through free_buckets_)
  std::vector<int64_t> free_buckets_;
  int64_t lowest_bucket_ = -1;        // LFU: the bucket of the lowest count
  int64_t size_ = 0;
  int64_t step_ = 0;
  int64_t clock_ = 0;  // recency stamps: each touch or admission of a row, each sighting of a candidate

  IdMap candidate_of_;  // key -> candidate entry
  std::vector<Candidate> candidates_;
  std::vector<int64_t> free_candidates_;
  List candidate_recency_;  // least recently seen first

  mutable TableLock lock_;
};

}  // namespace speedtorch
