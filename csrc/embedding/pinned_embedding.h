// PinnedEmbedding: an embedding table of num_rows x dim kept in exact-size pinned host memory, exchanged with GPUs
// row by row. A torch::CustomClass (registered in ops/pinned_embedding_class.cpp), so Python, TorchScript and C++
// share one object; every row operation goes through the dispatcher's speedtorch::gather / scatter_.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <torch/custom_class.h>

#include <cstdint>
#include <optional>

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
  // Host bytes owned (table; optimizer state joins it later).
  int64_t nbytes() const;
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
  template <typename Fill>
  void fill_by_chunks(std::optional<int64_t> seed, Fill&& fill);

  at::Tensor table_;
};

}  // namespace speedtorch
