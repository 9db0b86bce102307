// The GPU routes of speedtorch::gather_dequant (see gather_dequant.h).
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include "cuda/device_index_error.h"
#include "cuda/gather_dequant_kernel.h"
#include "memory/pinned_host_buffer.h"
#include "metrics/transfer_counters.h"
#include "quant/gather_dequant.h"
#include "transfer/checked_row_transfer.h"
#include "transfer/device_access.h"
#include "transfer/row_transfer_cuda.h"

namespace speedtorch {
namespace {

QuantizedGpuRows gpu_rows(const at::Tensor& table, const char* base, RowFormat format, int64_t dim) {
  return QuantizedGpuRows{base, table.size(0), table.stride(0) * table.element_size(),
                          table.size(1) * table.element_size(), format, dim};
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
                          full_grid(device), stream.stream());
    return;
  }
  // Bad indices raise here; in deferred mode or under capture the kernel flags them (cuda/device_index_error.h).
  const std::optional<IndexSpan> span = validate_indices(flat, table.size(0), stream.stream(), op);
  const at::Tensor dev_idx = indices_on(flat, out.device());
  if (table.is_cuda()) {
    launch_gather_dequant(gpu_rows(table, static_cast<const char*>(table.const_data_ptr()), format, dim),
                          GpuIndices{dev_idx.const_data_ptr(), dev_idx.scalar_type() == at::kLong, count},
                          out_ptr, device_index_error_record(device), full_grid(device), stream.stream());
    metrics::add_rows_moved(metrics::TransferPath::kGpuTable, metrics::Direction::kGather, count, row_bytes);
    return;
  }
  // A pinned host table: every row over UVA, sorted by row first where the batch spans much of the table.
  const TransferConfig config = transfer_config();
  const int64_t footprint = touched_bytes(table.size(0), table.stride(0) * table.element_size(), span);
  const UvaShare share = uva_share(dev_idx, count, table, footprint, config, device, stream.stream());
  launch_gather_dequant(gpu_rows(table, mapped_address(table, op, "table"), format, dim), share.view, out_ptr,
                        device_index_error_record(device), uva_max_blocks(device, config), stream.stream());
  note_uva_use(table, UvaAccess::kRead, stream);
  metrics::add_rows_moved(metrics::TransferPath::kUva, metrics::Direction::kGather, count, row_bytes);
}

}  // namespace speedtorch
