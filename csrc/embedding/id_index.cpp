// IdIndex (id_index.h): raw id -> slot with admission and eviction. The semantics are written at the top of
// id_index.h; this file keeps the recency structures (a queue of sightings for LRU, count buckets for LFU) and the
// candidate pool consistent with them.
#include "embedding/id_index.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <mutex>
#include <numeric>
#include <shared_mutex>
#include <sstream>

#include "cpu/helped_parallel_for.h"

namespace speedtorch {

namespace {

constexpr int64_t kStateFormat = 1;
constexpr int64_t kHeaderRows = 3;
// Ids per task of the parallel lookups: below this a batch is looked up on the calling thread alone.
constexpr int64_t kLookupGrain = 8192;

// ids as a flat, contiguous int64 CPU tensor (a copy to the host for CUDA ids).
at::Tensor host_ids(const at::Tensor& ids, const char* op) {
  TORCH_CHECK(ids.defined(), "speedtorch.IdIndex.", op, ": ids must be a tensor, got an undefined one");
  TORCH_CHECK(ids.scalar_type() == at::kLong || ids.scalar_type() == at::kInt, "speedtorch.IdIndex.", op,
              ": ids must be int64 (or int32) raw ids, got ", ids.scalar_type(),
              "; convert them with ids.to(torch.int64)");
  return ids.to(at::kCPU, at::kLong).contiguous().view({-1});
}

}  // namespace

template <typename Entry>
void IdIndex::push_back(std::vector<Entry>& entries, List& list, int64_t at) {
  entries[at].prev = list.tail;
  entries[at].next = -1;
  if (list.tail == -1) {
    list.head = at;
  } else {
    entries[list.tail].next = at;
  }
  list.tail = at;
}

template <typename Entry>
void IdIndex::unlink(std::vector<Entry>& entries, List& list, int64_t at) {
  const int64_t before = entries[at].prev, after = entries[at].next;
  if (before == -1) {
    list.head = after;
  } else {
    entries[before].next = after;
  }
  if (after == -1) {
    list.tail = before;
  } else {
    entries[after].prev = before;
  }
  entries[at].prev = entries[at].next = -1;
}

IdIndex::IdIndex(int64_t capacity, int64_t admit_after, const std::string& policy, int64_t candidate_capacity)
    : capacity_(capacity), admit_after_(admit_after), candidate_capacity_(candidate_capacity) {
  TORCH_CHECK(capacity >= 1, "speedtorch.IdIndex: capacity must be >= 1 (the table's rows), got ", capacity);
  TORCH_CHECK(admit_after >= 1, "speedtorch.IdIndex: admit_after must be >= 1 (sightings before an id gets a row), "
              "got ", admit_after);
  TORCH_CHECK(policy == "lru" || policy == "lfu", "speedtorch.IdIndex: policy must be 'lru' or 'lfu', got '", policy,
              "'");
  TORCH_CHECK(candidate_capacity >= 0, "speedtorch.IdIndex: candidate_capacity must be >= 0, got ",
              candidate_capacity);
  TORCH_CHECK(admit_after == 1 || candidate_capacity >= 1, "speedtorch.IdIndex: admit_after=", admit_after,
              " needs a candidate pool to count sightings across batches: candidate_capacity must be >= 1, got 0");
  policy_ = policy == "lru" ? Policy::kLru : Policy::kLfu;
  // robin_map's default (0.5) would spend twice the memory a key needs; Robin Hood probing stays short at 0.8.
  slot_of_.max_load_factor(0.8f);
}

// --- the recency structures -----------------------------------------------------------------------------------------

int64_t IdIndex::bucket_for_count_after(int64_t below, int64_t count) {
  // Walks up from `below` (a bucket of a count <= `count`; -1: from the lowest) to the bucket of `count`, making it
  // where it belongs when there is none.
  int64_t lower = -1, at = lowest_bucket_;
  if (below != -1) {
    lower = buckets_[below].lower;
    at = below;
  }
  while (at != -1 && buckets_[at].count < count) {
    lower = at;
    at = buckets_[at].higher;
  }
  if (at != -1 && buckets_[at].count == count) {
    return at;
  }
  int64_t made;
  if (!free_buckets_.empty()) {
    made = free_buckets_.back();
    free_buckets_.pop_back();
  } else {
    made = static_cast<int64_t>(buckets_.size());
    buckets_.emplace_back();
  }
  buckets_[made] = Bucket{count, List{}, lower, at};
  if (lower == -1) {
    lowest_bucket_ = made;
  } else {
    buckets_[lower].higher = made;
  }
  if (at != -1) {
    buckets_[at].lower = made;
  }
  return made;
}

void IdIndex::drop_bucket_if_empty(int64_t bucket) {
  Bucket& b = buckets_[bucket];
  if (b.rows.head != -1) {
    return;
  }
  if (b.lower == -1) {
    lowest_bucket_ = b.higher;
  } else {
    buckets_[b.lower].higher = b.higher;
  }
  if (b.higher != -1) {
    buckets_[b.higher].lower = b.lower;
  }
  b = Bucket{};
  free_buckets_.push_back(bucket);
}

void IdIndex::push_touch(int64_t slot) {
  if (lru_queue_.size() > lru_head_ && lru_queue_.back().slot == slot) {
    lru_queue_.back().stamp = rows_[slot].stamp;  // seen again right after its last sighting
    return;
  }
  if (lru_queue_.size() - lru_head_ > 2 * static_cast<size_t>(size_) + 1024) {
    // Mostly stale entries: keep the valid ones (one per used slot), in order.
    size_t kept = 0;
    for (size_t at = lru_head_; at < lru_queue_.size(); ++at) {
      if (rows_[lru_queue_[at].slot].stamp == lru_queue_[at].stamp) {
        lru_queue_[kept++] = lru_queue_[at];
      }
    }
    lru_queue_.resize(kept);
    lru_head_ = 0;
  } else if (lru_head_ > 1024 && lru_head_ > lru_queue_.size() / 2) {
    lru_queue_.erase(lru_queue_.begin(), lru_queue_.begin() + static_cast<std::ptrdiff_t>(lru_head_));
    lru_head_ = 0;
  }
  lru_queue_.push_back(Touch{slot, rows_[slot].stamp});
}

void IdIndex::link_slot(int64_t slot) {
  if (policy_ == Policy::kLru) {
    push_touch(slot);
    return;
  }
  const int64_t bucket = bucket_for_count_after(-1, rows_[slot].count);
  push_back(rows_, buckets_[bucket].rows, slot);
  rows_[slot].bucket = bucket;
}

void IdIndex::unlink_slot(int64_t slot) {
  if (policy_ == Policy::kLru) {
    return;  // its entries in the queue go stale when the slot gets its next stamp
  }
  const int64_t bucket = rows_[slot].bucket;
  unlink(rows_, buckets_[bucket].rows, slot);
  rows_[slot].bucket = -1;
  drop_bucket_if_empty(bucket);
}

void IdIndex::touch(int64_t slot) {
  rows_[slot].count += 1;
  rows_[slot].last_step = step_;
  rows_[slot].stamp = ++clock_;
  if (policy_ == Policy::kLru) {
    push_touch(slot);
    return;
  }
  const int64_t from = rows_[slot].bucket;
  unlink(rows_, buckets_[from].rows, slot);
  const int64_t to = bucket_for_count_after(from, rows_[slot].count);
  push_back(rows_, buckets_[to].rows, slot);
  rows_[slot].bucket = to;
  drop_bucket_if_empty(from);
}

int64_t IdIndex::victim() {
  // In the LRU queue (its valid entries), and within each LFU bucket, rows are in the order they were last seen:
  // when the first one was seen in the current step, so were all the others.
  if (policy_ == Policy::kLru) {
    while (lru_head_ < lru_queue_.size()) {
      const Touch oldest = lru_queue_[lru_head_];
      if (rows_[oldest.slot].stamp != oldest.stamp) {
        ++lru_head_;  // stale: the slot was seen (or reused) since
        continue;
      }
      return rows_[oldest.slot].last_step < step_ ? oldest.slot : -1;
    }
    return -1;
  }
  for (int64_t b = lowest_bucket_; b != -1; b = buckets_[b].higher) {
    const int64_t oldest = buckets_[b].rows.head;
    if (rows_[oldest].last_step < step_) {
      return oldest;
    }
  }
  return -1;
}

// --- the candidate pool ---------------------------------------------------------------------------------------------

void IdIndex::remember_candidate(int64_t key, int64_t sightings) {
  if (admit_after_ == 1 || candidate_capacity_ == 0) {
    return;  // every id qualifies at its first sighting: nothing to count
  }
  auto found = candidate_of_.find(key);
  if (found != candidate_of_.end()) {
    const int64_t entry = found->second;
    candidates_[entry].count = sightings;
    candidates_[entry].stamp = ++clock_;
    unlink(candidates_, candidate_recency_, entry);
    push_back(candidates_, candidate_recency_, entry);
    return;
  }
  if (static_cast<int64_t>(candidate_of_.size()) == candidate_capacity_) {
    forget_candidate(candidates_[candidate_recency_.head].key);  // full: the one seen least recently goes
  }
  int64_t entry;
  if (!free_candidates_.empty()) {
    entry = free_candidates_.back();
    free_candidates_.pop_back();
  } else {
    entry = static_cast<int64_t>(candidates_.size());
    candidates_.emplace_back();
  }
  candidates_[entry].key = key;
  candidates_[entry].count = sightings;
  candidates_[entry].stamp = ++clock_;
  push_back(candidates_, candidate_recency_, entry);
  candidate_of_.emplace(key, entry);
}

void IdIndex::forget_candidate(int64_t key) {
  auto found = candidate_of_.find(key);
  if (found == candidate_of_.end()) {
    return;
  }
  const int64_t entry = found->second;
  candidate_of_.erase(found);
  unlink(candidates_, candidate_recency_, entry);
  free_candidates_.push_back(entry);
}

// --- lookups --------------------------------------------------------------------------------------------------------

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> IdIndex::assign(const at::Tensor& ids) {
  const at::Tensor host = host_ids(ids, "assign");
  const int64_t n = host.numel();
  at::Tensor slots = at::empty({n}, at::TensorOptions().dtype(at::kLong));
  const int64_t* in = host.data_ptr<int64_t>();
  int64_t* out = slots.data_ptr<int64_t>();
  std::vector<int64_t> admitted, evicted_keys, evicted_slots;
  {
    std::unique_lock<TableLock> guard(lock_);
    // 1. Ids in the table are touched in the batch's order; the others are counted. The lookups only read the map:
    // they run on several threads first (this thread holds the lock for all of them).
    lookup_locked(in, out, n);
    IdMap new_sightings;
    std::vector<int64_t> new_keys;  // in the order of their first occurrence
    constexpr int64_t kAhead = 16;  // records are random accesses: ask for the one kAhead sightings on early
    for (int64_t i = 0; i < n; ++i) {
      if (i + kAhead < n && out[i + kAhead] != -1) {
        __builtin_prefetch(&rows_[out[i + kAhead]], 1);
      }
      if (out[i] != -1) {
        touch(out[i]);
        continue;
      }
      auto counted = new_sightings.try_emplace(in[i], 0);
      if (counted.second) {
        new_keys.push_back(in[i]);
      }
      counted.first.value() += 1;
    }
    // 2-3. Admissions, evicting where the table is full.
    bool table_busy = false;  // every row was seen in this step: nothing more is admitted in this batch
    for (const int64_t key : new_keys) {
      int64_t sightings = new_sightings.find(key)->second;
      auto remembered = candidate_of_.find(key);
      if (remembered != candidate_of_.end()) {
        sightings += candidates_[remembered->second].count;
      }
      int64_t slot = -1;
      if (!table_busy && sightings >= admit_after_) {
        if (size_ < capacity_) {
          slot = size_++;
          rows_.emplace_back();
        } else {
          slot = victim();
          if (slot == -1) {
            table_busy = true;
          } else {
            evicted_keys.push_back(rows_[slot].key);
            evicted_slots.push_back(slot);
            slot_of_.erase(rows_[slot].key);
            unlink_slot(slot);
          }
        }
      }
      if (slot == -1) {
        remember_candidate(key, sightings);
        continue;
      }
      // 4. The new row: count = its sightings, the most recent.
      forget_candidate(key);
      rows_[slot].key = key;
      rows_[slot].count = sightings;
      rows_[slot].last_step = step_;
      rows_[slot].stamp = ++clock_;
      slot_of_.emplace(key, slot);
      link_slot(slot);
      admitted.push_back(slot);
    }
    if (!admitted.empty()) {
      for (int64_t i = 0; i < n; ++i) {
        if (out[i] == -1) {
          auto found = slot_of_.find(in[i]);
          out[i] = found == slot_of_.end() ? -1 : found->second;
        }
      }
    }
  }
  auto as_tensor = [](const std::vector<int64_t>& values) {
    return at::tensor(c10::ArrayRef<int64_t>(values), at::TensorOptions().dtype(at::kLong));
  };
  return {slots.view(ids.sizes()).to(ids.device()), as_tensor(admitted), as_tensor(evicted_keys),
          as_tensor(evicted_slots)};
}

void IdIndex::lookup_locked(const int64_t* ids, int64_t* slots, int64_t n) const {
  helped_parallel_for(n, kLookupGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      auto found = slot_of_.find(ids[i]);
      slots[i] = found == slot_of_.end() ? -1 : found->second;
    }
  });
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

