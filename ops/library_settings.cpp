// Operators without tensor arguments: exact-size pinned allocation, transfer-engine settings, deferred index
// checks, and what the library was built with.
#include <torch/library.h>

#include <string>
#include <type_traits>
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

// Finds the option `name` in the one table (transfer_policy.h) and calls visit(field of `c`); false if unknown.
template <typename Visit>
bool visit_option(TransferConfig& c, const std::string& name, Visit&& visit) {
  bool known = false;
  for_each_transfer_option([&](const char* option, const char*, auto field) {
    if (!known && name == option) {
      visit(c.*field);
      known = true;
    }
  });
  return known;
}

std::vector<std::string> transfer_option_names() {
  std::vector<std::string> names;
  for_each_transfer_option([&](const char* option, const char*, auto) { names.emplace_back(option); });
  return names;
}

std::string known_option_names() {
  std::string text;
  for (const std::string& name : transfer_option_names()) text += (text.empty() ? "" : ", ") + name;
  return text;
}

void set_transfer_option(std::string name, double value) {
  TransferConfig c = transfer_config();
  const bool known = visit_option(c, name, [&](auto& field) {
    field = static_cast<std::remove_reference_t<decltype(field)>>(value);
  });
  TORCH_CHECK(known, "speedtorch.set_transfer_config: unknown option '", name, "'; known options: ",
              known_option_names());
  set_transfer_config(c);
}

double get_transfer_option(std::string name) {
  TransferConfig c = transfer_config();
  double out = 0;
  const bool known = visit_option(c, name, [&](auto& field) { out = static_cast<double>(field); });
  TORCH_CHECK(known, "speedtorch.transfer_config: unknown option '", name, "'; known options: ",
              known_option_names());
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
  m.def("transfer_option_names() -> str[]", &speedtorch::ops::transfer_option_names);
  m.def("set_deferred_index_checks(bool deferred) -> ()", &speedtorch::ops::set_deferred_index_checks_op);
  m.def("check_index_errors() -> ()", &speedtorch::ops::check_index_errors_op);
  m.def("build_info() -> str", &speedtorch::ops::build_info);
}
