// Operators without tensor arguments: exact-size pinned allocation, transfer-engine settings, deferred index
// checks, and what the library was built with.
#include <torch/library.h>

#include <string>
#include <vector>

#include "memory/pinned_host_buffer.h"
#include "transfer/transfer_policy.h"
#ifdef SPEEDTORCH_WITH_CUDA
#include <cuda_runtime_api.h>

#include "cuda/device_index_error.h"
#endif

namespace speedtorch::ops {
namespace {

at::Tensor pinned_empty_op(at::IntArrayRef size, c10::ScalarType dtype) { return pinned_empty(size, dtype); }

void set_transfer_option_op(std::string name, double value) {
  TransferConfig c = process_transfer_config();
  set_transfer_option(c, name, value, "speedtorch.set_transfer_config");
  set_transfer_config(c);
}

double get_transfer_option_op(std::string name) {
  return get_transfer_option(process_transfer_config(), name, "speedtorch.transfer_config");
}

std::vector<std::string> transfer_option_names_op() { return transfer_option_names(); }

void set_deferred_index_checks_op(bool deferred) {
#ifdef SPEEDTORCH_WITH_CUDA
  set_deferred_index_checks(deferred);
#else
  (void)deferred;  // CPU builds check every index on the host before use: nothing is ever deferred
#endif
}

bool deferred_index_checks_op() {
#ifdef SPEEDTORCH_WITH_CUDA
  return deferred_index_checks();
#else
  return false;
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
  m.def("set_transfer_option(str name, float value) -> ()", &speedtorch::ops::set_transfer_option_op);
  m.def("get_transfer_option(str name) -> float", &speedtorch::ops::get_transfer_option_op);
  m.def("transfer_option_names() -> str[]", &speedtorch::ops::transfer_option_names_op);
  m.def("set_deferred_index_checks(bool deferred) -> ()", &speedtorch::ops::set_deferred_index_checks_op);
  m.def("deferred_index_checks() -> bool", &speedtorch::ops::deferred_index_checks_op);
  m.def("check_index_errors() -> ()", &speedtorch::ops::check_index_errors_op);
  m.def("build_info() -> str", &speedtorch::ops::build_info);
}
