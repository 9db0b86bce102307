// Meta kernels: shapes and dtypes only, for meta tensors in C++ and Python. Under torch.compile the Python fake
// kernels of python/speedtorch/_fake.py take precedence, because a fake gather must also say which device its
// output lands on, which a meta tensor cannot.
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
