// The distinct values of a batch of row ids, ascending, and where each position's id lies among them: what
// torch.unique(sorted=True, return_inverse=True) returns, on the calling thread.
//
// torch's CPU unique sorts every position (with the positions), and for a demo batch wakes threads: for 4,096 Zipf
// ids over 200,000 rows it took 130-190 us on the CPU machine, where this takes 11 us (bench/RESULTS.md, issue 23
// item 7). Ids dense in their span (a table's rows, a batch of them: at most 128 values of the span per id) set a
// bit each in a bitmap of the span, read back in order: no sort. Ids spread wider go through a hash table that finds
// the distinct values in first-seen order; only those are sorted (4x faster than torch with duplicates, 1.25x
// slower when nearly all are distinct). Two users: the speedtorch::unique_indices operator (HostEmbedding's
// forward), and the CPU routes that sum duplicate rows (optim/row_optimizer.cpp: the fused step's, the row cache's).
#pragma once

#include <cstdint>

namespace speedtorch {

// The distinct values of indices[0..count), ascending, into distinct[0..n) (n is returned; `distinct` has room for
// `count`), and for each position i the place of indices[i] among them, into inverse[i]. Any values (negative ones
// too). On the calling thread; temporary memory of at most 32 bytes an id.
template <typename Index>
int64_t distinct_indices_cpu(const Index* indices, int64_t count, int64_t* distinct, int64_t* inverse);

}  // namespace speedtorch
