// The host<->GPU transfer engine and device-resident row operations (see row_transfer_cuda.h).
//
// Ordering: every kernel runs on the caller's current stream. Staged copies run on a pooled copy stream that first
// waits for the caller's stream (so it never touches memory the caller's earlier work still uses) and is waited for
// by the caller's stream on every exit, an exception included (StagedShare): later work on the caller's stream sees
// all rows and never frees or overwrites memory a copy still uses. The staged share itself is done by the calling
// thread before the call returns; with the option stream_ordered_staging every row is staged instead, by helper
// threads at the call's place in the caller's stream (transfer/stream_ordered_staging.h).
//
// CUDA graph capture: a graph replays the kernels, never the calling thread's work, and nothing may wait for the GPU
// while a stream is captured. So under capture every row goes over UVA, the indices never come to the host, and
// bad indices are flagged by the kernels (cuda/device_index_error.h) instead of raised before launch.
#include "transfer/row_transfer_cuda.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <ATen/Parallel.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <optional>

#include "cpu/index_range_check.h"
#include "cpu/row_copy_cpu.h"
#include "cpu/table_views.h"
#include "memory/pinned_host_buffer.h"
#include "cuda/device_index_error.h"
#include "cuda/row_kernels.h"
#include "metrics/transfer_counters.h"
#include "transfer/device_access.h"
#include "memory/host_access_tracker.h"
#include "transfer/split_calibration.h"
#include "transfer/staging_ring.h"
#include "transfer/stream_ordered_staging.h"
#include "transfer/transfer_policy.h"

namespace speedtorch {
namespace {

// Below this many rows, sorting costs more than the translation misses it saves.
constexpr int64_t kMinSortedRows = 4096;

}  // namespace

UvaShare uva_share(const at::Tensor& dev_idx, int64_t count, const at::Tensor& table, int64_t footprint,
                   bool sorted, const TransferConfig& config, int device, cudaStream_t stream) {
  UvaShare share;
  share.view = GpuIndices{dev_idx.const_data_ptr(), dev_idx.scalar_type() == at::kLong, count, nullptr};
  if (sorted || !config.sort_uva_indices || footprint <= config.uva_reach_bytes || count < kMinSortedRows) {
    return share;
  }
  const LocalitySortPlan plan =
      plan_locality_sort(share.view, table.size(0), table.stride(0) * table.element_size(),
                         config.uva_sort_bucket_bytes);
  const auto on_device = dev_idx.options();
  share.sorted = at::empty({count}, on_device);
  share.positions = at::empty({count}, on_device.dtype(at::kLong));
  const at::Tensor iota = at::empty({count}, on_device.dtype(at::kLong));
  const at::Tensor temp = at::empty({static_cast<int64_t>(plan.temp_bytes)}, on_device.dtype(at::kByte));
  launch_locality_sort(share.view, plan, temp.data_ptr(), share.sorted.data_ptr(),
                       share.positions.data_ptr<int64_t>(), iota.data_ptr<int64_t>(), full_grid(device), stream);
  share.view.data = share.sorted.const_data_ptr();
  share.view.positions = share.positions.const_data_ptr<int64_t>();
  return share;
}

namespace {

// What a GPU scatter needs before it writes: one writer per row (the last occurrence) and an abort flag that a
// bad index sets, so the write is all or nothing.
struct WriterMask {
  at::Tensor keep;
  at::Tensor abort;
};

WriterMask mark_writers(const at::Tensor& dev_idx, int64_t num_rows, int device, cudaStream_t stream) {
  const int64_t count = dev_idx.numel();
  const auto on_device = dev_idx.options();
  WriterMask mask{at::empty({count}, on_device.dtype(at::kByte)), at::zeros({1}, on_device.dtype(at::kInt))};
  const at::Tensor scratch = at::empty({last_occurrence_scratch_bytes(count)}, on_device.dtype(at::kByte));
  launch_mark_last_occurrence(GpuIndices{dev_idx.const_data_ptr(), dev_idx.scalar_type() == at::kLong, count},
                              num_rows, scratch.data_ptr(), mask.keep.data_ptr<uint8_t>(),
                              mask.abort.data_ptr<int32_t>(), device_index_error_record(device), full_grid(device),
                              stream);
  return mask;
}

// The rows of one call each share moved (metrics/transfer_counters.h), counted when the work has been issued.
void count_pinned_transfer(int64_t uva_rows, int64_t staged_rows, int64_t row_bytes, metrics::Direction direction) {
  metrics::add_rows_moved(metrics::TransferPath::kUva, direction, uva_rows, row_bytes);
  metrics::add_rows_moved(metrics::TransferPath::kStaged, direction, staged_rows, row_bytes);
}

void count_gpu_table_transfer(const at::Tensor& table, int64_t rows, metrics::Direction direction) {
  metrics::add_rows_moved(metrics::TransferPath::kGpuTable, direction, rows, table.size(1) * table.element_size());
}

GpuRows gpu_rows(const at::Tensor& table, char* base) {
  return GpuRows{base, table.size(0), table.stride(0) * table.element_size(), table.size(1) * table.element_size()};
}

GpuIndices gpu_indices(const at::Tensor& indices, int64_t count) {
  return GpuIndices{indices.const_data_ptr(), indices.scalar_type() == at::kLong, count};
}

// Copy stream ordered after everything enqueued so far on `stream`.
c10::cuda::CUDAStream copy_stream_after(const c10::cuda::CUDAStream& stream, cudaEvent_t event, int device) {
  c10::cuda::CUDAStream copy = c10::cuda::getStreamFromPool(/*isHighPriority=*/false,
                                                            static_cast<c10::DeviceIndex>(device));
  C10_CUDA_CHECK(cudaEventRecord(event, stream.stream()));
  C10_CUDA_CHECK(cudaStreamWaitEvent(copy.stream(), event, 0));
  return copy;
}

// The staged share's ring and copy stream. The copy stream starts after everything the caller enqueued before this
// is constructed; the caller's stream waits for everything the copy stream was given on every exit from the scope,
// an exception included, so no later work on the caller's stream (freeing src or out, reusing them) overtakes a copy
// still in flight.
class StagedShare {
 public:
  StagedShare(const c10::cuda::CUDAStream& caller, int device, int64_t chunk_bytes)
      : caller_(caller), ring_(device, chunk_bytes), copy_(copy_stream_after(caller, ring_->start_event(), device)) {}
  ~StagedShare() {
    // A destructor must not throw: a failure here is reported as a warning (the CUDA context is broken anyway).
    C10_CUDA_CHECK_WARN(cudaEventRecord(ring_->done_event(), copy_.stream()));
    C10_CUDA_CHECK_WARN(cudaStreamWaitEvent(caller_.stream(), ring_->done_event(), 0));
  }
  StagedShare(const StagedShare&) = delete;
  StagedShare& operator=(const StagedShare&) = delete;

