// Gather / scatter of a table's rows as the operators define them (see checked_row_transfer.h).
#include "transfer/checked_row_transfer.h"

#include <ATen/ops/empty.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include "core/memory_overlap.h"
#include "memory/huge_page_output.h"
#include "memory/pinned_host_buffer.h"
#include "transfer/row_transfer.h"

namespace speedtorch {
namespace {

// Sizes and strides are read as SymInts: the operators' Meta kernels run these checks under torch.compile and
// torch.export, where they may be symbols (size() and stride() would throw there).
void check_table(const at::Tensor& table, const char* op, bool written) {
  TORCH_CHECK(table.layout() == at::kStrided, op, ": table must be a dense (strided) tensor, got layout ",
              table.layout());
  TORCH_CHECK(table.dim() == 2, op, ": table must be 2-D (num_rows, dim), got shape ", table.sym_sizes());
  TORCH_CHECK(table.sym_size(1) <= 1 || table.sym_stride(1) == 1, op,
              ": table rows must be contiguous (stride(1) == 1), got strides ", table.sym_strides(),
              "; use a row-major table");
  TORCH_CHECK(table.sym_stride(0) >= 0, op, ": table must not have negative strides, got ", table.sym_strides());
  if (written) {
    TORCH_CHECK(table.sym_size(0) <= 1 || table.sym_stride(0) >= table.sym_size(1), op,
                ": table rows overlap in memory (strides ", table.sym_strides(), ", shape ", table.sym_sizes(),
                "); scatter_ needs a table whose rows are distinct");
  }
}

void check_indices(const at::Tensor& indices, const char* op) {
  TORCH_CHECK(indices.layout() == at::kStrided, op, ": indices must be a dense tensor, got layout ",
              indices.layout());
  TORCH_CHECK(indices.scalar_type() == at::kLong || indices.scalar_type() == at::kInt, op,
              ": indices must be int64 or int32, got ", indices.scalar_type());
}

// A GPU can only reach host rows that are page-locked and mapped.
void check_host_table_reachable(const at::Tensor& table, const at::Device& gpu, const char* op) {
  TORCH_CHECK(is_pinned_host_memory(table.storage().data()), op,
              ": table is in pageable host memory but rows must move to or from ", gpu, "; a GPU can only reach pinned memory. Create the table with speedtorch.pinned_empty(...) or "
              "speedtorch.PinnedEmbedding, or call table.pin_memory() once");
}

// GPU kernels must not write host memory registered for reads only (a table opened with mode 'r', or 'r+' on a
// filesystem whose shared pages GPUs may not write): the fault would ruin the CUDA context.
void check_host_table_writable_by_gpu(const at::Tensor& table, const char* op) {
  TORCH_CHECK(!is_device_read_only_host_memory(table.storage().data()), op, ": the table is mapped from a file "
              "that GPUs may only read (PinnedEmbedding.open / speedtorch.data.open_npy with mode 'r', or 'r+' "
              "where Linux refuses writable GPU pins of shared file pages: anything but tmpfs); write it with CPU "
              "tensors, or open it with mode 'c' (copy-on-write) and save() checkpoints, or load() it");
}

}  // namespace

at::Device gather_output_device(const at::Tensor& indices, std::optional<at::Device> device) {
  at::Device d = device.value_or(indices.device());
  // Without a usable GPU there is no current device to ask for (the driver would fail first): the checks that
  // follow name the real problem.
  if (d.is_cuda() && !d.has_index()) {
    if (indices.is_cuda()) {
      d = indices.device();
    } else if (cuda_device_available()) {
      d = c10::impl::getDeviceGuardImpl(at::kCUDA)->getDevice();
    }
  }
  return d;
}

std::vector<int64_t> gathered_shape(const at::Tensor& indices, int64_t dim) {
  std::vector<int64_t> shape(indices.sizes().begin(), indices.sizes().end());
  shape.push_back(dim);
  return shape;
}

std::vector<c10::SymInt> gathered_sym_shape(const at::Tensor& indices, const at::Tensor& table) {
  std::vector<c10::SymInt> shape(indices.sym_sizes().begin(), indices.sym_sizes().end());
  shape.push_back(table.sym_size(1));
  return shape;
}

void check_gather_arguments(const at::Tensor& table, const at::Tensor& indices, const char* op) {
  check_table(table, op, /*written=*/false);
  check_indices(indices, op);
}

void check_scatter_arguments(const at::Tensor& table, const at::Tensor& indices, const at::Tensor& src,
                             const char* op) {
  check_table(table, op, /*written=*/true);
  check_indices(indices, op);
  const auto expected = gathered_sym_shape(indices, table);
  TORCH_CHECK(src.sym_sizes() == c10::SymIntArrayRef(expected), op, ": src must have shape indices.shape + (dim,) = ",
              c10::SymIntArrayRef(expected), ", got ", src.sym_sizes());
  TORCH_CHECK(src.scalar_type() == table.scalar_type(), op, ": src dtype ", src.scalar_type(),
              " does not match table dtype ", table.scalar_type(), "; convert src with .to(table.dtype)");
}

at::Tensor gather_table_rows(const at::Tensor& table, const at::Tensor& indices, std::optional<at::Device> device,
                             const char* op) {
  check_gather_arguments(table, indices, op);
  const at::Device out_device = gather_output_device(indices, device);
  const auto shape = gathered_shape(indices, table.size(1));
  const at::Tensor flat = indices.reshape({-1}).contiguous();

  // A pageable host table reaches a GPU through CPU threads and staging (transfer/row_transfer_cuda.h).
  TORCH_CHECK(table.is_cpu() || table.is_cuda(), op, ": table on ", table.device(), " is not supported");
  TORCH_CHECK(out_device.is_cpu() || out_device.is_cuda(), op, ": device ", out_device, " is not supported");
  if (indices.is_cuda() && table.is_cuda()) {
    TORCH_CHECK(indices.device() == table.device(), op, ": indices are on ", indices.device(),
                " but the table is on ", table.device(), "; put them on the same GPU");
  }

  // A GPU table gathers on its own device; the rows then move where they were asked for.
  const at::Device work_device = table.is_cuda() ? table.device() : out_device;
  // A large CPU output in huge pages: first touching it is otherwise most of a big gather's time.
  at::Tensor out = work_device.is_cpu() ? empty_cpu_output(shape, table.scalar_type())
                                        : at::empty(shape, table.options().device(work_device));
  at::Tensor out_rows = out.view({flat.numel(), table.size(1)});
  gather_rows(table, flat, out_rows, op);
  return work_device == out_device ? out : out.to(out_device);
}

void scatter_table_rows(const at::Tensor& table, const at::Tensor& indices, const at::Tensor& src, const char* op) {
  check_scatter_arguments(table, indices, src, op);
  TORCH_CHECK(table.is_cpu() || table.is_cuda(), op, ": table on ", table.device(), " is not supported");
  TORCH_CHECK(src.is_cpu() || src.is_cuda(), op, ": src on ", src.device(), " is not supported");
  if (indices.is_cuda() && table.is_cuda()) {
    TORCH_CHECK(indices.device() == table.device(), op, ": indices are on ", indices.device(),
                " but the table is on ", table.device(), "; put them on the same GPU");
  }
  if (table.is_cpu() && src.is_cuda()) check_host_table_reachable(table, src.device(), op);
  // A GPU writes a host table only when src is on one; CUDA indices with CPU rows are a CPU write (row_transfer.h).
  if (table.is_cpu() && src.is_cuda()) check_host_table_writable_by_gpu(table, op);
  // Rows are written while src and the indices are still read (by threads or GPU blocks in no set order).
  check_no_overlap(table, "the table", src, "src", op);
  check_no_overlap(table, "the table", indices, "indices", op);
  const at::Tensor flat = indices.reshape({-1}).contiguous();
  // A GPU table takes its rows on its own device.
  const at::Tensor rows =
      (table.is_cuda() ? src.to(table.device()) : src).reshape({flat.numel(), table.size(1)}).contiguous();
  scatter_rows(table, flat, rows, op);
}

}  // namespace speedtorch
