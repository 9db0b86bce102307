// Block shape of the GPU row kernels, shared by the kernels and the host code that sizes their grids. Plain C++:
// host files include it without CUDA headers.
#pragma once

namespace speedtorch {
namespace row_access {

constexpr int kThreadsPerBlock = 256;

// A full machine's worth of resident blocks: enough loads in flight to cover PCIe latency.
constexpr int kBlocksPerSm = 2048 / kThreadsPerBlock;

}  // namespace row_access
}  // namespace speedtorch