  StagingRing& ring() const { return *ring_; }
  cudaStream_t copy_stream() const { return copy_.stream(); }

 private:
  c10::cuda::CUDAStream caller_;
  BorrowedStagingRing ring_;  // returned to the pool after the wait above is enqueued
  c10::cuda::CUDAStream copy_;
};

// The guard's timing of a measured split (split_calibration.h): a call that stages a share taken from a measurement
// is timed as the calibration timed its trials, by a pair of timing events on the caller's stream around the
// transfer (the host's part included: the end is recorded after it), and the pair is read at the next call of the
// same kind, without waiting: a pair not done yet leaves that call untimed. One pair per kind, so one call of each
// kind is in flight at a time; a call on another thread meanwhile goes untimed.
struct TimedCall {
  at::cuda::CUDAEvent start{cudaEventDefault};  // timing enabled (the default flags disable it)
  at::cuda::CUDAEvent stop{cudaEventDefault};
  double uva_share = 1.0;
  bool claimed = false;    // a call is recording it
  bool in_flight = false;  // recorded, not yet read
};

class SplitTimings {
 public:
  // Reads the kind's last timed call if it is done, reporting it to the guard (which may move the kind's share),
  // and returns the pair for this call; null while the pair is still in use.
  TimedCall* take(const SplitKey& key) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::unique_ptr<TimedCall>& call = calls_[key];
    if (!call) call = std::make_unique<TimedCall>();
    if (call->claimed || (call->in_flight && !call->stop.query())) return nullptr;
    if (call->in_flight) note_split_time(key, call->uva_share, call->start.elapsed_time(call->stop));
    call->in_flight = false;
    call->claimed = true;
    return call.get();
  }
  void give_back(TimedCall* call, bool recorded) {
    std::lock_guard<std::mutex> lock(mutex_);
    call->claimed = false;
    call->in_flight = recorded;
  }

