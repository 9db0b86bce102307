// speedtorch::ngram_hash on tensors: argument checks with messages a user can act on, then the CPU loop
// (cpu/ngram_hash_cpu.h) or the CUDA kernel (cuda/ngram_hash_kernel.h). The hash itself is defined in
// core/ngram_hash_math.h. `op` names the caller in error messages.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <vector>

namespace speedtorch {

// Row ids (batch, seq, (max_order - 1) * heads) int64, on the tokens' device, for tokens (batch, seq) int32/int64,
// multipliers (heads, max_order) int64, bucket_sizes (max_order - 1, heads) int64 and document_starts (batch, seq)
// bool or none; every tensor on the tokens' device. Tokens must be >= 0, bucket sizes >= 1, pad_id >= 0 and
// seq >= max_order. CUDA inputs are checked with one reduction and a wait for the current stream, except under
// deferred index checks or CUDA graph capture, where the kernel flags bad values instead (cuda/device_index_error.h).
at::Tensor ngram_hash(const at::Tensor& tokens, const at::Tensor& multipliers, const at::Tensor& bucket_sizes,
                      int64_t pad_id, const std::optional<at::Tensor>& document_starts, const char* op);

// The checks that need no data (the Meta kernel's), and the output shape.
void check_ngram_hash_arguments(const at::Tensor& tokens, const at::Tensor& multipliers,
                                const at::Tensor& bucket_sizes, int64_t pad_id,
                                const std::optional<at::Tensor>& document_starts, const char* op);
// (batch, seq, (max_order - 1) * heads), with sizes that may be symbols (the Meta kernel).
std::vector<c10::SymInt> ngram_hash_shape(const at::Tensor& tokens, const at::Tensor& multipliers);

#ifdef SPEEDTORCH_WITH_CUDA
// The CUDA route (ngram_hash_cuda.cpp): arguments checked as above, `out` allocated.
void ngram_hash_cuda(const at::Tensor& tokens, const at::Tensor& multipliers, const at::Tensor& bucket_sizes,
                     int64_t pad_id, const at::Tensor& document_starts, at::Tensor& out, const char* op);
#endif

}  // namespace speedtorch
