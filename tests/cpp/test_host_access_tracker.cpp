// Tests for csrc/memory/host_access_tracker: the record of UVA accesses stays as large as the work in flight.
// They need a GPU (UVA accesses are CUDA events) and skip without one.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <vector>

#include "memory/pinned_host_buffer.h"
#include "row_ops.h"
#include "memory/host_access_tracker.h"

namespace speedtorch {
namespace {

bool cuda_ready() { return cuda_device_available() && at::hasCUDA(); }

// Gathers from `tables` tables that stay alive, each access complete before the next: the record kept an entry for
// every table ever used (issue 13); completed ones are now swept out.
TEST(HostAccessTracker, ForgetsCompletedAccessesOfTablesStillAlive) {
  if (!cuda_ready()) GTEST_SKIP() << "no CUDA device";
  const std::size_t before = tracked_allocation_count();
  const at::Tensor idx = at::tensor({0, 3}).to(at::kCUDA);
  std::vector<at::Tensor> tables;
  for (int i = 0; i < 2000; ++i) {
    tables.push_back(pinned_empty({4, 4}, at::kFloat));
    ops::gather(tables.back(), idx);
    torch::cuda::synchronize();
  }
  // 16 shards, each swept when it reaches 8 allocations (or twice what its last sweep kept).
  EXPECT_LE(tracked_allocation_count(), before + 16 * 8);
}

// Releasing the memory forgets its allocations at once (after waiting for them).
TEST(HostAccessTracker, ReleasedTablesAreForgotten) {
  if (!cuda_ready()) GTEST_SKIP() << "no CUDA device";
  const std::size_t before = tracked_allocation_count();
  const at::Tensor idx = at::tensor({0, 3}).to(at::kCUDA);
  {
    std::vector<at::Tensor> tables;
    for (int i = 0; i < 5; ++i) {
      tables.push_back(pinned_empty({4, 4}, at::kFloat));
      ops::gather(tables.back(), idx);  // still queued, maybe, when the tables go
    }
  }
  EXPECT_LE(tracked_allocation_count(), before);
  torch::cuda::synchronize();
}

}  // namespace
}  // namespace speedtorch