 private:
  std::mutex mutex_;
  std::map<SplitKey, std::unique_ptr<TimedCall>> calls_;
};

SplitTimings& split_timings() {
  static SplitTimings* timings = new SplitTimings();  // leaked on purpose: its events must not die after the driver
  return *timings;
}

// One call's use of its kind's pair: begin() before the transfer's own work (the indices' trip to the host
// included, as in the calibration's trials), end() after it; handed back when destroyed, an exception included
// (untimed then).
class CallTiming {
 public:
  CallTiming(TimedCall* call, double uva_share) : call_(call) { call_->uva_share = uva_share; }
  ~CallTiming() { split_timings().give_back(call_, ended_); }
  CallTiming(const CallTiming&) = delete;
  CallTiming& operator=(const CallTiming&) = delete;
  void begin(const c10::cuda::CUDAStream& stream) { call_->start.record(stream); }
  void end(const c10::cuda::CUDAStream& stream) {
    call_->stop.record(stream);
    ended_ = true;
  }

 private:
  TimedCall* call_;
  bool ended_ = false;
};

// What a transfer between a pinned table and a GPU knows before it moves a row.
struct PinnedTransfer {
  HostRows rows{};
  TransferConfig config;
  int64_t footprint = 0;  // table bytes the batch spans (the whole table when the span is unknown)
  TransferPlan plan;
  bool sorted = false;  // the indices are known to be non-decreasing: the UVA share is in order already
  at::Tensor host_idx;  // the indices on the host: CPU indices, or CUDA ones when a staged share needs them
  std::optional<SplitKey> calibrate;  // this call measures its split first (split_calibration.h)
  std::shared_ptr<CallTiming> timing;  // this call's split is timed for the guard (split_calibration.h)
};

// The split of a call: fixed by the rules, measured before (or by this call), or the model's. A pageable table
// (which no GPU can address) goes all through staging. Under graph capture every row goes over UVA: the staged path
// runs on the calling thread (a replay would skip it) and would need the indices on the host. Deferred index checks
// promise no wait: such a call measures nothing, it takes a measurement made before or the model's split.
void choose_split(PinnedTransfer& t, const at::Tensor& indices, bool pageable, TransferDirection direction,
                  int device, cudaStream_t stream) {
  const int64_t count = indices.numel();
  const int threads = at::get_num_threads();
  if (pageable) {
    t.plan = plan_from_share(0.0, count);
    return;
  }
  if (stream_is_capturing(stream)) {
    t.plan = plan_from_share(1.0, count);
    return;
  }
  if (fixed_uva_share(t.config, t.rows.row_bytes, count).has_value() || !t.config.calibrate_split) {
    t.plan = plan_transfer(t.config, t.footprint, t.rows.row_bytes, count, threads);
    return;
  }
  const SplitKey key =
      split_key(device, direction, indices.is_cpu(), t.footprint, t.rows.row_bytes, count, threads, t.config);
  if (std::optional<double> share = calibrated_uva_share(key)) {
    if (*share < 1.0) {
      // The last timed call of this kind is reported first: the guard may have given UVA rows back.
      TimedCall* call = split_timings().take(key);
      share = calibrated_uva_share(key);
      if (call != nullptr) t.timing = std::make_shared<CallTiming>(call, *share);
    }
    t.plan = plan_from_share(*share, count);
  } else if (deferred_index_checks()) {
    t.plan = plan_transfer(t.config, t.footprint, t.rows.row_bytes, count, threads);
  } else {
    t.calibrate = key;
    t.plan = plan_from_share(1.0, count);
  }
}

// Validates the indices and splits the rows between UVA and staging.
PinnedTransfer plan_pinned_transfer(const at::Tensor& table, const at::Tensor& indices, TransferDirection direction,
                                    int device, cudaStream_t stream, const char* op) {
  PinnedTransfer t;
  t.rows = host_rows(table);
  t.config = transfer_config();
  const bool pageable = !is_pinned_host_memory(table.storage().data());
  TORCH_CHECK(!pageable || !stream_is_capturing(stream), op, ": the table is in pageable host memory (not "
              "page-locked), which only CPU threads can read: that cannot be captured into a CUDA graph. Pin it "
              "(speedtorch.pinned_empty, PinnedEmbedding, Tensor.pin_memory(), or open its file with pin=True)");
  // CUDA indices come to the host only when the staged path needs them.
  const std::optional<IndexSpan> span = validate_indices(indices, t.rows.num_rows, stream, op, &t.sorted);
  t.footprint = touched_bytes(t.rows.num_rows, t.rows.row_stride_bytes, span);
  choose_split(t, indices, pageable, direction, device, stream);
  if (t.timing != nullptr && t.plan.staged_rows > 0) {
    t.timing->begin(c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)));
  } else {
    t.timing.reset();  // UVA alone: nothing to guard
  }
  if (indices.is_cpu() || t.plan.staged_rows > 0 || t.calibrate.has_value()) t.host_idx = indices.cpu();
  // Deferred checks left CUDA indices unchecked; the CPU threads of the staged share must not meet a bad one.
  if (!span.has_value() && t.host_idx.defined()) check_index_tensor(t.host_idx, t.rows.num_rows, op);
  return t;
}

