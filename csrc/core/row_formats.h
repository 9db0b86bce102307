// The row formats speedtorch::gather_dequant reads, and the dequantization of one element, written once for the CPU
// loop (cpu/gather_dequant_cpu.cpp) and the CUDA kernel (cuda/gather_dequant_kernel.cu). docs/engram.md states the
// layouts; python/speedtorch/quantized.py writes them from a trained table.
//
// A table of a quantized format is uint8 (num_rows, row_stride): each row starts with format_row_bytes(dim) bytes
// laid out as below; bytes past them (padding up to the stride) are ignored.
//   "bf16":            dim bfloat16 values (the table may also be a bfloat16 (num_rows, dim) tensor).
//   "int8_rowwise":    FBGEMM's INT8 row of inference (IntNBitTableBatchedEmbeddingBagsCodegen): bytes [0, 2) a
//                      float16 scale, [2, 4) a float16 bias, then dim uint8 codes q; value = q * scale + bias.
//                      FBGEMM pads rows to 16 bytes (its row_alignment), as speedtorch's conversion does by default.
//   "fp8_e4m3_ue8m0":  DeepSeek-V4.1's Engram row: dim float8 e4m3fn codes, then dim / 32 ue8m0 scale bytes, one per
//                      block of 32 elements; value = code * 2^(scale - 127) (scale 255 is NaN). dim % 32 == 0.
// Each value is computed in float32 and rounded once to bfloat16 (round to nearest even): the int8 value as a
// fused multiply-add (one rounding; a float64 multiply and add gives the same float32, since both are exact there),
// the fp8 one as an exact multiplication by a power of two.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <cstring>

#include "core/row_optimizer_math.h"  // SPEEDTORCH_HOST_DEVICE

namespace speedtorch {

enum class RowFormat : int32_t { kBFloat16 = 0, kInt8Rowwise = 1, kFp8E4m3Ue8m0 = 2 };

constexpr int64_t kInt8QparamBytes = 4;  // float16 scale + float16 bias, before the codes
constexpr int64_t kFp8BlockSize = 32;    // elements sharing one ue8m0 scale

// Bytes of one row's data in `format` (before any padding).
SPEEDTORCH_HOST_DEVICE int64_t format_row_bytes(RowFormat format, int64_t dim) {
  switch (format) {
    case RowFormat::kBFloat16: return 2 * dim;
    case RowFormat::kInt8Rowwise: return kInt8QparamBytes + dim;
    case RowFormat::kFp8E4m3Ue8m0: return dim + dim / kFp8BlockSize;
  }
  return 0;
}

// A ue8m0 byte as the float32 power of two it stands for: 2^(e - 127); e = 0 is the subnormal 2^-127, e = 255 NaN.
SPEEDTORCH_HOST_DEVICE float ue8m0_scale(uint8_t e) {
  uint32_t bits = e == 0 ? 0x00400000u : (e == 255 ? 0x7FC00000u : static_cast<uint32_t>(e) << 23);
  float f;
  memcpy(&f, &bits, sizeof(f));
  return f;
}

// Element j of a row whose data starts at `row` (host or device memory), dequantized and rounded to bfloat16.
SPEEDTORCH_HOST_DEVICE c10::BFloat16 dequantize_element(RowFormat format, const uint8_t* row, int64_t dim, int64_t j) {
  switch (format) {
    case RowFormat::kBFloat16: {
      c10::BFloat16 v;
      memcpy(&v, row + 2 * j, sizeof(v));
      return v;
    }
    case RowFormat::kInt8Rowwise: {
      c10::Half scale, bias;
      memcpy(&scale, row, sizeof(scale));
      memcpy(&bias, row + 2, sizeof(bias));
      const float q = static_cast<float>(row[kInt8QparamBytes + j]);
#if defined(__CUDA_ARCH__)
      return c10::BFloat16(__fmaf_rn(q, static_cast<float>(scale), static_cast<float>(bias)));
#else
      return c10::BFloat16(static_cast<float>(static_cast<double>(q) * static_cast<double>(static_cast<float>(scale)) +
                                              static_cast<double>(static_cast<float>(bias))));
#endif
    }
    case RowFormat::kFp8E4m3Ue8m0: {
      const float code = static_cast<float>(c10::Float8_e4m3fn(row[j], c10::Float8_e4m3fn::from_bits()));
      return c10::BFloat16(code * ue8m0_scale(row[dim + j / kFp8BlockSize]));
    }
  }
  return c10::BFloat16(0.f);
}

}  // namespace speedtorch
