// Routes row transfers to their path (see row_transfer.h); holds the CPU-only routes.
#include "transfer/row_transfer.h"

#include <c10/util/Exception.h>

#include "cpu/index_range_check.h"
#include "cpu/row_copy_cpu.h"
#include "cpu/table_views.h"
#include "memory/pinned_host_buffer.h"
#include "metrics/transfer_counters.h"
#include "memory/host_access_tracker.h"
#ifdef SPEEDTORCH_WITH_CUDA
#include "transfer/row_transfer_cuda.h"
#endif

namespace speedtorch {
namespace {

void gather_cpu(const at::Tensor& table, const at::Tensor& indices, at::Tensor& out, const char* op) {
  const at::Tensor idx = indices.cpu().contiguous();
  const HostRows rows = host_rows(table);
  // Checked as the rows are read (a read of a valid row touches nothing; a separate pass over the indices costs a
  // fifth of a small gather); a bad index stops the copy and is worded by the host check.
  wait_for_uva_conflicts(table.storage().data(), UvaAccess::kRead);
  int64_t bad = -1;
  with_index_type(idx, [&](const auto* p) {
    bad = gather_rows_checked_cpu(rows, p, idx.numel(), static_cast<char*>(out.data_ptr()));
  });
  if (bad >= 0) {
    check_index_tensor(idx, rows.num_rows, op);  // throws, naming the first bad index
    TORCH_INTERNAL_ASSERT(false, op, ": index at position ", bad, " was out of range but passed the check");
  }
  metrics::add_rows_moved(metrics::TransferPath::kCpu, metrics::Direction::kGather, idx.numel(), rows.row_bytes);
}

void scatter_cpu(const at::Tensor& table, const at::Tensor& indices, const at::Tensor& src, const char* op) {
  const at::Tensor idx = indices.cpu().contiguous();
  const HostRows rows = host_rows(table);
  check_index_tensor(idx, rows.num_rows, op);
  with_index_type(idx, [&](const auto* p) {
    wait_for_uva_conflicts(table.storage().data(), UvaAccess::kWrite);
    scatter_rows_cpu(rows, p, idx.numel(), static_cast<const char*>(src.const_data_ptr()));
  });
  metrics::add_rows_moved(metrics::TransferPath::kCpu, metrics::Direction::kScatter, idx.numel(), rows.row_bytes);
}

#ifndef SPEEDTORCH_WITH_CUDA
[[noreturn]] void no_cuda(const char* op) {
  TORCH_CHECK(false, op, ": this speedtorch library was built without CUDA; rebuild it where nvcc and a CUDA "
              "build of PyTorch are installed");
}
#endif

void route_gather(const at::Tensor& table, const at::Tensor& indices, at::Tensor& out, const char* op) {
  if (table.is_cpu() && out.is_cpu()) return gather_cpu(table, indices, out, op);
#ifdef SPEEDTORCH_WITH_CUDA
  if (table.is_cpu() && out.is_cuda()) return gather_pinned_to_cuda(table, indices, out, op);
  if (table.is_cuda() && out.is_cuda()) return gather_cuda_table(table, indices, out, op);
  TORCH_CHECK(false, op, ": cannot move rows from a table on ", table.device(), " to ", out.device());
#else
  no_cuda(op);
#endif
}

void route_scatter(const at::Tensor& table, const at::Tensor& indices, const at::Tensor& src, const char* op) {
  if (table.is_cpu() && src.is_cpu()) return scatter_cpu(table, indices, src, op);
#ifdef SPEEDTORCH_WITH_CUDA
  if (table.is_cpu() && src.is_cuda()) return scatter_cuda_to_pinned(table, indices, src, op);
  if (table.is_cuda() && src.is_cuda()) return scatter_cuda_table(table, indices, src, op);
  TORCH_CHECK(false, op, ": cannot move rows from ", src.device(), " to a table on ", table.device());
#else
  no_cuda(op);
#endif
}

}  // namespace

// Each route counts the rows it moves (metrics/transfer_counters.h); the call is counted once it has succeeded.
void gather_rows(const at::Tensor& table, const at::Tensor& indices, at::Tensor& out, const char* op) {
  if (indices.numel() == 0) return;
  route_gather(table, indices, out, op);
  metrics::add_transfer_call(metrics::Direction::kGather);
}

void scatter_rows(const at::Tensor& table, const at::Tensor& indices, const at::Tensor& src, const char* op) {
  check_host_memory_writable(table, op, "table");  // a write to a mode 'r' mapping is a SIGSEGV
  if (indices.numel() == 0) return;
  route_scatter(table, indices, src, op);
  metrics::add_transfer_call(metrics::Direction::kScatter);
}

}  // namespace speedtorch
