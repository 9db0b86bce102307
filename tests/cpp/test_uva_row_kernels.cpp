// Tests for the GPU row kernels' launch settings and checks that the ops cannot reach (csrc/cuda): the fused
// optimizer kernel leaves rows outside the table alone and flags them, the index summary matches the host's, and
// every launch shape moves the same bytes. They need a GPU and skip without one (CPU builds compile nothing here).
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <vector>

#include "memory/pinned_host_buffer.h"

#ifdef SPEEDTORCH_WITH_CUDA
#include <c10/cuda/CUDAStream.h>

#include "cpu/row_optimizer_cpu.h"
#include "cuda/device_index_error.h"
#include "cuda/row_kernels.h"
#include "cuda/row_optimizer_kernel.h"
#include "optim/row_optimizer.h"
#include "transfer/device_access.h"
#endif

namespace speedtorch {
namespace {

#ifdef SPEEDTORCH_WITH_CUDA
bool cuda_ready() { return cuda_device_available() && at::hasCUDA(); }

// An id the op checked but the caller changed before the kernel ran (issue 22, item 5) is never written: the rows
// past the table stay as they were, the error is flagged, and the valid rows are updated as the CPU route does.
TEST(UvaRowKernels, OptimizerKernelLeavesRowsOutsideTheTableAlone) {
  if (!cuda_ready()) GTEST_SKIP() << "no CUDA device";
  const int64_t rows = 64, dim = 32;
  OptimizerHyper hyper;
  hyper.kind = OptimizerKind::kAdam;
  const int64_t state_floats = kStateHeaderFloats + state_slots(hyper) * dim;
  const at::Tensor ids = at::tensor(std::vector<int64_t>{3, rows + 2, 9});
  const at::Tensor grads = at::randn({3, dim});
  for (const bool vec4 : {true, false}) {
    // Each row's weights and state side by side; 8 rows past the `rows` the kernel is told of.
    at::Tensor record = pinned_empty({rows + 8, dim + state_floats}, at::kFloat);
    record.narrow(1, 0, dim).copy_(at::rand({rows + 8, dim}));
    at::Tensor expected = record.clone();
    const at::Tensor before = record.clone();
    const at::Tensor valid = at::tensor(std::vector<int64_t>{3, 9});
    const at::Tensor valid_grads = at::stack({grads[0], grads[2]}).contiguous();
    at::Tensor ew = expected.narrow(1, 0, dim), es = expected.narrow(1, dim, state_floats);
    apply_row_optimizer_cpu(optimizer_rows(ew, es, static_cast<char*>(ew.data_ptr()), es.data_ptr<float>()), hyper,
                            1, valid.data_ptr<int64_t>(), valid_grads.data_ptr<float>(), 2);
    at::Tensor w = record.narrow(1, 0, dim), st = record.narrow(1, dim, state_floats);
    const OptimizerRows table =
        optimizer_rows(w.narrow(0, 0, rows), st.narrow(0, 0, rows), mapped_address(w, "test", "weights"),
                       reinterpret_cast<float*>(mapped_address(st, "test", "state")));
    const at::Tensor dev_ids = ids.cuda();
    const at::Tensor dev_grads = grads.cuda();
    launch_row_optimizer(table, hyper, 1, dev_ids.data_ptr<int64_t>(), dev_grads.data_ptr<float>(), 3,
                         RowLaunch{4, 4}, vec4, device_index_error_record(0),
                         c10::cuda::getCurrentCUDAStream().stream());
    torch::cuda::synchronize();
    EXPECT_TRUE(at::equal(record.narrow(0, rows, 8), expected.narrow(0, rows, 8))) << "vec4=" << vec4;
    EXPECT_TRUE(at::allclose(record, expected, 1e-5, 1e-6)) << "vec4=" << vec4;
    EXPECT_FALSE(at::equal(record[3], before[3]));  // the valid rows did move
    EXPECT_THROW(check_deferred_index_errors(), c10::IndexError);  // flagged, and cleared by the check
  }
}

// Row-wise Adagrad's vectorized kernels (16-byte accesses, the row in registers) give the scalar kernel's bits:
// the same squares added in the same order, the same per-element update.
TEST(UvaRowKernels, RowwiseAdagradKernelsAgreeBitForBit) {
  if (!cuda_ready()) GTEST_SKIP() << "no CUDA device";
  OptimizerHyper hyper;
  hyper.kind = OptimizerKind::kRowwiseAdagrad;
  hyper.lr = 0.1f;
  hyper.weight_decay = 0.01f;
  for (const auto dtype : {at::kFloat, at::kBFloat16}) {
    for (const int64_t dim : {128, 256, 384, 512, 64, 100}) {
      const int64_t rows = 3000, state_floats = kStateHeaderFloats;
      const at::Tensor start = at::randn({rows, dim}).to(dtype).cuda();
      const at::Tensor ids = std::get<0>(at::_unique(at::randint(0, rows, {2000}, at::kLong))).cuda();
      const at::Tensor grads = at::randn({ids.numel(), dim}).cuda();
      std::vector<at::Tensor> results;
      for (const bool vec4 : {true, false}) {
        at::Tensor weights = start.clone();
        at::Tensor state = at::zeros({rows, state_floats}, at::TensorOptions().device(at::kCUDA));
        const OptimizerRows table = optimizer_rows(weights, state, static_cast<char*>(weights.data_ptr()),
                                                   state.data_ptr<float>());
        for (int step = 1; step <= 3; ++step) {
          launch_row_optimizer(table, hyper, step, ids.data_ptr<int64_t>(), grads.data_ptr<float>(), ids.numel(),
                               RowLaunch{64, 2}, vec4, device_index_error_record(0),
                               c10::cuda::getCurrentCUDAStream().stream());
        }
        results.push_back(at::cat({weights.to(at::kFloat), state}, 1).cpu());
      }
      EXPECT_TRUE(at::equal(results[0], results[1])) << dtype << " dim " << dim;
      EXPECT_FALSE(at::equal(results[0].narrow(1, 0, dim), start.to(at::kFloat).cpu()));
    }
  }
}

TEST(UvaRowKernels, IndexSummaryMatchesTheHost) {
  if (!cuda_ready()) GTEST_SKIP() << "no CUDA device";
  for (const int64_t n : {1, 7, 1000, 300000}) {  // one block and many
    for (const auto dtype : {at::kLong, at::kInt}) {
      at::Tensor sorted = std::get<0>(at::sort(at::randint(0, 1 << 20, {n}, at::kLong))).to(dtype);
      IndexSummary s = summarize_cuda_indices(sorted.cuda());
      EXPECT_EQ(s.min, sorted.min().item<int64_t>());
      EXPECT_EQ(s.max, sorted.max().item<int64_t>());
      EXPECT_EQ(s.first_descent, -1);
      at::Tensor strictly = at::arange(n, at::kLong).mul(3).to(dtype);
      EXPECT_EQ(summarize_cuda_indices(strictly.cuda()).first_not_increasing, -1);
      if (n < 3) continue;
      at::Tensor broken = strictly.clone();
      broken[n - 1] = broken[n - 2];  // a repeat at the end: sorted, not strictly increasing
      s = summarize_cuda_indices(broken.cuda());
      EXPECT_EQ(s.first_descent, -1);
      EXPECT_EQ(s.first_not_increasing, n - 1);
      broken[1] = -5;  // a descent early: the first of each kind is named
      s = summarize_cuda_indices(broken.cuda());
      EXPECT_EQ(s.min, -5);
      EXPECT_EQ(s.first_descent, 1);
      EXPECT_EQ(s.first_not_increasing, 1);
    }
  }
}
#endif

}  // namespace
}  // namespace speedtorch
