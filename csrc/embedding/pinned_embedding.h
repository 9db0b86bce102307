// PinnedEmbedding: an embedding table of num_rows x dim kept in exact-size pinned host memory, exchanged with GPUs
// row by row. A torch::CustomClass (registered in ops/pinned_embedding_class.cpp), so Python, TorchScript and C++
// share one object; every row operation goes through the dispatcher's speedtorch::gather / scatter_.
#pragma once

#include <ATen/core/Dict.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <torch/custom_class.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "memory/pinned_host_buffer.h"

namespace speedtorch {

class PinnedEmbedding : public torch::CustomClassHolder {
 public:
  PinnedEmbedding(int64_t num_rows, int64_t dim, c10::ScalarType dtype);

  // Rows for `indices` (any shape, int32/int64, any device), shaped indices.shape + (dim,), on `device` if given,
  // else on the indices' device.
  at::Tensor gather(const at::Tensor& indices, std::optional<at::Device> device) const;
  // Writes src (indices.shape + (dim,)) into those rows; duplicate indices: the last occurrence wins. Returns the
  // table.
  at::Tensor scatter_(const at::Tensor& indices, const at::Tensor& src);

  int64_t num_rows() const { return table_.size(0); }
  int64_t dim() const { return table_.size(1); }
  // Host bytes owned: the table and its optimizer state.
  int64_t nbytes() const;

  // Configures the fused optimizer (names and options as optim/optimizer_config.h: torch.optim's, e.g. "adam",
  // {"lr": 1e-3}). Allocates its state, zeroed, exact-size in pinned memory: beside each row (one host page walk
  // per row for weights and state) unless state_beside_rows is false (a table of its own). The weights move into
  // the new layout (for a moment both layouts exist). Configuring again resets the state and the step count.
  void set_optimizer(const std::string& kind, const c10::Dict<std::string, double>& options, bool state_beside_rows);
  // One optimizer step on the rows `indices` name: grad (indices.shape + (dim,), any device) is summed per distinct
  // row, then rows and state are updated in place (speedtorch::row_optimizer_step_). Needs set_optimizer first.
  void apply_gradients(const at::Tensor& indices, const at::Tensor& grad);
  // The optimizer's name ("" when none), options, state (num_rows x state width float32; undefined when none), and
  // the table-wide step count.
  std::string optimizer() const { return optimizer_; }
  c10::Dict<std::string, double> optimizer_options() const { return options_; }
  at::Tensor state() const { return state_; }
  int64_t step_count() const { return step_; }
  bool is_pinned() const;
  // The host table itself (shares memory). Host-side reads and writes of it are not ordered after GPU work that
  // is still running: synchronise the stream first.
  at::Tensor table() const { return table_; }

  // In-place initialisers; none needs a table-sized temporary. With a seed, the values depend only on the seed
  // (not on the thread count); without one, they come from torch's default CPU generator.
  void zero_();
  void uniform_(double low, double high, std::optional<int64_t> seed);
  void normal_(double mean, double std, std::optional<int64_t> seed);
  // Copies a (num_rows, dim) tensor of any device and floating dtype into the table.
  void copy_(const at::Tensor& src);

 private:
  // Copies the rows into `destination` (a new layout), releasing the old table's memory as it goes when possible.
  void move_rows(at::Tensor& destination);

  template <typename Fill>
  void fill_by_chunks(std::optional<int64_t> seed, Fill&& fill);

  std::shared_ptr<PinnedHostBuffer> table_buffer_;
  std::shared_ptr<PinnedHostBuffer> state_buffer_;  // null when the state sits in table_buffer_ or there is none
  at::Tensor table_;
  at::Tensor state_;
  std::string optimizer_;
  c10::Dict<std::string, double> options_;
  int64_t step_ = 0;
};

}  // namespace speedtorch
