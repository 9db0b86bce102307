// CUDA kernels of the row operators: any call with a CUDA tensor argument (CUDA indices or src, or a table on a
// GPU) lands here and is routed by csrc/transfer/row_transfer.h.
#include <torch/library.h>

#include "row_ops_kernel.h"
#include "gather_dequant_op.h"
#include "ngram_hash_op.h"
#include "row_optimizer_op.h"

TORCH_LIBRARY_IMPL(speedtorch, CUDA, m) {
  m.impl("gather", &speedtorch::ops::gather_kernel);
  m.impl("scatter_rows_", &speedtorch::ops::scatter_kernel);
  m.impl("row_optimizer_step_", &speedtorch::ops::row_optimizer_step_kernel);
  m.impl("ngram_hash", &speedtorch::ops::ngram_hash_kernel);
  m.impl("gather_dequant", &speedtorch::ops::gather_dequant_kernel);
}
