// The speedtorch operator library: the schemas of the row operators, which have per-backend kernels (registered in
// ops/register_*.cpp). Operators with one implementation are defined beside it: settings and diagnostics in
// ops/library_settings.cpp, the library counters in ops/metrics_ops.cpp, .npy and table files in ops/npy_ops.cpp;
// the PinnedEmbedding class in ops/pinned_embedding_class.cpp.
//
// Mutation is annotated ((a!)) so functionalization, torch.compile and TorchScript see what each op writes.
#include <torch/library.h>

TORCH_LIBRARY(speedtorch, m) {
  // Rows of `table` (2-D) for `indices` (int32/int64, any shape): shape indices.shape + (table.size(1),), on
  // `device` if given, else on the indices' device. A pinned host table with rows going to a GPU is read by the
  // transfer engine (UVA kernel + staged copies).
  m.def("gather(Tensor table, Tensor indices, Device? device=None) -> Tensor");
  // table[indices] = src, in place; duplicate indices: the last occurrence wins. Returns table. Composite: it calls
  // scatter_rows_, because functionalization (torch.compile, torch.export) cannot handle a custom op whose output
  // aliases an input, while it handles an in-place op that returns nothing.
  m.def("scatter_(Tensor(a!) table, Tensor indices, Tensor src) -> Tensor(a!)");
  m.def("scatter_rows_(Tensor(a!) table, Tensor indices, Tensor src) -> ()");
  // One fused optimizer step on the rows `indices` name: their gradients `grad` (indices.shape + (dim,)) are
  // summed per distinct row, then weights and state rows are updated in place (csrc/optim). `step` is the
  // table-wide step count after this step, used for bias correction unless options["per_row_step"] == 1.
  // sorted_unique=True: the caller's indices are strictly increasing (torch.unique's output), so the summing pass
  // is skipped; checked, and refused with an error before any update when they are not.
  // The checks gather's kernels and its Meta kernel run on its arguments (they need no data), for gather's Python
  // fake kernel (python/speedtorch/_fake.py), which must also say where the rows land: one set of checks.
  m.def("check_gather_arguments(Tensor table, Tensor indices) -> ()");
  m.def("row_optimizer_step_(Tensor(a!) weights, Tensor(b!) state, Tensor indices, Tensor grad, str optimizer, "
        "Dict(str, float) options, int step, bool sorted_unique=False) -> ()");
  // Row ids of every position's hashed n-grams (csrc/core/ngram_hash_math.h, docs/engram.md): tokens (batch, seq)
  // int32/int64, multipliers (heads, max_order) int64, bucket_sizes (max_order - 1, heads) int64, document_starts
  // (batch, seq) bool; returns (batch, seq, (max_order - 1) * heads) int64 on the tokens' device.
  m.def("ngram_hash(Tensor tokens, Tensor multipliers, Tensor bucket_sizes, int pad_id, "
        "Tensor? document_starts=None) -> Tensor");
  // Rows of a bf16 / row-wise int8 / block-scaled fp8 table (csrc/core/row_formats.h) dequantized to bfloat16
  // inside the gather: shape indices.shape + (dim,), on `device` if given, else on the indices' device.
  m.def("gather_dequant(Tensor table, Tensor indices, str format, int dim, Device? device=None) -> Tensor");
  // gather_dequant's argument checks, for its Python fake kernel (as check_gather_arguments for gather).
  m.def("check_gather_dequant_arguments(Tensor table, Tensor indices, str format, int dim) -> ()");
}
