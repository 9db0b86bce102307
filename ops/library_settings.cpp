// Operators without tensor arguments: exact-size pinned allocation, transfer-engine settings, deferred index
// checks, and what the library was built with.
#include <c10/util/Exception.h>
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

// The value in force on the calling thread: the process's, or this thread's override (push_transfer_overrides).
double get_transfer_option_op(std::string name) {
  return get_transfer_option(transfer_config(), name, "speedtorch.transfer_config");
}

// Settings for the calling thread only until pop_transfer_overrides(id) on it (Python's
// speedtorch.transfer_config_override; TorchScript and C++ callers pair the two ops the same way).
int64_t push_transfer_overrides_op(std::vector<std::string> names, std::vector<double> values) {
  constexpr const char* kWho = "speedtorch.transfer_config_override";
  TORCH_CHECK(names.size() == values.size(), kWho, ": ", names.size(), " names but ", values.size(), " values");
  TransferOverrides overrides;
  for (size_t i = 0; i < names.size(); ++i) overrides[names[i]] = values[i];
  return push_thread_transfer_overrides(overrides, kWho);
}

void pop_transfer_overrides_op(int64_t id) {
  pop_thread_transfer_overrides(id, "speedtorch.transfer_config_override");
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

// The mode in force on the calling thread.
bool deferred_index_checks_op() {
#ifdef SPEEDTORCH_WITH_CUDA
  return deferred_index_checks();
#else
  return false;
#endif
}

// The mode for the calling thread only until pop_deferred_index_checks(id) on it (Python's
// speedtorch.deferred_index_checks block). CPU builds defer nothing: the id is 0 and its pop does nothing.
int64_t push_deferred_index_checks_op(bool deferred) {
#ifdef SPEEDTORCH_WITH_CUDA
  return push_thread_deferred_index_checks(deferred);
#else
  (void)deferred;
  return 0;
#endif
}

void pop_deferred_index_checks_op(int64_t id) {
#ifdef SPEEDTORCH_WITH_CUDA
  pop_thread_deferred_index_checks(id, "speedtorch.deferred_index_checks");
#else
  (void)id;
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

// The settings and the index-error record are state: their ops read or change it, so TorchScript must neither fold
// them into constants at compile time nor drop the ones whose result is unused (CONSERVATIVE: they have side
// effects). Only build_info and the names are fixed for the process.
TORCH_LIBRARY_FRAGMENT(speedtorch, m) {
  const auto stateful = [](const char* schema) {
    return torch::schema(schema, c10::AliasAnalysisKind::CONSERVATIVE);
  };
  m.def("pinned_empty(int[] size, ScalarType dtype=float) -> Tensor", &speedtorch::ops::pinned_empty_op);
  m.def(stateful("set_transfer_option(str name, float value) -> ()"), &speedtorch::ops::set_transfer_option_op);
  m.def(stateful("get_transfer_option(str name) -> float"), &speedtorch::ops::get_transfer_option_op);
  m.def("transfer_option_names() -> str[]", &speedtorch::ops::transfer_option_names_op);
  m.def(stateful("push_transfer_overrides(str[] names, float[] values) -> int"),
        &speedtorch::ops::push_transfer_overrides_op);
  m.def(stateful("pop_transfer_overrides(int id) -> ()"), &speedtorch::ops::pop_transfer_overrides_op);
  m.def(stateful("transfer_calibrations() -> (str[], float[], float[][], float[][], float[], float[][])"),
        &speedtorch::ops::transfer_calibrations_op);
  m.def(stateful("clear_transfer_calibrations() -> ()"), &speedtorch::ops::clear_transfer_calibrations_op);
  m.def(stateful("set_deferred_index_checks(bool deferred) -> ()"), &speedtorch::ops::set_deferred_index_checks_op);
  m.def(stateful("deferred_index_checks() -> bool"), &speedtorch::ops::deferred_index_checks_op);
  m.def(stateful("push_deferred_index_checks(bool deferred) -> int"),
        &speedtorch::ops::push_deferred_index_checks_op);
  m.def(stateful("pop_deferred_index_checks(int id) -> ()"), &speedtorch::ops::pop_deferred_index_checks_op);
  m.def(stateful("check_index_errors() -> ()"), &speedtorch::ops::check_index_errors_op);
  m.def("build_info() -> str", &speedtorch::ops::build_info);
}