// Milliseconds the GPU work `run` enqueues on `stream` takes, its CPU work included (it runs before the end is
// recorded): for the calibration only, which waits for it.
template <typename Run>
double timed_ms(const c10::cuda::CUDAStream& stream, Run&& run) {
  at::cuda::CUDAEvent start(cudaEventDefault);  // timing enabled (the default flags disable it)
  at::cuda::CUDAEvent stop(cudaEventDefault);
  start.record(stream);
  run();
  stop.record(stream);
  stop.synchronize();
  return start.elapsed_time(stop);
}

// The call's own transfer `move(plan)` run once per candidate share to measure it (split_calibration.h), then the
// share kept. Every run moves the same rows the same way: a gather rereads them, a scatter_ rewrites them.
template <typename Move>
void calibrate_split(PinnedTransfer& t, const at::Tensor& indices, const c10::cuda::CUDAStream& stream,
                     Move&& move) {
  if (!t.calibrate.has_value()) return;
  const int64_t count = indices.numel();
  const double share = calibrate_uva_share(*t.calibrate, [&](double candidate) {
    PinnedTransfer trial = t;
    trial.plan = plan_from_share(candidate, count);
    return timed_ms(stream, [&] {
      // Every later call that stages a share brings GPU indices to the host (a copy and a wait for the stream);
      // a trial that skipped it made splits look faster than they run (H100 run 57: auto 0.69 of memcpy at 16
      // threads where UVA alone moved 0.78).
      if (trial.plan.staged_rows > 0 && indices.is_cuda()) trial.host_idx = indices.cpu();
      move(trial);
    });
  });
  t.plan = plan_from_share(share, count);
}

// Whole rows per chunk: at least one, the ring being sized for the rows (staging_chunk_bytes_for).
int64_t rows_per_staging_chunk(const StagingRing& ring, const HostRows& rows) {
  const int64_t n = ring.chunk_bytes() / rows.row_bytes;
  TORCH_INTERNAL_ASSERT(n >= 1, "staging chunk of ", ring.chunk_bytes(), " bytes cannot hold a row of ",
                        rows.row_bytes, " bytes");
  return n;
}

// Staged gather of positions [first, count): CPU threads fill a chunk, the copy engine moves it while the next fills.
template <typename Index>
void staged_gather(const HostRows& rows, const Index* host_idx, int64_t first, int64_t count, char* out_device,
                   StagingRing& ring, cudaStream_t copy) {
  const int64_t rows_per_chunk = rows_per_staging_chunk(ring, rows);
  int slot = 0;
  for (int64_t begin = first; begin < count; begin += rows_per_chunk, slot = (slot + 1) % StagingRing::kChunks) {
    const int64_t n = std::min(rows_per_chunk, count - begin);
    C10_CUDA_CHECK(cudaEventSynchronize(ring.chunk_event(slot)));  // its previous copy has left the chunk
    gather_rows_cpu(rows, host_idx + begin, n, ring.chunk(slot));
    C10_CUDA_CHECK(cudaMemcpyAsync(out_device + begin * rows.row_bytes, ring.chunk(slot), n * rows.row_bytes,
                                   cudaMemcpyHostToDevice, copy));
    C10_CUDA_CHECK(cudaEventRecord(ring.chunk_event(slot), copy));
  }
}

