// CPU kernels of the row operators. Also serves a pinned host table with CPU indices whose rows go to a GPU
// (device='cuda'): the dispatcher picks CPU from the tensor arguments, the kernel routes to the transfer engine.
#include <torch/library.h>

#include "row_ops_kernel.h"
#include "gather_dequant_op.h"
#include "ngram_hash_op.h"
#include "row_optimizer_op.h"

TORCH_LIBRARY_IMPL(speedtorch, CPU, m) {
  m.impl("gather", &speedtorch::ops::gather_kernel);
  m.impl("scatter_rows_", &speedtorch::ops::scatter_kernel);
  m.impl("row_optimizer_step_", &speedtorch::ops::row_optimizer_step_kernel);
  m.impl("ngram_hash", &speedtorch::ops::ngram_hash_kernel);
  m.impl("gather_dequant", &speedtorch::ops::gather_dequant_kernel);
}
