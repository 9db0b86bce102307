// Tests for csrc/embedding/id_index: the index of a table that grows answers as a tiny reference of the same rules
// (written here with std::map and a scan for the victim) on random skewed streams of raw ids: slots, admissions after
// k sightings, LRU and LFU eviction order, ids without a row, the touch/admit split and its protected steps, state
// round trips. (tests/python/test_dynamic_table.py checks the same rules from Python, and the module on top.)
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "embedding/id_index.h"
#include "error_text.h"

namespace speedtorch {
namespace {

using speedtorch::testing::error_of;

// id_index.h's rules, spelled out: a map for the slots, per-key count / last step / stamp, and the victim found by
// scanning every row.
class Reference {
 public:
  Reference(int64_t capacity, int64_t admit_after, bool lfu, int64_t pool_size)
      : capacity_(capacity), k_(admit_after), lfu_(lfu), pool_size_(pool_size) {}

  void advance_step() { ++step_; }

  struct Result {
    std::vector<int64_t> slots, admitted;
    std::vector<std::pair<int64_t, int64_t>> evicted;  // (key, slot)
  };

  // protect_from: rows seen in a step >= it are not evicted (assign: the current step).
  Result assign(const std::vector<int64_t>& ids, int64_t protect_from = -1) {
    if (protect_from < 0 || protect_from > step_) {
      protect_from = step_;
    }
    std::vector<int64_t> order;
    std::map<int64_t, int64_t> seen;
    for (const int64_t key : ids) {
      if (slot_.count(key)) {
        Row& row = rows_[key];
        row.count += 1;
        row.last = step_;
        row.stamp = ++clock_;
      } else if (seen[key]++ == 0) {
        order.push_back(key);
      }
    }
    Result out;
    bool busy = false;
    for (const int64_t key : order) {
      const int64_t sightings = seen[key] + pool_count(key);
      int64_t slot = -1;
      if (!busy && sightings >= k_) {
        if (size_ < capacity_) {
          slot = size_++;
        } else {
          const int64_t victim = find_victim(protect_from);
          if (victim == kNoKey) {
            busy = true;
          } else {
            slot = slot_[victim];
            out.evicted.emplace_back(victim, slot);
            slot_.erase(victim);
            rows_.erase(victim);
          }
        }
      }
      if (slot == -1) {
        remember(key, sightings);
        continue;
      }
      forget(key);
      slot_[key] = slot;
      rows_[key] = Row{sightings, step_, ++clock_};
      out.admitted.push_back(slot);
    }
    for (const int64_t key : ids) {
      auto found = slot_.find(key);
      out.slots.push_back(found == slot_.end() ? -1 : found->second);
    }
    return out;
  }

  int64_t slot_of(int64_t key) const {
    auto found = slot_.find(key);
    return found == slot_.end() ? -1 : found->second;
  }
  int64_t count_of(int64_t key) const { return rows_.at(key).count; }
  int64_t last_of(int64_t key) const { return rows_.at(key).last; }
  int64_t pool_size() const { return static_cast<int64_t>(pool_.size()); }

 private:
  static constexpr int64_t kNoKey = INT64_MIN;
  struct Row {
    int64_t count, last, stamp;
  };

  int64_t find_victim(int64_t protect_from) const {
    int64_t best = kNoKey;
    for (const auto& [key, row] : rows_) {
      if (row.last >= protect_from) {
        continue;
      }
      if (best == kNoKey) {
        best = key;
        continue;
      }
      const Row& b = rows_.at(best);
      const bool lower = lfu_ ? std::make_pair(row.count, row.stamp) < std::make_pair(b.count, b.stamp)
                              : row.stamp < b.stamp;
      if (lower) {
        best = key;
      }
    }
    return best;
  }
  int64_t pool_count(int64_t key) const {
    for (const auto& [k, n] : pool_) {
      if (k == key) {
        return n;
      }
    }
    return 0;
  }
  void forget(int64_t key) {
    pool_.erase(std::remove_if(pool_.begin(), pool_.end(), [&](const auto& e) { return e.first == key; }),
                pool_.end());
  }
  void remember(int64_t key, int64_t sightings) {  // the pool: least recently seen first
    if (k_ == 1 || pool_size_ == 0) {
      return;
    }
    forget(key);
    if (static_cast<int64_t>(pool_.size()) == pool_size_) {
      pool_.erase(pool_.begin());
    }
    pool_.emplace_back(key, sightings);
  }

