// Operators without tensor arguments: exact-size pinned allocation, transfer-engine settings, deferred index
// checks, and what the library was built with.
#include <torch/library.h>

#include <string>
#include <tuple>
#include <vector>

#include "memory/pinned_host_buffer.h"
#include "transfer/split_calibration.h"
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

// The measured splits: one line per kind of call ("name=value ..."), and per line the share in force, the shares
// tried and their best milliseconds, the share the measurement chose and the guard's window of recent calls
// (split_calibration.h; Python's speedtorch.transfer_calibrations() turns them into dicts).
std::tuple<std::vector<std::string>, std::vector<double>, std::vector<std::vector<double>>,
           std::vector<std::vector<double>>, std::vector<double>, std::vector<std::vector<double>>>
transfer_calibrations_op() {
  std::vector<std::string> keys;
  std::vector<double> chosen;
  std::vector<std::vector<double>> shares;
  std::vector<std::vector<double>> times;
  std::vector<double> calibrated;
  std::vector<std::vector<double>> recent;
  for (const SplitCalibration& c : split_calibrations()) {
    const SplitKey& k = c.key;
    keys.push_back("device=" + std::to_string(k.device) +
                   " direction=" + (k.direction == TransferDirection::kGather ? "gather" : "scatter") +
                   " host_indices=" + std::to_string(k.host_indices ? 1 : 0) +
                   " footprint_log2=" + std::to_string(k.footprint_log2) + " row_bytes=" + std::to_string(k.row_bytes) +
                   " rows_log2=" + std::to_string(k.count_log2) + " threads=" + std::to_string(k.threads) +
                   " uva_blocks_per_sm=" + std::to_string(k.uva_blocks_per_sm) +
                   " uva_rows_in_flight=" + std::to_string(k.uva_rows_in_flight) +
                   " max_sms=" + std::to_string(k.max_sms) +
                   " staging_chunk_bytes=" + std::to_string(k.staging_chunk_bytes));
    chosen.push_back(c.uva_share);
    shares.push_back(c.shares);
    times.push_back(c.milliseconds);
    calibrated.push_back(c.calibrated_share);
    recent.push_back(c.recent_ms);
  }
  return {keys, chosen, shares, times, calibrated, recent};
}

void clear_transfer_calibrations_op() { clear_split_calibrations(); }

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
  m.def("transfer_calibrations() -> (str[], float[], float[][], float[][], float[], float[][])",
        &speedtorch::ops::transfer_calibrations_op);
  m.def("clear_transfer_calibrations() -> ()", &speedtorch::ops::clear_transfer_calibrations_op);
  m.def("set_deferred_index_checks(bool deferred) -> ()", &speedtorch::ops::set_deferred_index_checks_op);
  m.def("deferred_index_checks() -> bool", &speedtorch::ops::deferred_index_checks_op);
  m.def("check_index_errors() -> ()", &speedtorch::ops::check_index_errors_op);
  m.def("build_info() -> str", &speedtorch::ops::build_info);
}