std::string IdIndex::policy() const { return policy_ == Policy::kLru ? "lru" : "lfu"; }

int64_t IdIndex::size() const {
  std::shared_lock<TableLock> guard(lock_);
  return size_;
}

int64_t IdIndex::candidates() const {
  std::shared_lock<TableLock> guard(lock_);
  return static_cast<int64_t>(candidate_of_.size());
}

template <typename Field>
at::Tensor IdIndex::column(Field field) const {
  std::shared_lock<TableLock> guard(lock_);
  at::Tensor out = at::empty({size_}, at::TensorOptions().dtype(at::kLong));
  int64_t* values = out.data_ptr<int64_t>();
  for (int64_t slot = 0; slot < size_; ++slot) {
    values[slot] = rows_[slot].*field;
  }
  return out;
}

at::Tensor IdIndex::keys() const { return column(&Row::key); }
at::Tensor IdIndex::counts() const { return column(&Row::count); }
at::Tensor IdIndex::last_steps() const { return column(&Row::last_step); }

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
  const int64_t header[kHeaderRows][4] = {
      {kStateFormat, capacity_, candidate_capacity_, admit_after_},
      {policy_ == Policy::kLru ? 0 : 1, step_, clock_, size_},
      {static_cast<int64_t>(candidate_of_.size()), 0, 0, 0}};
  for (int64_t r = 0; r < kHeaderRows; ++r) {
    for (int64_t c = 0; c < 4; ++c) {
      rows[r][c] = header[r][c];
    }
  }
  for (int64_t slot = 0; slot < size_; ++slot) {
    rows[kHeaderRows + slot][0] = rows_[slot].key;
    rows[kHeaderRows + slot][1] = rows_[slot].count;
    rows[kHeaderRows + slot][2] = rows_[slot].last_step;
    rows[kHeaderRows + slot][3] = rows_[slot].stamp;
  }
  int64_t row = kHeaderRows + capacity_;
  for (int64_t entry = candidate_recency_.head; entry != -1; entry = candidates_[entry].next, ++row) {
    rows[row][0] = candidates_[entry].key;
    rows[row][1] = candidates_[entry].count;
    rows[row][2] = candidates_[entry].stamp;
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
  for (int64_t slot = 0; slot < size; ++slot) {
    TORCH_CHECK(rows[kHeaderRows + slot][1] >= 1, "speedtorch.IdIndex.load_state: slot ", slot,
                " has a sighting count of ", rows[kHeaderRows + slot][1], " (must be >= 1)");
  }
}