// Staged scatter of positions [first, count): the copy engine brings chunks down ahead, CPU threads write the rows.
template <typename Index>
void staged_scatter(const HostRows& rows, const Index* host_idx, int64_t first, int64_t count, const char* src_device,
                    const uint8_t* host_keep, StagingRing& ring, cudaStream_t copy) {
  const int64_t rows_per_chunk = rows_per_staging_chunk(ring, rows);
  const int64_t chunks = (count - first + rows_per_chunk - 1) / rows_per_chunk;
  auto issue = [&](int64_t chunk) {
    const int slot = static_cast<int>(chunk % StagingRing::kChunks);
    const int64_t begin = first + chunk * rows_per_chunk;
    const int64_t n = std::min(rows_per_chunk, count - begin);
    C10_CUDA_CHECK(cudaEventSynchronize(ring.chunk_event(slot)));  // an earlier transfer may still use the chunk
    C10_CUDA_CHECK(cudaMemcpyAsync(ring.chunk(slot), src_device + begin * rows.row_bytes, n * rows.row_bytes,
                                   cudaMemcpyDeviceToHost, copy));
    C10_CUDA_CHECK(cudaEventRecord(ring.chunk_event(slot), copy));
  };
  for (int64_t c = 0; c < std::min<int64_t>(chunks, StagingRing::kChunks); ++c) issue(c);
  for (int64_t c = 0; c < chunks; ++c) {
    const int slot = static_cast<int>(c % StagingRing::kChunks);
    const int64_t begin = first + c * rows_per_chunk;
    const int64_t n = std::min(rows_per_chunk, count - begin);
    C10_CUDA_CHECK(cudaEventSynchronize(ring.chunk_event(slot)));
    // Chunks are written in order, so across chunks the last occurrence of a row still lands last.
    scatter_rows_cpu(rows, host_idx + begin, n, ring.chunk(slot), host_keep ? host_keep + (begin - first) : nullptr);
    if (c + StagingRing::kChunks < chunks) issue(c + StagingRing::kChunks);
  }
}

}  // namespace

namespace {

// The rows of a planned gather: the UVA share on the caller's stream, the staged share by this thread.
void move_pinned_to_cuda(const at::Tensor& table, const at::Tensor& indices, char* out_ptr, const at::Device& out_device,
                         const PinnedTransfer& t, int device, const c10::cuda::CUDAStream& stream, const char* op) {
  // Begun before the UVA kernel is launched: the copy stream follows the caller's earlier work, not the kernel,
  // and the two shares run together.
  std::optional<StagedShare> staged;
  if (t.plan.staged_rows > 0) staged.emplace(stream, device, staging_chunk_bytes_for(t.config, t.rows.row_bytes));
  if (t.plan.uva_rows > 0) {
    const at::Tensor dev_idx =
        indices_on(indices.is_cpu() ? indices.narrow(0, 0, t.plan.uva_rows) : indices, out_device);
    const UvaShare share =
        uva_share(dev_idx, t.plan.uva_rows, table, t.footprint, t.sorted, t.config, device, stream.stream());
    launch_row_gather(gpu_rows(table, mapped_address(table, op, "table")), share.view, out_ptr,
                      device_index_error_record(device), uva_launch(device, t.config), stream.stream());
    note_uva_use(table, UvaAccess::kRead, stream);
  }
  if (t.plan.staged_rows > 0) {
    // CPU threads read the rows: earlier UVA writes to them must have landed.
    wait_for_uva_conflicts(table.storage().data(), UvaAccess::kRead);
    with_index_type(t.host_idx, [&](const auto* p) {
      staged_gather(t.rows, p, t.plan.uva_rows, indices.numel(), out_ptr, staged->ring(), staged->copy_stream());
    });
  }
  // Leaving scope: the caller's stream waits for the staged copies (StagedShare).
}

// Whether the transfer goes all through staging in stream order (transfer/stream_ordered_staging.h): asked for, a
// pinned table, no graph capture. Its indices are validated here as every route's are (nothing in deferred mode:
// the host function checks them then); `checked` says whether they were.
bool in_stream_order(const at::Tensor& table, const at::Tensor& indices, const c10::cuda::CUDAStream& stream,
                     const char* op, bool* checked) {
  if (!transfer_config().stream_ordered_staging || !is_pinned_host_memory(table.storage().data()) ||
      stream_is_capturing(stream.stream())) {
    return false;
  }
  *checked = validate_indices(indices, table.size(0), stream.stream(), op).has_value();
  return true;
}

}  // namespace

