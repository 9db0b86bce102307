// Meta kernels: the operators' argument checks (the CPU and CUDA kernels' own, sizes read as symbols) and output
// shapes, for meta tensors in C++ and Python and for FakeTensorMode (torch.compile, torch.export). Only the two
// gathers have Python fake kernels (python/speedtorch/_fake.py) that take precedence, because their rows may land
// on another device than their inputs, which a meta tensor cannot say; those run the same checks.
#include <torch/library.h>

#include "row_ops_kernel.h"
#include "gather_dequant_op.h"
#include "ngram_hash_op.h"
#include "row_optimizer_op.h"

TORCH_LIBRARY_IMPL(speedtorch, Meta, m) {
  m.impl("gather", &speedtorch::ops::gather_meta);
  m.impl("scatter_rows_", &speedtorch::ops::scatter_meta);
  m.impl("row_optimizer_step_", &speedtorch::ops::row_optimizer_step_meta);
  m.impl("ngram_hash", &speedtorch::ops::ngram_hash_meta);
  m.impl("gather_dequant", &speedtorch::ops::gather_dequant_meta);
}
