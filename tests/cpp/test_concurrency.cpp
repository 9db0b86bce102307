// Tests for PinnedEmbedding's thread-safety guarantee (csrc/embedding/pinned_embedding.h, embedding/table_lock.h):
// threads gathering while others scatter_, apply optimizer steps, re-layout, initialise and save the same table, on
// the CPU path. Each test checks that
//   - every row a reader gets is whole: rows are written with all their elements equal, so a row mixing two writes
//     shows two values;
//   - nothing is lost: the final rows, the per-row and table-wide step counts equal what the writers' calls add up
//     to, exactly (small integers in float32);
//   - no call raises.
// `make tsan` runs them under ThreadSanitizer, which also fails them on any data race. Sizes keep each test well
// under a second in a normal build.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "embedding/pinned_embedding.h"
#include "temp_dir.h"

namespace speedtorch {
namespace {

// Failures seen inside worker threads: counted, the first few kept with their text.
class Failures {
 public:
  void add(const std::string& what) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (++count_ <= 5) first_ += what + "\n";
  }
  int count() const { return count_; }
  const std::string& first() const { return first_; }

 private:
  std::mutex mutex_;
  int count_ = 0;
  std::string first_;
};

// Runs every body on its own thread, all released at once; an exception in a body is a failure.
void run_together(const std::vector<std::function<void()>>& bodies, Failures& failures) {
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (const auto& body : bodies) {
    threads.emplace_back([&go, &body, &failures] {
      while (!go.load()) std::this_thread::yield();
      try {
        body();
      } catch (const std::exception& e) {
        failures.add(std::string("exception: ") + e.what());
      }
    });
  }
  go.store(true);
  for (auto& t : threads) t.join();
}

at::Tensor ids_tensor(const std::vector<int64_t>& ids) {
  return at::tensor(at::ArrayRef<int64_t>(ids), at::kLong);
}

// Rows of `values.size()` x dim, row i filled with values[i].
at::Tensor filled_rows(const std::vector<float>& values, int64_t dim) {
  at::Tensor rows = at::empty({static_cast<int64_t>(values.size()), dim}, at::kFloat);
  for (std::size_t i = 0; i < values.size(); ++i) rows[static_cast<int64_t>(i)].fill_(values[i]);
  return rows;
}

// Whether every element of `row` (dim floats) equals its first; the value in *value.
bool whole_row(const float* row, int64_t dim, float* value) {
  *value = row[0];
  for (int64_t j = 1; j < dim; ++j) {
    if (row[j] != row[0]) return false;
  }
  return true;
}

// The row's own step count, kept as int32 bits in the first float of its optimizer state.
int32_t row_step(const at::Tensor& state, int64_t row) {
  const float bits = state[row][0].item<float>();
  int32_t step = 0;
  std::memcpy(&step, &bits, sizeof(step));
  return step;
}

c10::Dict<std::string, double> sgd_lr1() {
  c10::Dict<std::string, double> options;
  options.insert("lr", 1.0);
  return options;
}

constexpr int kReaders = 8;

// Writers own rows (row r belongs to writer r % kWriters) and write them with increasing values; readers gather
// random batches and check each row is whole, belongs to its writer, and never goes back to an older value.
TEST(PinnedEmbeddingConcurrency, GathersSeeWholeRowsWhileScattersWriteThem) {
  constexpr int kWriters = 4;
  constexpr int kRounds = 150;
  constexpr int64_t kRows = 64;
  constexpr int64_t kDim = 1024;  // 4 KiB rows: a copy racing a write would show a mix
  PinnedEmbedding e(kRows, kDim, at::kFloat);
  std::vector<float> initial(kRows);
  for (int64_t r = 0; r < kRows; ++r) initial[r] = -static_cast<float>(r + 1);
  e.copy_(filled_rows(initial, kDim));
  // Round k of writer w writes k * kWriters + w + 1 into each of its rows.
  const auto writer_of = [](float v) { return (static_cast<int64_t>(v) - 1) % kWriters; };

  Failures failures;
  std::atomic<int64_t> rows_checked{0};
  std::vector<std::function<void()>> bodies;
  for (int w = 0; w < kWriters; ++w) {
    bodies.emplace_back([&, w] {
      std::mt19937 rng(w);
      std::vector<int64_t> mine;
      for (int64_t r = w; r < kRows; r += kWriters) mine.push_back(r);
      for (int k = 0; k < kRounds; ++k) {
        std::shuffle(mine.begin(), mine.end(), rng);
        const float value = static_cast<float>(k * kWriters + w + 1);
        e.scatter_(ids_tensor(mine), filled_rows(std::vector<float>(mine.size(), value), kDim));
      }
    });
  }
  for (int t = 0; t < kReaders; ++t) {
    bodies.emplace_back([&, t] {
      std::mt19937 rng(100 + t);
      std::uniform_int_distribution<int64_t> pick(0, kRows - 1);
      std::vector<float> last(kRows, -1e30f);
      for (int k = 0; k < kRounds; ++k) {
        std::vector<int64_t> ids(32);
        for (auto& id : ids) id = pick(rng);
        const at::Tensor got = e.gather(ids_tensor(ids), std::nullopt).contiguous();
        const float* p = got.data_ptr<float>();
        for (std::size_t i = 0; i < ids.size(); ++i) {
          const int64_t r = ids[i];
          float v = 0;
          if (!whole_row(p + i * kDim, kDim, &v)) {
            failures.add("row " + std::to_string(r) + " torn");
          } else if (v != initial[r] && (v < 1 || writer_of(v) != r % kWriters)) {
            failures.add("row " + std::to_string(r) + " holds " + std::to_string(v) + ", which no writer wrote there");
          } else if (v < last[r]) {
            failures.add("row " + std::to_string(r) + " went back from " + std::to_string(last[r]) + " to " +
                         std::to_string(v));
          }
          last[r] = v;
        }
        rows_checked += static_cast<int64_t>(ids.size());
      }
    });
  }
  run_together(bodies, failures);
  EXPECT_EQ(failures.count(), 0) << failures.first();
  EXPECT_EQ(rows_checked.load(), int64_t{kReaders} * kRounds * 32);
  // Nothing lost: each row holds its writer's last value.
  const at::Tensor table = e.table();
  for (int64_t r = 0; r < kRows; ++r) {
    const float want = static_cast<float>((kRounds - 1) * kWriters + r % kWriters + 1);
    EXPECT_TRUE(at::equal(table[r], at::full({kDim}, want))) << "row " << r;
  }
}

// Optimizer steps (SGD, lr 1, gradient -1: each occurrence of a row adds 1 to it) from several threads on shared
// rows, scatters on rows of their own, and gathers over all of them, in both state layouts.
class StepsAndScatters : public ::testing::TestWithParam<bool> {};

TEST_P(StepsAndScatters, LoseNothingAndNeverTearARow) {
  const bool beside = GetParam();
  constexpr int kSteppers = 4;
  constexpr int kScatterers = 2;
  constexpr int kSteps = 60;
  constexpr int64_t kTrained = 64;  // rows [0, 64) get optimizer steps, [64, 96) scatters
  constexpr int64_t kRows = 96;
  constexpr int64_t kDim = 256;
  PinnedEmbedding e(kRows, kDim, at::kFloat);
  e.set_optimizer("sgd", sgd_lr1(), beside);
  std::vector<float> initial(kRows);
  for (int64_t r = 0; r < kRows; ++r) initial[r] = static_cast<float>(r % 7);
  e.copy_(filled_rows(initial, kDim));

  // Step s of stepper t touches these rows, with duplicates (their gradients are summed: +multiplicity).
  const auto step_ids = [](int t, int s) {
    std::vector<int64_t> ids;
    for (int64_t i = 0; i < 24; ++i) ids.push_back((t * 17 + s * 5 + i * i) % kTrained);
    return ids;
  };
  std::vector<float> expected = initial;
  std::vector<int32_t> expected_row_steps(kRows, 0);
  for (int t = 0; t < kSteppers; ++t) {
    for (int s = 0; s < kSteps; ++s) {
      std::vector<bool> touched(kRows, false);
      for (const int64_t r : step_ids(t, s)) {
        expected[r] += 1;
        touched[r] = true;
      }
      for (int64_t r = 0; r < kRows; ++r) expected_row_steps[r] += touched[r] ? 1 : 0;
    }
  }
  // Scatterer w owns rows kTrained + w, kTrained + w + kScatterers, ...; its round k writes 1000 + k.
  for (int64_t r = kTrained; r < kRows; ++r) expected[r] = 1000 + kSteps - 1;

  Failures failures;
  std::vector<std::function<void()>> bodies;
  for (int t = 0; t < kSteppers; ++t) {
    bodies.emplace_back([&, t] {
      for (int s = 0; s < kSteps; ++s) {
        const std::vector<int64_t> ids = step_ids(t, s);
        e.apply_gradients(ids_tensor(ids), at::full({static_cast<int64_t>(ids.size()), kDim}, -1.0f));
      }
    });
  }
  for (int w = 0; w < kScatterers; ++w) {
    bodies.emplace_back([&, w] {
      std::vector<int64_t> mine;
      for (int64_t r = kTrained + w; r < kRows; r += kScatterers) mine.push_back(r);
      for (int k = 0; k < kSteps; ++k) {
        e.scatter_(ids_tensor(mine), filled_rows(std::vector<float>(mine.size(), 1000.0f + k), kDim));
      }
    });
  }
  for (int t = 0; t < kReaders; ++t) {
    bodies.emplace_back([&, t] {
      std::mt19937 rng(200 + t);
      std::uniform_int_distribution<int64_t> pick(0, kRows - 1);
      for (int k = 0; k < kSteps; ++k) {
        std::vector<int64_t> ids(48);
        for (auto& id : ids) id = pick(rng);
        const at::Tensor got = e.gather(ids_tensor(ids), std::nullopt).contiguous();
        for (std::size_t i = 0; i < ids.size(); ++i) {
          float v = 0;
          if (!whole_row(got.data_ptr<float>() + i * kDim, kDim, &v)) {
            failures.add("row " + std::to_string(ids[i]) + " torn");
          } else if (v < initial[ids[i]] || v > expected[ids[i]]) {
            failures.add("row " + std::to_string(ids[i]) + " holds " + std::to_string(v) + ", outside [" +
                         std::to_string(initial[ids[i]]) + ", " + std::to_string(expected[ids[i]]) + "]");
          }
        }
        // The accessors run alongside too (they read what writers change).
        if (e.step_count() > kSteppers * kSteps) failures.add("step count beyond the steps applied");
      }
    });
  }
  run_together(bodies, failures);
  EXPECT_EQ(failures.count(), 0) << failures.first();
  EXPECT_EQ(e.step_count(), kSteppers * kSteps);
  const at::Tensor table = e.table();
  const at::Tensor state = e.state();
  for (int64_t r = 0; r < kRows; ++r) {
    EXPECT_TRUE(at::equal(table[r], at::full({kDim}, expected[r]))) << "row " << r << ": want " << expected[r]
                                                                    << ", got " << table[r][0].item<float>();
    EXPECT_EQ(row_step(state, r), expected_row_steps[r]) << "row " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(StateLayouts, StepsAndScatters, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "StateBesideRows" : "StateApart"; });

// Every optimizer step adds 1 to every row, so a consistent view has all rows equal to the step count. Saves taken
// during training must be such views (rows, state and step count of one moment); so must every whole-table gather.
// The overlap is built in, not hoped for: save i begins when the trainer has made (i + 1) * kStride steps, the
// trainer's next step begins only once that save has begun, and the save is called only once that step has begun,
// so each save's call overlaps a step's and the two race for the lock; the readers start before the first step and
// gather until the last one is done.
class SavesDuringTraining : public speedtorch::testing::TempDirTest {};

TEST_F(SavesDuringTraining, EachSaveIsOneMomentOfTheTable) {
  constexpr int64_t kRows = 32;
  constexpr int64_t kDim = 64;
  constexpr int kSaves = 8;
  constexpr int kStride = 10;                     // steps between saves
  constexpr int kSteps = (kSaves + 1) * kStride;  // the last save is followed by kStride steps
  constexpr int kReaders = 4;
  PinnedEmbedding e(kRows, kDim, at::kFloat);
  e.set_optimizer("sgd", sgd_lr1(), true);
  const at::Tensor all = at::arange(kRows);

  Failures failures;
  // Call boundaries in one global order: [begin, end) tickets of each save and of the step that follows its start.
  std::atomic<int> ticket{0};
  std::vector<std::pair<int, int>> save_calls(kSaves);
  std::vector<std::pair<int, int>> raced_steps(kSaves);
  std::atomic<int> steps_done{0};
  std::atomic<int> saves_begun{0};
  std::atomic<int> racing_steps_begun{0};
  std::atomic<int> readers_ready{0};
  std::atomic<bool> training{true};
  std::atomic<int> reads_during_training{0};
  std::vector<std::function<void()>> bodies;
  bodies.emplace_back([&] {  // the trainer
    while (readers_ready.load() < kReaders) std::this_thread::yield();
    for (int s = 0; s < kSteps; ++s) {
      const int save = s / kStride - 1;  // the save this step races, if s starts a stride
      const bool races = s % kStride == 0 && save >= 0 && save < kSaves;
      if (races) {
        while (saves_begun.load() <= save) std::this_thread::yield();
      }
      const int begin = ticket++;
      if (races) ++racing_steps_begun;
      e.apply_gradients(all, at::full({kRows, kDim}, -1.0f));
      if (races) raced_steps[save] = {begin, ticket++};
      ++steps_done;
    }
    training = false;
  });
  bodies.emplace_back([&] {  // the saver
    for (int i = 0; i < kSaves; ++i) {
      while (steps_done.load() < (i + 1) * kStride) std::this_thread::yield();
      const int begin = ticket++;  // before the trainer may go on: its step begins after this save does
      ++saves_begun;
      // The save is called only once the racing step has begun, so the two calls overlap by construction (on a
      // loaded machine a save could otherwise end before the trainer's thread ran at all); which of the two takes
      // the table's lock first is left to the scheduler.
      while (racing_steps_begun.load() <= i) std::this_thread::yield();
      e.save(path("snap" + std::to_string(i)));
      save_calls[i] = {begin, ticket++};
    }
  });
  for (int t = 0; t < kReaders; ++t) {
    bodies.emplace_back([&] {
      ++readers_ready;
      bool more = true;
      while (more) {
        more = training.load();  // read before the gather: the last one starts after the last step is done
        const at::Tensor got = e.gather(all, std::nullopt);
        const float first = got[0][0].item<float>();
        if (!at::equal(got, at::full({kRows, kDim}, first))) failures.add("a gather saw a step half applied");
        if (more) ++reads_during_training;
      }
    });
  }
  run_together(bodies, failures);
  ASSERT_EQ(failures.count(), 0) << failures.first();
  EXPECT_EQ(e.step_count(), kSteps);
  EXPECT_GE(reads_during_training.load(), kReaders);
  int raced = 0;  // saves whose call overlapped a step's call: one of the two waited for the other's lock
  for (int i = 0; i < kSaves; ++i) {
    auto back = PinnedEmbedding::load(path("snap" + std::to_string(i)), /*verify=*/true);
    const int64_t step = back->step_count();
    // Taken mid-training: after the steps it waited for, before the next save's.
    EXPECT_GE(step, (i + 1) * kStride) << "save " << i;
    EXPECT_LE(step, (i + 2) * kStride) << "save " << i;
    EXPECT_TRUE(at::equal(back->table(), at::full({kRows, kDim}, static_cast<float>(step))))
        << "save " << i << " at step " << step << " holds rows of another step";
    for (int64_t r = 0; r < kRows; ++r) EXPECT_EQ(row_step(back->state(), r), step) << "save " << i << " row " << r;
    if (raced_steps[i].first < save_calls[i].second && save_calls[i].first < raced_steps[i].second) ++raced;
  }
  EXPECT_GE(raced, 1) << "no save overlapped an optimizer step";
  std::printf("[ saves ] %d of %d saves overlapped an optimizer step; %d gathers during training\n", raced, kSaves,
              reads_during_training.load());
}

// Initialisers and re-layouts (set_optimizer moves the rows into a new buffer and frees the old one) alongside
// gathers and accessors: a gather sees the whole table before or after, never a mix nor freed memory.
TEST(PinnedEmbeddingConcurrency, InitialisersAndRelayoutsAreAtomic) {
  constexpr int64_t kRows = 40000;  // several initialiser chunks
  constexpr int64_t kDim = 8;
  constexpr int kRounds = 12;
  PinnedEmbedding e(kRows, kDim, at::kFloat);
  e.zero_();
  const at::Tensor ids = at::arange(0, kRows, 97);

  Failures failures;
  std::atomic<bool> done{false};
  std::vector<std::function<void()>> bodies;
  bodies.emplace_back([&] {
    for (int k = 1; k <= kRounds; ++k) {
      e.copy_(at::full({kRows, kDim}, static_cast<float>(k)));
      e.set_optimizer(k % 2 == 0 ? "sgd" : "adagrad", sgd_lr1(), k % 3 != 0);  // rows move to a new layout
      e.zero_();
      e.copy_(at::full({kRows, kDim}, static_cast<float>(k)));
    }
    done = true;
  });
  for (int t = 0; t < 4; ++t) {
    bodies.emplace_back([&] {
      while (!done.load()) {
        const at::Tensor got = e.gather(ids, std::nullopt);
        const float first = got[0][0].item<float>();
        if (!at::equal(got, at::full_like(got, first))) failures.add("a gather saw an initialiser half done");
        const std::string kind = e.optimizer();
        if (!kind.empty() && kind != "sgd" && kind != "adagrad") failures.add("optimizer name '" + kind + "'");
        if (e.num_rows() != kRows || e.dim() != kDim) failures.add("the table changed shape");
        (void)e.optimizer_options();
        (void)e.state();
      }
    });
  }
  run_together(bodies, failures);
  EXPECT_EQ(failures.count(), 0) << failures.first();
  EXPECT_TRUE(at::equal(e.table(), at::full({kRows, kDim}, static_cast<float>(kRounds))));
}

}  // namespace
}  // namespace speedtorch