void gather_pinned_to_cuda(const at::Tensor& table, const at::Tensor& indices, at::Tensor& out, const char* op) {
  const int device = out.get_device();
  c10::cuda::CUDAGuard guard(out.device());
  const c10::cuda::CUDAStream stream = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device));
  if (bool checked = false; in_stream_order(table, indices, stream, op, &checked)) {
    gather_pinned_in_stream_order(table, indices, out, checked, stream);
    count_pinned_transfer(0, indices.numel(), table.size(1) * table.element_size(), metrics::Direction::kGather);
    return;
  }
  PinnedTransfer t = plan_pinned_transfer(table, indices, TransferDirection::kGather, device, stream.stream(), op);
  char* out_ptr = static_cast<char*>(out.data_ptr());
  auto move = [&](const PinnedTransfer& plan) {
    move_pinned_to_cuda(table, indices, out_ptr, out.device(), plan, device, stream, op);
  };
  calibrate_split(t, indices, stream, move);
  move(t);
  if (t.timing != nullptr) t.timing->end(stream);
  count_pinned_transfer(t.plan.uva_rows, t.plan.staged_rows, t.rows.row_bytes, metrics::Direction::kGather);
}

namespace {

// One writer per row (the last occurrence) once a GPU kernel writes any share; bad CUDA indices abort the whole
// write. Enqueued on the caller's stream.
WriterMask writers_for_uva_share(const PinnedTransfer& t, const at::Tensor& indices, const at::Tensor& src,
                                 at::Tensor& dev_idx, int device, cudaStream_t stream) {
  if (t.plan.uva_rows == 0) return {};
  dev_idx = indices_on(indices, src.device());
  return mark_writers(dev_idx, t.rows.num_rows, device, stream);
}

// The staged positions' part of the keep mask, brought to the host on the copy stream (which follows the mask's
// kernel); none when no GPU share resolves duplicates (the CPU's sequential order then makes the last one win).
at::Tensor staged_keep_mask_on_host(const WriterMask& writers, const TransferPlan& plan, cudaStream_t copy) {
  if (!writers.keep.defined()) return {};
  at::Tensor host_keep = at::empty({plan.staged_rows}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
  C10_CUDA_CHECK(cudaMemcpyAsync(host_keep.data_ptr(), writers.keep.const_data_ptr<uint8_t>() + plan.uva_rows,
                                 plan.staged_rows, cudaMemcpyDeviceToHost, copy));
  return host_keep;
}

void launch_uva_scatter(const PinnedTransfer& t, const at::Tensor& table, const at::Tensor& dev_idx,
                        const at::Tensor& src, const WriterMask& writers, int device,
                        const c10::cuda::CUDAStream& stream, const char* op) {
  const UvaShare share =
      uva_share(dev_idx, t.plan.uva_rows, table, t.footprint, t.sorted, t.config, device, stream.stream());
  launch_row_scatter(gpu_rows(table, mapped_address(table, op, "table")), share.view,
                     static_cast<const char*>(src.const_data_ptr()), writers.keep.const_data_ptr<uint8_t>(),
                     writers.abort.const_data_ptr<int32_t>(), device_index_error_record(device),
                     uva_launch(device, t.config), stream.stream());
  note_uva_use(table, UvaAccess::kWrite, stream);
}

// The ordering rules of a scatter into a pinned table, each a step below, in this order:
//  1. the CPU writes of the staged share wait for earlier UVA kernels still using the rows (before anything of
//     ours is noted, which the CPU share must not wait for: it touches other positions);
//  2. the writer mask is computed on the caller's stream;
//  3. the copy stream starts after 2 (it copies src and the mask) but before the UVA kernel (they run together);
//  4. the UVA kernel writes its share; 5. the CPU threads write theirs;
//  6. on every exit the caller's stream waits for the copy stream (StagedShare).
void move_cuda_to_pinned(const at::Tensor& table, const at::Tensor& indices, const at::Tensor& src,
                         const PinnedTransfer& t, int device, const c10::cuda::CUDAStream& stream, const char* op) {
  if (t.plan.staged_rows > 0) wait_for_uva_conflicts(table.storage().data(), UvaAccess::kWrite);  // 1
  at::Tensor dev_idx;
  const WriterMask writers = writers_for_uva_share(t, indices, src, dev_idx, device, stream.stream());  // 2
  std::optional<StagedShare> staged;
  at::Tensor host_keep;
  if (t.plan.staged_rows > 0) {  // 3
    staged.emplace(stream, device, staging_chunk_bytes_for(t.config, t.rows.row_bytes));
    host_keep = staged_keep_mask_on_host(writers, t.plan, staged->copy_stream());
  }
  if (t.plan.uva_rows > 0) launch_uva_scatter(t, table, dev_idx, src, writers, device, stream, op);  // 4
  if (t.plan.staged_rows > 0) {  // 5
    with_index_type(t.host_idx, [&](const auto* p) {
      staged_scatter(t.rows, p, t.plan.uva_rows, indices.numel(), static_cast<const char*>(src.const_data_ptr()),
                     host_keep.defined() ? host_keep.const_data_ptr<uint8_t>() : nullptr, staged->ring(),
                     staged->copy_stream());
    });
  }
}  // 6

}  // namespace

void scatter_cuda_to_pinned(const at::Tensor& table, const at::Tensor& indices, const at::Tensor& src,
                            const char* op) {
  const int device = src.get_device();
  c10::cuda::CUDAGuard guard(src.device());
  const c10::cuda::CUDAStream stream = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device));
  if (bool checked = false; in_stream_order(table, indices, stream, op, &checked)) {
    scatter_pinned_in_stream_order(table, indices, src, checked, stream);
    count_pinned_transfer(0, indices.numel(), table.size(1) * table.element_size(), metrics::Direction::kScatter);
    return;
  }
  PinnedTransfer t = plan_pinned_transfer(table, indices, TransferDirection::kScatter, device, stream.stream(), op);
  auto move = [&](const PinnedTransfer& plan) { move_cuda_to_pinned(table, indices, src, plan, device, stream, op); };
  calibrate_split(t, indices, stream, move);
  move(t);
  if (t.timing != nullptr) t.timing->end(stream);
  count_pinned_transfer(t.plan.uva_rows, t.plan.staged_rows, t.rows.row_bytes, metrics::Direction::kScatter);
}

