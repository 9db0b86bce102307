// Rows summed by index: duplicate ids' gradient rows summed into one row per id.
//
// Two users: the fused optimizer's CPU route de-duplicates a batch (its distinct ids ascending from
// cpu/distinct_indices_cpu.h, one summed gradient row each; optim/row_optimizer.cpp) and gather's backward forms a
// CPU table's dense gradient (ops/register_autograd.cpp). Both used torch's zeros + index_add_, whose CPU kernels
// wake every intra-op thread even for a demo batch of a few thousand rows; on a loaded machine each wake costs
// milliseconds (bench/RESULTS.md, issue 23 item 7). Here one thread does what one thread does fast, and the results
// are those of index_add_ into zeros bit for bit: each row's contributions are added in position order, starting
// from 0. Indices must already be validated (cpu/index_range_check.h).
#pragma once

#include <cstdint>

namespace speedtorch {

// out[r] = the sum of src[i] over the positions i with rows[i] == r, in increasing i, starting from 0 (rows named
// by no position are 0), for r in [0, out_rows); every rows[i] must be in [0, out_rows). Rows of `dim` floats,
// dense. Lanes split the output rows (each scans every position), so each row keeps its order; a second thread
// is asked to help (cpu/helped_parallel_for.h) only for a large share of work.
template <typename Index>
void sum_rows_by_index_cpu(const Index* rows, int64_t count, const float* src, int64_t dim, float* out,
                           int64_t out_rows);

}  // namespace speedtorch
