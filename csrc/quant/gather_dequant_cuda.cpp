// The GPU routes of speedtorch::gather_dequant (see gather_dequant.h).
#include <ATen/Parallel.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <optional>

#include "cuda/device_index_error.h"
#include "cuda/gather_dequant_kernel.h"
#include "memory/pinned_host_buffer.h"
#include "metrics/transfer_counters.h"
#include "quant/gather_dequant.h"
#include "transfer/checked_row_transfer.h"
#include "transfer/device_access.h"
#include "transfer/row_transfer_cuda.h"
#include "transfer/transfer_policy.h"

namespace speedtorch {
namespace {

// The largest share of the rows the automatic plan stages through CPU threads. The fused kernel reads faster than
// the row gather the transfer policy's rates were measured for, and beside a streaming UVA kernel a staged share of
// 10-20% is what helped most (../shared/probes/uva_reference.py: 0.80-0.89 of memcpy against 0.72-0.75 alone).
constexpr double kMaxAutoStagedShare = 0.15;

QuantizedGpuRows gpu_rows(const at::Tensor& table, const char* base, RowFormat format, int64_t dim) {
  return QuantizedGpuRows{base, table.size(0), table.stride(0) * table.element_size(),
                          table.size(1) * table.element_size(), format, dim};
}

// While it lives, `side` runs after the work queued on `main` so far; when it dies (an exception included), `main`
// waits for everything queued on `side`, so nothing later on `main` (freeing or reusing the output) overtakes it.
class SideStream {
 public:
  SideStream(const c10::cuda::CUDAStream& main, const c10::cuda::CUDAStream& side) : main_(main), side_(side) {
    C10_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
    C10_CUDA_CHECK(cudaEventRecord(event_, main_.stream()));
    C10_CUDA_CHECK(cudaStreamWaitEvent(side_.stream(), event_, 0));
  }
  ~SideStream() {
    // A destructor must not throw: a failure is reported as a warning (the CUDA context is broken anyway).
    C10_CUDA_CHECK_WARN(cudaEventRecord(event_, side_.stream()));
    C10_CUDA_CHECK_WARN(cudaStreamWaitEvent(main_.stream(), event_, 0));
    C10_CUDA_CHECK_WARN(cudaEventDestroy(event_));
  }
  SideStream(const SideStream&) = delete;
  SideStream& operator=(const SideStream&) = delete;