  int64_t capacity_, k_;
  bool lfu_;
  int64_t pool_size_;
  std::map<int64_t, int64_t> slot_;
  std::map<int64_t, Row> rows_;
  std::vector<std::pair<int64_t, int64_t>> pool_;
  int64_t size_ = 0, step_ = 0, clock_ = 0;
};

std::vector<int64_t> to_vector(const at::Tensor& t) {
  const at::Tensor flat = t.to(at::kCPU, at::kLong).contiguous().view({-1});
  return {flat.data_ptr<int64_t>(), flat.data_ptr<int64_t>() + flat.numel()};
}

at::Tensor to_tensor(const std::vector<int64_t>& values) {
  return at::tensor(c10::ArrayRef<int64_t>(values), at::TensorOptions().dtype(at::kLong));
}

// Raw ids over the whole int64 range, and batches drawn from them with a power-law skew.
struct Stream {
  explicit Stream(uint64_t seed, int64_t universe) : rng(seed) {
    std::uniform_int_distribution<int64_t> any(INT64_MIN, INT64_MAX);
    for (int64_t i = 0; i < universe; ++i) {
      keys.push_back(any(rng));
    }
  }
  std::vector<int64_t> batch(int64_t n) {
    std::uniform_real_distribution<double> u(0.0, 1.0);
    std::vector<int64_t> out;
    for (int64_t i = 0; i < n; ++i) {
      const double x = u(rng);
      out.push_back(keys[static_cast<size_t>(x * x * x * static_cast<double>(keys.size()))]);
    }
    return out;
  }
  std::mt19937_64 rng;
  std::vector<int64_t> keys;
};

void expect_same(const std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>& got, const Reference::Result& want,
                 int batch) {
  const auto& [slots, admitted, evicted_keys, evicted_slots] = got;
  EXPECT_EQ(to_vector(slots), want.slots) << "batch " << batch;
  EXPECT_EQ(to_vector(admitted), want.admitted) << "batch " << batch;
  std::vector<std::pair<int64_t, int64_t>> evicted;
  const std::vector<int64_t> keys = to_vector(evicted_keys), at_slots = to_vector(evicted_slots);
  for (size_t i = 0; i < keys.size(); ++i) {
    evicted.emplace_back(keys[i], at_slots[i]);
  }
  EXPECT_EQ(evicted, want.evicted) << "batch " << batch;
}

struct Config {
  int64_t capacity, admit_after;
  const char* policy;
  int64_t pool;
};

class IdIndexStreams : public ::testing::TestWithParam<Config> {};

TEST_P(IdIndexStreams, MatchTheReferenceThroughAdmissionEvictionAndRestore) {
  const Config c = GetParam();
  Stream stream(static_cast<uint64_t>(c.capacity * 7 + c.admit_after), 300);
  auto index = c10::make_intrusive<IdIndex>(c.capacity, c.admit_after, c.policy, c.pool);
  Reference reference(c.capacity, c.admit_after, std::string(c.policy) == "lfu", c.pool);
  std::uniform_int_distribution<int64_t> length(1, 40);
  for (int batch = 0; batch < 80; ++batch) {
    const std::vector<int64_t> ids = stream.batch(length(stream.rng));
    if (batch % 5 != 4) {  // now and then two lookups share a step
      index->advance_step();
      reference.advance_step();
    }
    if (batch % 3 == 0) {  // the split: touch, then admit, is assign
      const at::Tensor slots = index->touch(to_tensor(ids));
      expect_same(index->admit(to_tensor(ids), slots, std::nullopt), reference.assign(ids), batch);
    } else {
      expect_same(index->assign(to_tensor(ids)), reference.assign(ids), batch);
    }
    if (batch == 40) {
      index = IdIndex::from_state(index->state());
    }
  }
  const std::vector<int64_t> keys = to_vector(index->keys());
  for (size_t slot = 0; slot < keys.size(); ++slot) {
    EXPECT_EQ(reference.slot_of(keys[slot]), static_cast<int64_t>(slot));
    EXPECT_EQ(to_vector(index->counts())[slot], reference.count_of(keys[slot]));
  }
  EXPECT_EQ(index->candidates(), reference.pool_size());
}

INSTANTIATE_TEST_SUITE_P(Configs, IdIndexStreams,
                         ::testing::Values(Config{16, 1, "lru", 0}, Config{16, 1, "lfu", 0}, Config{24, 2, "lru", 40},
                                           Config{24, 3, "lfu", 8}, Config{64, 2, "lfu", 200}));

TEST(IdIndex, LargeBatchesReadAheadAlikeThroughGrowthAndEviction) {
  // Batches of thousands of ids: the lookups run on several threads and read the map ahead of their probes, the
  // admissions read ahead of their inserts; the map grows by itself (nothing reserved), then rows are evicted.
  for (const char* policy : {"lru", "lfu"}) {
    Stream stream(21, 20000);
    IdIndex index(6000, 1, policy, 0);
    Reference reference(6000, 1, std::string(policy) == "lfu", 0);
    for (int batch = 0; batch < 4; ++batch) {
      const std::vector<int64_t> ids = stream.batch(9000);
      index.advance_step();
      reference.advance_step();
      expect_same(index.assign(to_tensor(ids)), reference.assign(ids), batch);
    }
    std::vector<int64_t> want;
    for (const int64_t key : stream.keys) {
      want.push_back(reference.slot_of(key));
    }
    EXPECT_EQ(to_vector(index.find(to_tensor(stream.keys))), want) << policy;
  }
}

TEST(IdIndex, InsertsAndFinds) {
  IdIndex index(8, 1, "lru", 0);
  index.advance_step();
  const auto [slots, admitted, evicted_keys, evicted_slots] = index.assign(to_tensor({-5, INT64_MAX, -5, 7}));
  EXPECT_EQ(to_vector(slots), (std::vector<int64_t>{0, 1, 0, 2}));
  EXPECT_EQ(to_vector(admitted), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(evicted_keys.numel(), 0);
  EXPECT_EQ(to_vector(index.find(to_tensor({7, 8, INT64_MAX, -5}))), (std::vector<int64_t>{2, -1, 1, 0}));
  EXPECT_EQ(to_vector(index.counts()), (std::vector<int64_t>{2, 1, 1}));
  const at::Tensor state = index.state();
  index.find(to_tensor({8, 9}));  // find changes nothing
  EXPECT_TRUE(at::equal(index.state(), state));
}

TEST(IdIndex, AdmitsAfterKSightingsAcrossBatches) {
  IdIndex index(8, 3, "lru", 4);
  index.advance_step();
  EXPECT_EQ(to_vector(std::get<0>(index.assign(to_tensor({10, 10, 11})))), (std::vector<int64_t>{-1, -1, -1}));
  EXPECT_EQ(index.candidates(), 2);
  index.advance_step();
  // 10: 2 + 1 sightings, admitted; every occurrence in the batch reads its row. 11: 1 + 1, not yet.
  EXPECT_EQ(to_vector(std::get<0>(index.assign(to_tensor({11, 10})))), (std::vector<int64_t>{-1, 0}));
  EXPECT_EQ(to_vector(index.counts()), (std::vector<int64_t>{3}));
  EXPECT_EQ(index.candidates(), 1);
}

TEST(IdIndex, EvictsTheLeastRecentlySeenRowNotSeenInTheCurrentStep) {
  IdIndex index(3, 1, "lru", 0);
  index.advance_step();
  index.assign(to_tensor({1, 2, 3}));
  index.advance_step();
  index.assign(to_tensor({1}));  // 2 is now the least recently seen
  const auto [slots, admitted, evicted_keys, evicted_slots] = index.assign(to_tensor({4, 5, 6}));
  // 4 evicts 2, 5 evicts 3; 1 was seen in this step, so 6 waits (and reads no row).
  EXPECT_EQ(to_vector(slots), (std::vector<int64_t>{1, 2, -1}));
  EXPECT_EQ(to_vector(evicted_keys), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(to_vector(evicted_slots), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(to_vector(index.find(to_tensor({2, 3, 6}))), (std::vector<int64_t>{-1, -1, -1}));
}

TEST(IdIndex, EvictsTheLowestCountThenTheLeastRecentlySeen) {
  IdIndex index(3, 1, "lfu", 0);
  index.advance_step();
  index.assign(to_tensor({1, 1, 1, 2, 2, 3, 3}));  // counts 3, 2, 2
  index.advance_step();
  index.assign(to_tensor({2}));  // counts 3, 3, 2
  index.advance_step();
  const auto evicted = std::get<2>(index.assign(to_tensor({4, 5})));
  // 3 (count 2) goes first, then 4 itself (count 1, seen in this step: protected), so 1 (count 3, older than 2).
  EXPECT_EQ(to_vector(evicted), (std::vector<int64_t>{3, 1}));
}

TEST(IdIndex, AdmitProtectsRowsSeenSinceProtectFrom) {
  // A pipeline touches batch t+1 in step s+1 while step s's update is in flight: rows of step s must stay.
  IdIndex index(2, 1, "lru", 0);
  index.advance_step();  // s = 1
  index.assign(to_tensor({1, 2}));
  index.advance_step();  // s + 1
  const at::Tensor ids = to_tensor({3});
  const at::Tensor slots = index.touch(ids);
  EXPECT_EQ(to_vector(slots), (std::vector<int64_t>{-1}));
  const auto held = index.admit(ids, slots, /*protect_from=*/1);
  EXPECT_EQ(to_vector(std::get<0>(held)), (std::vector<int64_t>{-1}));
  EXPECT_EQ(std::get<2>(held).numel(), 0);
  const auto taken = index.admit(ids, slots, std::nullopt);  // step 1 is done: its rows may go
  EXPECT_EQ(to_vector(std::get<0>(taken)), (std::vector<int64_t>{0}));
  EXPECT_EQ(to_vector(std::get<2>(taken)), (std::vector<int64_t>{1}));
}

TEST(IdIndex, CandidatePoolForgetsTheLeastRecentlySeen) {
  IdIndex index(4, 2, "lru", 2);
  index.advance_step();
  index.assign(to_tensor({1}));
  index.assign(to_tensor({2}));
  index.assign(to_tensor({3}));  // the pool holds 2 and 3: 1 is forgotten
  EXPECT_EQ(index.candidates(), 2);
  // 2's second sighting admits it; 1 starts again from one (and 3, now the least recently seen, stays).
  EXPECT_EQ(to_vector(std::get<0>(index.assign(to_tensor({2, 1})))), (std::vector<int64_t>{0, -1}));
  EXPECT_EQ(index.candidates(), 2);
}

TEST(IdIndex, StateRoundTripsAndRefusesMismatches) {
  Stream stream(3, 50);
  IdIndex index(10, 2, "lfu", 6);
  for (int i = 0; i < 20; ++i) {
    index.advance_step();
    index.assign(to_tensor(stream.batch(12)));
  }
  auto copy = IdIndex::from_state(index.state());
  EXPECT_TRUE(at::equal(copy->state(), index.state()));
  for (int i = 0; i < 10; ++i) {
    const at::Tensor ids = to_tensor(stream.batch(12));
    index.advance_step();
    copy->advance_step();
    EXPECT_TRUE(at::equal(std::get<0>(index.assign(ids)), std::get<0>(copy->assign(ids))));
  }
  EXPECT_TRUE(at::equal(copy->state(), index.state()));
  IdIndex other(11, 2, "lfu", 6);
  EXPECT_NE(error_of([&] { other.load_state(index.state()); }).find("this one has capacity=11"), std::string::npos);
}

TEST(IdIndex, RefusesCapacitiesBeyond32BitSlots) {
  EXPECT_NE(error_of([] { IdIndex(int64_t{1} << 32, 1, "lru", 0); }).find("slots are 32-bit"), std::string::npos);
  EXPECT_NE(error_of([] { IdIndex(0, 1, "lru", 0); }).find("capacity must be >= 1"), std::string::npos);
  EXPECT_NE(error_of([] { IdIndex(4, 2, "lru", 0); }).find("candidate_capacity must be >= 1"), std::string::npos);
  IdIndex largest((int64_t{1} << 32) - 1, 1, "lru", 0);  // nothing is allocated up front
  largest.advance_step();
  EXPECT_EQ(to_vector(std::get<0>(largest.assign(to_tensor({42, 43})))), (std::vector<int64_t>{0, 1}));
}

TEST(IdIndex, CountsSaturateAndStepsPast32BitsStayExact) {
  // Counts are 32-bit (saturating), last steps exact int64s.
  IdIndex index(4, 1, "lfu", 0);
  at::Tensor state = index.state();
  auto rows = state.accessor<int64_t, 2>();
  const int64_t step = (int64_t{1} << 33) + 5;
  rows[1][1] = step;  // the current step
  rows[1][3] = 2;     // two slots
  rows[3][0] = 11, rows[3][1] = int64_t{1} << 40, rows[3][2] = step - 3, rows[3][3] = 1;
  rows[4][0] = 12, rows[4][1] = 2, rows[4][2] = step - 1, rows[4][3] = 2;
  index.load_state(state);
  EXPECT_EQ(to_vector(index.counts()), (std::vector<int64_t>{4294967295, 2}));
  EXPECT_EQ(to_vector(index.last_steps()), (std::vector<int64_t>{step - 3, step - 1}));
  index.advance_step();
  index.assign(to_tensor({11, 12}));
  EXPECT_EQ(to_vector(index.counts()), (std::vector<int64_t>{4294967295, 3}));
  EXPECT_EQ(to_vector(index.last_steps()), (std::vector<int64_t>{step + 1, step + 1}));
  index.advance_step();
  // Full (capacity 4 after two more), the lowest count goes first: 12 (3), then the new 13 (1) is protected.
  index.assign(to_tensor({13, 14}));
  EXPECT_EQ(to_vector(std::get<2>(index.assign(to_tensor({15})))), (std::vector<int64_t>{12}));
}

TEST(IdIndex, CountsAndGapsPastTheirRecordsMatchTheReference) {
  // A count reaches 65,535 (batches of one id 40,000 times) and rows go unseen for 70,000 steps at a time: both
  // spill out of the 16-bit fields of the slots' records, through evictions and a restore.
  for (const char* policy : {"lru", "lfu"}) {
    Stream stream(5, 30);
    auto index = c10::make_intrusive<IdIndex>(8, 1, policy, 0);
    Reference reference(8, 1, std::string(policy) == "lfu", 0);
    for (int batch = 0; batch < 24; ++batch) {
      for (int step = 0; step < (batch % 4 == 0 ? 70000 : 1); ++step) {
        index->advance_step();
        reference.advance_step();
      }
      std::vector<int64_t> ids = stream.batch(6);
      if (batch % 6 == 1) {
        ids.insert(ids.end(), 40000, stream.keys[0]);
      }
      expect_same(index->assign(to_tensor(ids)), reference.assign(ids), batch);
      if (batch == 12) {
        index = IdIndex::from_state(index->state());
      }
    }
    const std::vector<int64_t> keys = to_vector(index->keys()), counts = to_vector(index->counts()),
                               last_steps = to_vector(index->last_steps());
    for (size_t slot = 0; slot < keys.size(); ++slot) {
      EXPECT_EQ(counts[slot], reference.count_of(keys[slot])) << policy;
      EXPECT_EQ(last_steps[slot], reference.last_of(keys[slot])) << policy;
    }
    EXPECT_GT(*std::max_element(counts.begin(), counts.end()), 65535) << policy;
  }
}

TEST(IdIndex, HoldsFewBytesAKey) {
  IdIndex index(100000, 1, "lru", 0);
  index.reserve(100000);
  index.advance_step();
  index.assign(at::arange(100000, at::kLong) * 7919);
  // The key (8), a 12-byte record, an 8-byte bucket at a load of at most 0.9.
  EXPECT_LE(index.memory_bytes(), 100000 * 29);
  EXPECT_EQ(index.size(), 100000);
}

}  // namespace
}  // namespace speedtorch
