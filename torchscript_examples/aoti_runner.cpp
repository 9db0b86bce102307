// The AOTInductor package's ModelRunner (model_runner.h): the compiled program of recommender_aoti.py run over a
// user table opened from its files: a PinnedEmbedding's, or a serving copy's (quantized_recommender.py), mapped
// read-only. Built with PyTorch >= 2.10, whose AOTIModelPackageLoader reads a package's metadata before loading it
// and runs several model instances at once (torchscript_examples/CMakeLists.txt).
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>

#include <algorithm>
#include <unordered_map>
#include <vector>

#include "embedding/pinned_embedding.h"
#include "host_answers.h"
#include "model_runner.h"

namespace speedtorch::serving {
namespace {

// What recommender_aoti.py records of the table in the package's metadata.
int64_t metadata_int(const std::unordered_map<std::string, std::string>& metadata, const std::string& key,
                     const std::string& package_path) {
  const auto it = metadata.find(key);
  TORCH_CHECK(it != metadata.end(), "speedtorch_server: the package ", package_path, " has no '", key,
              "' in its metadata: it was not written by torchscript_examples/recommender_aoti.py");
  return std::stoll(it->second);
}

std::string metadata_text(const std::unordered_map<std::string, std::string>& metadata, const std::string& key,
                          const std::string& package_path) {
  const auto it = metadata.find(key);
  TORCH_CHECK(it != metadata.end(), "speedtorch_server: the package ", package_path, " has no '", key,
              "' in its metadata: it was not written by torchscript_examples/recommender_aoti.py");
  return it->second;
}

// A speedtorch operator that returns one value, called through the dispatcher (as a scripted model calls it).
c10::IValue call_op(const char* name, torch::jit::Stack stack) {
  const auto op = c10::Dispatcher::singleton().findSchemaOrThrow(name, "");
  op.callBoxed(&stack);
  return stack.at(0);
}

std::string python_dtype_name(c10::ScalarType dtype) {
  switch (dtype) {
    case torch::kFloat: return "torch.float32";
    case torch::kHalf: return "torch.float16";
    case torch::kBFloat16: return "torch.bfloat16";
    case torch::kByte: return "torch.uint8";  // a quantized serving copy's rows
    default: return std::string("torch.") + c10::toString(dtype);
  }
}

class AotiRunner final : public ModelRunner {
 public:
  AotiRunner(const std::string& package_path, const std::string& table_path, const std::string& table_mode,
             torch::Device device, size_t concurrent_runs)
      : device_(device) {
    TORCH_CHECK(concurrent_runs > 0, "speedtorch_server: concurrent_runs must be > 0");
    // Checked before loading: the loader would otherwise fail inside with a message about the device's runtime.
    const auto metadata = torch::inductor::AOTIModelPackageLoader::load_metadata_from_package(package_path, "model");
    const auto compiled_for = metadata.find("AOTI_DEVICE_KEY");
    TORCH_CHECK(compiled_for != metadata.end() && compiled_for->second == c10::DeviceTypeName(device.type(), true),
                "speedtorch_server: the package ", package_path, " is compiled for ",
                compiled_for == metadata.end() ? std::string("an unknown device") : compiled_for->second,
                ", not for --device ", device.str(), " (recompile it with recommender_aoti.py --device ",
                c10::DeviceTypeName(device.type(), true), ")");
    check_device_present(device);
    num_users_ = metadata_int(metadata, "speedtorch.num_users", package_path);
    dim_ = metadata_int(metadata, "speedtorch.dim", package_path);
    num_items_ = metadata_int(metadata, "speedtorch.num_items", package_path);
    if (const auto format = metadata.find("speedtorch.table_format"); format != metadata.end()) {
      open_serving_copy(format->second, table_path, package_path, metadata);
    } else {
      table_ = PinnedEmbedding::open(table_path, table_mode);
      TORCH_CHECK(table_->num_rows() == num_users_ && table_->dim() == dim_, "speedtorch_server: the table ",
                  table_path, " is ", table_->num_rows(), " x ", table_->dim(), " but the package ", package_path,
                  " was compiled for a table of ", num_users_, " x ", dim_);
      table_format_ = dtype_format_name(table_->table().scalar_type());
    }
    const std::string dtype = python_dtype_name(table_tensor().scalar_type());
    const auto expected_dtype = metadata.find("speedtorch.table_dtype");
    TORCH_CHECK(expected_dtype != metadata.end() && expected_dtype->second == dtype, "speedtorch_server: the table ",
                table_path, " holds ", dtype, " but the package ", package_path, " was compiled for ",
                expected_dtype == metadata.end() ? std::string("an unknown dtype") : expected_dtype->second);
    // Several model instances: that many requests run the program at once (more wait for a free one).
    loader_ = std::make_unique<torch::inductor::AOTIModelPackageLoader>(
        package_path, "model", /*run_single_threaded=*/false, concurrent_runs,
        device.is_cuda() && device.has_index() ? device.index() : c10::DeviceIndex(-1));
  }

