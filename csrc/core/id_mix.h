// The one 64-bit mix of a row id (MurmurHash3's finaliser): every bit of the id reaches the low bits, so strided or
// clustered ids spread over a row cache's sets (core/row_cache_slots.h) and a hash map's power-of-two buckets
// (embedding/id_index.h). Host and device.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define SPEEDTORCH_ID_MIX_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define SPEEDTORCH_ID_MIX_HOST_DEVICE inline
#endif

namespace speedtorch {

SPEEDTORCH_ID_MIX_HOST_DEVICE uint64_t mix_id(int64_t id) {
  uint64_t x = static_cast<uint64_t>(id);
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

}  // namespace speedtorch
