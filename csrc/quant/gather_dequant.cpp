// speedtorch::gather_dequant on tensors (see gather_dequant.h): checks, the CPU route, routing.
#include "quant/gather_dequant.h"

#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include "cpu/gather_dequant_cpu.h"
#include "cpu/index_range_check.h"
#include "cpu/table_views.h"
#include "memory/pinned_host_buffer.h"
#include "transfer/checked_row_transfer.h"
#include "memory/host_access_tracker.h"

namespace speedtorch {
namespace {

// Rows bigger than this are refused: the GPU kernel stages quantized rows in shared memory
// (cuda/gather_dequant_kernel.h); the CPU refuses them too so that a table serves on either.
constexpr int64_t kMaxQuantizedRowBytes = 6144;

void gather_dequant_cpu_route(const at::Tensor& table, const at::Tensor& flat, RowFormat format, int64_t dim,
                              at::Tensor& out, const char* op) {
  const at::Tensor idx = flat.cpu().contiguous();
  const HostRows rows = host_rows(table);
  check_index_tensor(idx, rows.num_rows, op);
  wait_for_uva_conflicts(table.storage().data(), UvaAccess::kRead);
  with_index_type(idx, [&](const auto* p) {
    gather_dequant_cpu(rows, format, dim, p, idx.numel(), out.data_ptr<c10::BFloat16>());
  });
}

}  // namespace

RowFormat parse_row_format(const std::string& name, const char* op) {
  if (name == "bf16") return RowFormat::kBFloat16;
  if (name == "int8_rowwise") return RowFormat::kInt8Rowwise;
  if (name == "fp8_e4m3_ue8m0") return RowFormat::kFp8E4m3Ue8m0;
  TORCH_CHECK_VALUE(false, op, ": unknown row format '", name, "'; known: bf16, int8_rowwise, fp8_e4m3_ue8m0");
}

RowFormat check_gather_dequant_arguments(const at::Tensor& table, const at::Tensor& indices,
                                         const std::string& format_name, int64_t dim, const char* op) {
  const RowFormat format = parse_row_format(format_name, op);
  // Sizes are read as SymInts: this is also the Meta kernel's check (and the Python fake's), where they may be
  // symbols.
  TORCH_CHECK(table.layout() == at::kStrided && table.dim() == 2, op, ": table must be a dense 2-D tensor (num_rows, "
              "row bytes), got ", table.dim(), "-D");
  TORCH_CHECK(table.sym_size(1) <= 1 || table.sym_stride(1) == 1, op, ": table rows must be contiguous (stride(1) == "
              "1), got strides ", table.sym_strides());
  TORCH_CHECK(table.sym_stride(0) >= 0, op, ": table must not have negative strides, got ", table.sym_strides());
  TORCH_CHECK(indices.scalar_type() == at::kLong || indices.scalar_type() == at::kInt, op,
              ": indices must be int64 or int32, got ", indices.scalar_type());
  TORCH_CHECK_VALUE(dim >= 1, op, ": dim must be >= 1, got ", dim);
  const int64_t row_bytes = format_row_bytes(format, dim);
  if (format == RowFormat::kBFloat16) {
    TORCH_CHECK(table.scalar_type() == at::kBFloat16 || table.scalar_type() == at::kByte, op,
                ": a bf16 table must be bfloat16 (num_rows, dim) or its uint8 bytes, got ", table.scalar_type());
  } else {
    TORCH_CHECK(table.scalar_type() == at::kByte, op, ": a ", format_name, " table must be uint8 (num_rows, row "
                "bytes), got ", table.scalar_type(), "; speedtorch.serving.quantized.quantize_rows writes one");
    TORCH_CHECK_VALUE(format != RowFormat::kFp8E4m3Ue8m0 || dim % kFp8BlockSize == 0, op, ": ", format_name,
                      " rows have one scale per ", kFp8BlockSize, " elements, so dim must be a multiple of ",
                      kFp8BlockSize, ", got ", dim);
    TORCH_CHECK_VALUE(row_bytes <= kMaxQuantizedRowBytes, op, ": a ", format_name, " row of dim ", dim, " takes ",
                      row_bytes, " bytes; at most ", kMaxQuantizedRowBytes, " are supported");
  }
  const c10::SymInt width = table.sym_size(1) * static_cast<int64_t>(table.element_size());
  TORCH_CHECK_VALUE(width >= row_bytes, op, ": a ", format_name, " row of dim ", dim, " takes ", row_bytes,
                    " bytes but the table's rows have ", width, "; pass the dim the table was written with");
  return format;
}

at::Tensor gather_dequant(const at::Tensor& table, const at::Tensor& indices, const std::string& format_name,
                          int64_t dim, std::optional<at::Device> device, const char* op) {
  const RowFormat format = check_gather_dequant_arguments(table, indices, format_name, dim, op);
  const at::Device out_device = gather_output_device(indices, device);
  TORCH_CHECK(table.is_cpu() || table.is_cuda(), op, ": table on ", table.device(), " is not supported");
  TORCH_CHECK(out_device.is_cpu() || out_device.is_cuda(), op, ": device ", out_device, " is not supported");
  TORCH_CHECK(!table.is_cuda() || out_device == table.device(), op, ": a table on ", table.device(),
              " gathers to its own GPU, not ", out_device);
  TORCH_CHECK(!(indices.is_cuda() && table.is_cuda()) || indices.device() == table.device(), op, ": indices are on ",
              indices.device(), " but the table is on ", table.device());
  std::vector<int64_t> shape(indices.sizes().begin(), indices.sizes().end());
  shape.push_back(dim);
  at::Tensor out = at::empty(shape, at::TensorOptions().dtype(at::kBFloat16).device(out_device));
  const at::Tensor flat = indices.reshape({-1}).contiguous();
  if (flat.numel() == 0) return out;
  if (out_device.is_cpu()) {
    TORCH_CHECK(table.is_cpu(), op, ": rows of a table on ", table.device(), " go to its GPU");
    gather_dequant_cpu_route(table, flat, format, dim, out, op);
    return out;
  }
#ifdef SPEEDTORCH_WITH_CUDA
  gather_dequant_to_cuda(table, flat, format, dim, out, op);
  return out;
#else
  TORCH_CHECK(false, op, ": this speedtorch library was built without CUDA");
#endif
}

}  // namespace speedtorch
