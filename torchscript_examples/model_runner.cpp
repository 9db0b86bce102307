// The scripted-model ModelRunner of the recommender server, and open_model, which picks the runner for a file
// (model_runner.h). The AOTInductor package's runner is in aoti_runner.cpp.
#include "model_runner.h"

#include <torch/cuda.h>
#include <torch/version.h>

#include "embedding/pinned_embedding.h"
#include "host_answers.h"

namespace speedtorch::serving {
namespace {

// The rows /health names: a serving copy's format, else the dtype of the PinnedEmbedding a model keeps its users in,
// else "unknown" (the server needs only the methods model_runner.h names, not a `users` attribute).
std::string scripted_table_format(const torch::jit::Module& model) {
  if (model.hasattr("table_format")) return model.attr("table_format").toStringRef();
  if (model.hasattr("users")) {
    const c10::IValue users = model.attr("users");
    if (users.isCustomClass() &&
        users.type().get() == c10::getCustomClassType<c10::intrusive_ptr<PinnedEmbedding>>().get()) {
      return dtype_format_name(users.toCustomClass<PinnedEmbedding>()->table().scalar_type());
    }
  }
  return "unknown";
}

class TorchScriptRunner final : public ModelRunner {
 public:
  TorchScriptRunner(torch::jit::Module model, torch::Device device) : model_(std::move(model)), device_(device) {
    model_.to(device_);  // a device that does not exist throws here
    num_users_ = model_.run_method("num_users").toInt();
    const torch::Tensor items = model_.attr("items").toTensor();
    num_items_ = items.size(0);
    dim_ = items.size(1);
    updatable_ = !model_.hasattr("table_format");  // a serving copy (quantized_recommender.py) is read-only
    table_format_ = scripted_table_format(model_);
  }

  int64_t num_users() const override { return num_users_; }
  int64_t num_items() const override { return num_items_; }
  int64_t dim() const override { return dim_; }

  torch::Tensor lookup(const torch::Tensor& user_ids) const override {
    return to_host_float(model_.run_method("lookup", user_ids.to(device_)).toTensor());
  }
  torch::Tensor score(const torch::Tensor& user_ids, const torch::Tensor& item_ids) const override {
    return to_host_float(model_.run_method("score", user_ids.to(device_), item_ids.to(device_)).toTensor());
  }
  std::pair<torch::Tensor, torch::Tensor> top_k(int64_t user, int64_t k) const override {
    const auto result = model_.run_method("top_k", user, k).toTuple();
    return {result->elements()[0].toTensor().to(torch::kCPU, torch::kLong).contiguous(),
            to_host_float(result->elements()[1].toTensor())};
  }
  void update_rows(const torch::Tensor& user_ids, const torch::Tensor& rows) override {
    model_.run_method("update_rows", user_ids.to(device_), rows);
  }
  std::string table_format() const override { return table_format_; }
  bool updatable() const override { return updatable_; }

 private:
  mutable torch::jit::Module model_;  // its methods do not change the module's structure
  torch::Device device_;
  int64_t num_users_ = 0;
  int64_t num_items_ = 0;
  int64_t dim_ = 0;
  std::string table_format_;
  bool updatable_ = true;
};

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

std::string dtype_format_name(c10::ScalarType dtype) {
  switch (dtype) {
    case torch::kFloat: return "float32";
    case torch::kHalf: return "float16";
    case torch::kBFloat16: return "bfloat16";
    default: return c10::toString(dtype);
  }
}

std::unique_ptr<ModelRunner> make_torchscript_runner(torch::jit::Module model, torch::Device device) {
  return std::make_unique<TorchScriptRunner>(std::move(model), device);
}

void check_device_present(torch::Device device) {
  const auto gpus = static_cast<int64_t>(torch::cuda::device_count());
  TORCH_CHECK(!device.is_cuda() || (device.has_index() ? device.index() : 0) < gpus, "--device ", device.str(),
              ", but this machine has ", gpus, " CUDA GPU(s) that this torch can use: run with --device cpu");
}

std::unique_ptr<ModelRunner> open_model(const std::string& model_path, const std::string& table_path,
                                        torch::Device device, size_t concurrent_runs) {
  if (ends_with(model_path, ".pt2")) {
    TORCH_CHECK(!table_path.empty(), "speedtorch_server: ", model_path,
                " is an AOTInductor package: give the user table's files with --table PATH");
#if SPEEDTORCH_SERVING_AOTI
    return make_aoti_runner(model_path, table_path, "c", device, concurrent_runs);
#else
    TORCH_CHECK(false, "speedtorch_server: ", model_path, " is an AOTInductor package, but this server was built "
                "against PyTorch ", TORCH_VERSION, ", whose package loader lacks what it needs (PyTorch >= 2.10); "
                "serve the scripted model (.pt) or rebuild against a newer torch");
#endif
  }
  TORCH_CHECK(table_path.empty(), "speedtorch_server: --table is for AOTInductor packages (.pt2); the scripted "
              "model ", model_path, " holds its own table");
  check_device_present(device);
  return make_torchscript_runner(torch::jit::load(model_path), device);
}

}  // namespace speedtorch::serving