void IdIndex::clear() {
  slot_of_.clear();
  rows_.clear();
  lru_queue_.clear();
  lru_head_ = 0;
  buckets_.clear();
  free_buckets_.clear();
  lowest_bucket_ = -1;
  size_ = 0;
  candidate_of_.clear();
  candidates_.clear();
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
  clock_ = rows[1][2];
  size_ = size;
  rows_.resize(size);
  slot_of_.reserve(size);
  for (int64_t slot = 0; slot < size; ++slot) {
    rows_[slot].key = rows[kHeaderRows + slot][0];
    rows_[slot].count = rows[kHeaderRows + slot][1];
    rows_[slot].last_step = rows[kHeaderRows + slot][2];
    rows_[slot].stamp = rows[kHeaderRows + slot][3];
    const bool fresh = slot_of_.emplace(rows_[slot].key, slot).second;
    if (!fresh) {
      clear();
      TORCH_CHECK(false, "speedtorch.IdIndex.load_state: key ", rows[kHeaderRows + slot][0],
                  " is in two slots; the state is not an IdIndex.state()");
    }
  }
  // Recency: LRU by stamp; LFU by (count, stamp), appended in that order so each bucket is built oldest first.
  std::vector<int64_t> order(size);
  std::iota(order.begin(), order.end(), 0);
  if (policy_ == Policy::kLru) {
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return rows_[a].stamp < rows_[b].stamp; });
    for (const int64_t slot : order) {
      push_touch(slot);
    }
  } else {
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      return rows_[a].count != rows_[b].count ? rows_[a].count < rows_[b].count : rows_[a].stamp < rows_[b].stamp;
    });
    int64_t highest = -1;
    for (const int64_t slot : order) {
      if (highest == -1 || buckets_[highest].count != rows_[slot].count) {
        highest = bucket_for_count_after(highest, rows_[slot].count);  // above every bucket made so far
      }
      push_back(rows_, buckets_[highest].rows, slot);
      rows_[slot].bucket = highest;
    }
  }
  const int64_t first = kHeaderRows + capacity_;
  for (int64_t i = 0; i < candidates; ++i) {
    const int64_t entry = static_cast<int64_t>(candidates_.size());
    candidates_.push_back(Candidate{rows[first + i][0], rows[first + i][1], rows[first + i][2], -1, -1});
    push_back(candidates_, candidate_recency_, entry);  // state() wrote them least recently seen first
    candidate_of_.emplace(candidates_[entry].key, entry);
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
