// ModelRunner: what the recommender service (request_handler.h) runs a request on, whatever form the model takes:
// - a scripted model loaded with torch::jit::load (recommender_model.py; TorchScript is deprecated from torch 2.11),
// - an AOTInductor package loaded with torch::inductor::AOTIModelPackageLoader (recommender_aoti.py), with the user
//   table opened from its files (PinnedEmbedding::open, memory-mapped) and passed to the compiled program.
// Both give the same answers; docs/torchscript.md describes the migration from one to the other.
//
// Ids come in as host int64 tensors; answers go out as host tensors, complete when the call returns (so a caller's
// lock around a read covers the whole read, GPU kernels included). Reads may run on many threads at once; an update
// must run alone (the service orders them with its TableLock).
#pragma once

#include <torch/script.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

namespace speedtorch::serving {

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;

  virtual int64_t num_users() const = 0;
  virtual int64_t num_items() const = 0;
  virtual int64_t dim() const = 0;

  // The users' rows, (n, dim) float.
  virtual torch::Tensor lookup(const torch::Tensor& user_ids) const = 0;
  // One score per (users[i], items[i]) pair, (n,) float.
  virtual torch::Tensor score(const torch::Tensor& user_ids, const torch::Tensor& item_ids) const = 0;
  // The min(k, num_items) best items for `user` and their scores, best first.
  virtual std::pair<torch::Tensor, torch::Tensor> top_k(int64_t user, int64_t k) const = 0;
  // Writes rows (n, dim) float into the users' rows of the table; only when updatable().
  virtual void update_rows(const torch::Tensor& user_ids, const torch::Tensor& rows) = 0;

  // The user table's rows: "float32", "float16" or "bfloat16" for a PinnedEmbedding (updatable), or the format of a
  // read-only serving copy (quantized_recommender.py): "fp16", "bf16", "int8_rowwise" or "fp8_e4m3_ue8m0";
  // "unknown" for a scripted model that keeps its rows otherwise.
  virtual std::string table_format() const = 0;
  // Whether update_rows may be called: false for a serving copy (the service answers /update with 409).
  virtual bool updatable() const = 0;
};

// A table dtype as table_format() names it ("float32", "float16", "bfloat16", ...).
std::string dtype_format_name(c10::ScalarType dtype);

// A scripted recommender (its methods num_users, lookup, score, top_k, update_rows; its attribute items). The
// module is moved to `device`; its PinnedEmbedding stays in pinned host memory and the GPU reads it over UVA. A
// model with a `table_format` attribute serves a read-only copy in that format (quantized_recommender.py: its table
// is a plain attribute, mapped from its file, which moving the module leaves in host memory too).
std::unique_ptr<ModelRunner> make_torchscript_runner(torch::jit::Module model, torch::Device device);

#if SPEEDTORCH_SERVING_AOTI
// An AOTInductor package of recommender_aoti.py, compiled for `device`'s type, run on `device` with up to
// `concurrent_runs` calls at once, over the user table saved at `table_path`, opened with `table_mode` ("r", "r+"
// or "c": docs/persistence.md; "c" keeps updates in memory only, as the scripted model does). The package of a
// serving copy (its metadata names a speedtorch.table_format) takes the copy's file, mapped read-only whatever the
// mode, and refuses one whose content hash is not the one it was compiled with. Built with PyTorch >= 2.10 only
// (aoti_runner.cpp).
std::unique_ptr<ModelRunner> make_aoti_runner(const std::string& package_path, const std::string& table_path,
                                              const std::string& table_mode, torch::Device device,
                                              size_t concurrent_runs);
#endif

// Throws, saying what to do, when `device` is a GPU this machine does not have.
void check_device_present(torch::Device device);

// The runner for `model_path`: an AOTInductor package when it ends in .pt2 (then `table_path` is required; a server
// built against PyTorch < 2.10 refuses it, saying so), a scripted model otherwise.
std::unique_ptr<ModelRunner> open_model(const std::string& model_path, const std::string& table_path,
                                        torch::Device device, size_t concurrent_runs);

}  // namespace speedtorch::serving