  int64_t num_users() const override { return num_users_; }
  int64_t num_items() const override { return num_items_; }
  int64_t dim() const override { return dim_; }

  torch::Tensor lookup(const torch::Tensor& user_ids) const override {
    return to_host_float(run(user_ids, torch::zeros_like(user_ids))[0]);  // any item will do: only rows are used
  }
  torch::Tensor score(const torch::Tensor& user_ids, const torch::Tensor& item_ids) const override {
    return to_host_float(run(user_ids, item_ids)[1]);
  }
  std::pair<torch::Tensor, torch::Tensor> top_k(int64_t user, int64_t k) const override {
    const auto ids = torch::TensorOptions().dtype(torch::kLong);
    const torch::Tensor scores =
        to_host_float(run(torch::full({num_items_}, user, ids), torch::arange(num_items_, ids))[1]);
    auto [values, indices] = torch::topk(scores, std::min(k, num_items_));
    return {indices.contiguous(), values.contiguous()};
  }
  void update_rows(const torch::Tensor& user_ids, const torch::Tensor& rows) override {
    TORCH_CHECK(table_, "speedtorch_server: the ", table_format_, " user table is a read-only serving copy");
    // On the host, as the reads have all finished (they return host tensors): no kernel is reading these rows.
    table_->scatter_(user_ids.cpu(), rows.to(torch::kCPU, table_->table().scalar_type()));
  }
  std::string table_format() const override { return table_format_; }
  bool updatable() const override { return static_cast<bool>(table_); }

 private:
  // A serving copy's file (quantized_recommender.py), mapped read-only as the scripted model maps it (page-locked
  // on a GPU host), checked against what the package records of it: its shape, dtype and content hash.
  void open_serving_copy(const std::string& format, const std::string& table_path, const std::string& package_path,
                         const std::unordered_map<std::string, std::string>& metadata) {
    table_format_ = format;
    rows_ = call_op("speedtorch::map_npy", {table_path, std::string("r"), true}).toTensor();
    const int64_t columns = metadata_int(metadata, "speedtorch.table_columns", package_path);
    TORCH_CHECK(rows_.dim() == 2 && rows_.size(0) == num_users_ && rows_.size(1) == columns, "speedtorch_server: "
                "the table ", table_path, " has shape ", rows_.sizes(), " but the package ", package_path,
                " was compiled for the ", format, " table of shape [", num_users_, ", ", columns, "]");
    const std::string expected = metadata_text(metadata, "speedtorch.table_hash", package_path);
    const std::string found = call_op("speedtorch::content_hash", {rows_}).toStringRef();
    TORCH_CHECK(found == expected, "speedtorch_server: the table ", table_path, " holds other rows than the ",
                format, " table the package ", package_path, " was compiled for (content hash ", found,
                ", expected ", expected, "): give the file quantized_recommender.py wrote with it");
  }

  // rows, scores of the compiled program (recommender_aoti.py's PairScorer).
  std::vector<torch::Tensor> run(const torch::Tensor& users, const torch::Tensor& items) const {
    return loader_->run({table_tensor(), users.to(device_), items.to(device_)});
  }
  torch::Tensor table_tensor() const { return table_ ? table_->table() : rows_; }

  torch::Device device_;
  c10::intrusive_ptr<PinnedEmbedding> table_;  // null for a read-only serving copy
  torch::Tensor rows_;                         // the serving copy's rows (when table_ is null)
  std::string table_format_;
  std::unique_ptr<torch::inductor::AOTIModelPackageLoader> loader_;  // run() is safe on many threads
  int64_t num_users_ = 0;
  int64_t num_items_ = 0;
  int64_t dim_ = 0;
};

}  // namespace

std::unique_ptr<ModelRunner> make_aoti_runner(const std::string& package_path, const std::string& table_path,
                                              const std::string& table_mode, torch::Device device,
                                              size_t concurrent_runs) {
  return std::make_unique<AotiRunner>(package_path, table_path, table_mode, device, concurrent_runs);
}

}  // namespace speedtorch::serving
