// speedtorch::gather_dequant on CPU threads: rows of a quantized host table dequantized to bfloat16
// (core/row_formats.h, the code the GPU kernel runs too).
#pragma once

#include <c10/util/BFloat16.h>

#include <cstdint>

#include "cpu/row_copy_cpu.h"
#include "core/row_formats.h"

namespace speedtorch {

// out[i * dim + j] = element j of row indices[i] (row i when indices is null). Indices must already be validated.
template <typename Index>
void gather_dequant_cpu(const HostRows& table, RowFormat format, int64_t dim, const Index* indices, int64_t count,
                        c10::BFloat16* out);

}  // namespace speedtorch