 private:
  c10::cuda::CUDAStream main_, side_;
  cudaEvent_t event_ = nullptr;
};

// The split of a pinned table's rows between the fused kernel (UVA) and CPU threads (staged), as the transfer
// policy plans a gather's, with the automatic staged share capped; all over UVA under capture, and by default when
// the indices are on the GPU: a staged share must first copy its indices to the host, a wait on the stream before
// the kernel is queued, and its copies cross the same link the kernel reads over (bench/RESULTS.md: run 48, fp8
// 0.73 of memcpy with the split, 0.76 UVA alone; run 46, the plain gather's split added nothing with GPU indices).
TransferPlan dequant_plan(const TransferConfig& config, int64_t footprint, int64_t stride_bytes, int64_t count,
                          bool capturing, bool cuda_indices) {
  TransferPlan plan;
  plan.uva_rows = count;
  if (capturing || (cuda_indices && config.uva_fraction < 0)) return plan;
  plan = plan_transfer(config, footprint, stride_bytes, count, at::get_num_threads());
  if (config.uva_fraction < 0) {
    plan.staged_rows = std::min(plan.staged_rows, static_cast<int64_t>(kMaxAutoStagedShare * count));
    plan.uva_rows = count - plan.staged_rows;
  }
  return plan;
}

}  // namespace

void gather_dequant_to_cuda(const at::Tensor& table, const at::Tensor& flat, RowFormat format, int64_t dim,
                            at::Tensor& out, const char* op) {
  const int device = out.get_device();
  c10::cuda::CUDAGuard guard(out.device());
  const c10::cuda::CUDAStream stream = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device));
  auto* out_ptr = out.data_ptr<c10::BFloat16>();
  const int64_t count = flat.numel();
  const int64_t row_bytes = format_row_bytes(format, dim);

  if (table.is_cpu() && !is_pinned_host_memory(table.storage().data())) {
    // No GPU can address the rows: CPU threads read them raw into pinned staging and the copy engine moves them
    // (gather's staged path, which also validates the indices), then the kernel dequantizes the block in order.
    const at::Tensor raw = gather_table_rows(table, flat, out.device(), op);
    launch_gather_dequant(gpu_rows(raw, static_cast<const char*>(raw.const_data_ptr()), format, dim),
                          GpuIndices{nullptr, true, count}, out_ptr, device_index_error_record(device),
                          RowLaunch{full_grid(device)}, stream.stream());
    return;
  }
  // Bad indices raise here; in deferred mode or under capture the kernel flags them (cuda/device_index_error.h).
  bool sorted = false;  // a sorted batch needs no locality sort
  const std::optional<IndexSpan> span = validate_indices(flat, table.size(0), stream.stream(), op, &sorted);
  const at::Tensor dev_idx = indices_on(flat, out.device());
  if (table.is_cuda()) {
    launch_gather_dequant(gpu_rows(table, static_cast<const char*>(table.const_data_ptr()), format, dim),
                          GpuIndices{dev_idx.const_data_ptr(), dev_idx.scalar_type() == at::kLong, count},
                          out_ptr, device_index_error_record(device), RowLaunch{full_grid(device)}, stream.stream());
    metrics::add_rows_moved(metrics::TransferPath::kGpuTable, metrics::Direction::kGather, count, row_bytes);
    return;
  }
  // A pinned host table: the fused kernel reads its share over UVA (sorted by row first where the batch spans much
  // of the table) while CPU threads gather the rest raw through pinned staging (gather's staged path), which a
  // second kernel then dequantizes into place.
  const TransferConfig config = transfer_config();
  const int64_t stride_bytes = table.stride(0) * table.element_size();
  const int64_t footprint = touched_bytes(table.size(0), stride_bytes, span);
  const TransferPlan plan = dequant_plan(config, footprint, stride_bytes, count, stream_is_capturing(stream.stream()),
                                        flat.is_cuda());
  // The staged share's indices come to the host before the kernel is queued (a copy after it would wait for it), and
  // the kernel runs on a side stream, so that the staged copies, which follow the current stream, do not queue
  // behind it either; the current stream waits for it at the end.
  at::Tensor staged_idx;
  if (plan.staged_rows > 0) staged_idx = flat.narrow(0, plan.uva_rows, plan.staged_rows).cpu();
  const c10::cuda::CUDAStream uva_stream =
      plan.staged_rows > 0 ? c10::cuda::getStreamFromPool(false, static_cast<c10::DeviceIndex>(device)) : stream;
  std::optional<SideStream> side;
  if (plan.staged_rows > 0) side.emplace(stream, uva_stream);
  if (plan.uva_rows > 0) {
    c10::cuda::CUDAStreamGuard on_uva_stream(uva_stream);
    const UvaShare share =
        uva_share(dev_idx.narrow(0, 0, plan.uva_rows), plan.uva_rows, table, footprint, sorted, config, device,
                  uva_stream.stream());
    launch_gather_dequant(gpu_rows(table, mapped_address(table, op, "table"), format, dim), share.view, out_ptr,
                          device_index_error_record(device), uva_launch(device, config), uva_stream.stream());
    note_uva_use(table, UvaAccess::kRead, uva_stream);
    metrics::add_rows_moved(metrics::TransferPath::kUva, metrics::Direction::kGather, plan.uva_rows, row_bytes);
  }
  if (plan.staged_rows > 0) {
    const TransferConfigScope all_staged({{"uva_fraction", 0.0}}, op);
    const at::Tensor raw = gather_table_rows(table, staged_idx, out.device(), op);  // counts its rows itself
    launch_gather_dequant(gpu_rows(raw, static_cast<const char*>(raw.const_data_ptr()), format, dim),
                          GpuIndices{nullptr, true, plan.staged_rows}, out_ptr + plan.uva_rows * dim,
                          device_index_error_record(device), RowLaunch{full_grid(device)}, stream.stream());
  }
  // Leaving: the current stream waits for the UVA share's side stream (SideStream).
}

}  // namespace speedtorch
