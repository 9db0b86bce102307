// Operators without tensor arguments: exact-size pinned allocation, transfer-engine settings, deferred index
// checks, and what the library was built with.
#include <torch/library.h>

#include <string>

#include "memory/pinned_host_buffer.h"
#include "transfer/transfer_policy.h"
#ifdef SPEEDTORCH_WITH_CUDA
#include <cuda_runtime_api.h>

#include "cuda/device_index_error.h"
#endif

namespace speedtorch::ops {
namespace {

at::Tensor pinned_empty_op(at::IntArrayRef size, c10::ScalarType dtype) { return pinned_empty(size, dtype); }

// One table of names keeps the setter and the getter in step.
template <typename Visit>
bool visit_option(TransferConfig& c, const std::string& name, Visit&& visit) {
  if (name == "uva_fraction") return visit(c.uva_fraction), true;
  if (name == "uva_reach_bytes") return visit(c.uva_reach_bytes), true;
  if (name == "small_transfer_bytes") return visit(c.small_transfer_bytes), true;
  if (name == "uva_row_bytes") return visit(c.uva_row_bytes), true;
  if (name == "staging_chunk_bytes") return visit(c.staging_chunk_bytes), true;
  if (name == "sort_uva_indices") return visit(c.sort_uva_indices), true;
  if (name == "uva_blocks_per_sm") return visit(c.uva_blocks_per_sm), true;
  if (name == "optimizer_vec4") return visit(c.optimizer_vec4), true;
  if (name == "uva_spread_gbps") return visit(c.uva_spread_gbps), true;
  if (name == "staged_gbps_per_thread") return visit(c.staged_gbps_per_thread), true;
  if (name == "staged_max_gbps") return visit(c.staged_max_gbps), true;
  return false;
}

constexpr const char* kOptionNames =
    "uva_fraction, uva_reach_bytes, small_transfer_bytes, uva_row_bytes, staging_chunk_bytes, sort_uva_indices, "
    "uva_blocks_per_sm, optimizer_vec4, uva_spread_gbps, "
    "staged_gbps_per_thread, staged_max_gbps";

void set_transfer_option(std::string name, double value) {
  TransferConfig c = transfer_config();
  const bool known = visit_option(c, name, [&](auto& field) {
    field = static_cast<std::remove_reference_t<decltype(field)>>(value);
  });
  TORCH_CHECK(known, "speedtorch.set_transfer_config: unknown option '", name, "'; known options: ", kOptionNames);
  set_transfer_config(c);
}

double get_transfer_option(std::string name) {
  TransferConfig c = transfer_config();
  double out = 0;
  const bool known = visit_option(c, name, [&](auto& field) { out = static_cast<double>(field); });
  TORCH_CHECK(known, "speedtorch.transfer_config: unknown option '", name, "'; known options: ", kOptionNames);
  return out;
}

void set_deferred_index_checks_op(bool deferred) {
#ifdef SPEEDTORCH_WITH_CUDA
  set_deferred_index_checks(deferred);
#else
  (void)deferred;  // CPU builds check every index on the host before use: nothing is ever deferred
#endif
}

void check_index_errors_op() {
#ifdef SPEEDTORCH_WITH_CUDA
  if (cuda_device_available()) check_deferred_index_errors();
#endif
}

std::string build_info() {
  std::string info = "speedtorch ops; cuda=";
#ifdef SPEEDTORCH_WITH_CUDA
  info += std::to_string(CUDART_VERSION / 1000) + "." + std::to_string(CUDART_VERSION % 1000 / 10);
  info += "; archs=" SPEEDTORCH_CUDA_ARCHS;
#else
  info += "none";
#endif
  return info;
}

}  // namespace
}  // namespace speedtorch::ops

TORCH_LIBRARY_FRAGMENT(speedtorch, m) {
  m.def("pinned_empty(int[] size, ScalarType dtype=float) -> Tensor", &speedtorch::ops::pinned_empty_op);
  m.def("set_transfer_option(str name, float value) -> ()", &speedtorch::ops::set_transfer_option);
  m.def("get_transfer_option(str name) -> float", &speedtorch::ops::get_transfer_option);
  m.def("set_deferred_index_checks(bool deferred) -> ()", &speedtorch::ops::set_deferred_index_checks_op);
  m.def("check_index_errors() -> ()", &speedtorch::ops::check_index_errors_op);
  m.def("build_info() -> str", &speedtorch::ops::build_info);
}