void gather_cuda_table(const at::Tensor& table, const at::Tensor& indices, at::Tensor& out, const char* op) {
  const int device = table.get_device();
  c10::cuda::CUDAGuard guard(table.device());
  const c10::cuda::CUDAStream stream = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device));
  // Bad indices raise here; in deferred mode or under capture the kernels flag them (cuda/device_index_error.h).
  validate_indices(indices, table.size(0), stream.stream(), op);
  const at::Tensor dev_idx = indices_on(indices, table.device());
  launch_row_gather(gpu_rows(table, static_cast<char*>(table.data_ptr())), gpu_indices(dev_idx, indices.numel()),
                    static_cast<char*>(out.data_ptr()), device_index_error_record(device),
                    device_table_launch(device, transfer_config()), stream.stream());
  count_gpu_table_transfer(table, indices.numel(), metrics::Direction::kGather);
}

void scatter_cuda_table(const at::Tensor& table, const at::Tensor& indices, const at::Tensor& src, const char* op) {
  const int device = table.get_device();
  c10::cuda::CUDAGuard guard(table.device());
  const c10::cuda::CUDAStream stream = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device));
  // Bad indices raise here; in deferred mode or under capture the kernels flag them (cuda/device_index_error.h).
  validate_indices(indices, table.size(0), stream.stream(), op);
  const at::Tensor dev_idx = indices_on(indices, table.device());
  const WriterMask writers = mark_writers(dev_idx, table.size(0), device, stream.stream());
  launch_row_scatter(gpu_rows(table, static_cast<char*>(table.data_ptr())), gpu_indices(dev_idx, indices.numel()),
                     static_cast<const char*>(src.const_data_ptr()), writers.keep.const_data_ptr<uint8_t>(),
                     writers.abort.const_data_ptr<int32_t>(), device_index_error_record(device),
                     device_table_launch(device, transfer_config()), stream.stream());
  count_gpu_table_transfer(table, indices.numel(), metrics::Direction::kScatter);
}

}  // namespace speedtorch
