// Row cache on CPU memory (see row_cache_cpu.h). One thread walks the ids in order: a miss may evict any slot of
// its set that this call has not used yet, so the walk's order decides only which rows stay cached, never a value.
#include "cpu/row_cache_cpu.h"

#include <ATen/Parallel.h>

#include <cstring>

namespace speedtorch {
namespace {

char* slot_row(const CacheSlots& c, int64_t slot) { return c.rows + slot * c.row_stride_bytes; }
float* slot_state(const CacheSlots& c, int64_t slot) { return c.state + slot * c.state_stride_floats; }
char* host_row(const CacheHostRows& h, int64_t id) { return h.rows + id * h.row_stride_bytes; }
float* host_state(const CacheHostRows& h, int64_t id) { return h.state + id * h.state_stride_floats; }

void write_back(const CacheSlots& c, const CacheHostRows& h, int64_t slot) {
  const int64_t id = c.ids[slot];
  std::memcpy(host_row(h, id), slot_row(c, slot), h.row_bytes);
  if (h.state_floats > 0 && c.state_loaded[slot]) {
    std::memcpy(host_state(h, id), slot_state(c, slot), h.state_floats * sizeof(float));
  }
  c.dirty[slot] = 0;
}

void load_state(const CacheSlots& c, const CacheHostRows& h, int64_t slot, int64_t id) {
  if (h.state_floats > 0) std::memcpy(slot_state(c, slot), host_state(h, id), h.state_floats * sizeof(float));
  c.state_loaded[slot] = 1;
}

int64_t find_or_insert(const CacheSlots& c, const CacheHostRows& h, int64_t id, int64_t now, bool for_update) {
  const int64_t first = cache_set_of(id, c.sets) * c.ways;
  int64_t victim = -1;
  int64_t oldest = now;  // only slots this call has not used may be evicted
  for (int64_t s = first; s < first + c.ways; ++s) {
    if (c.ids[s] == id) {
      c.ticks[s] = now;
      if (for_update && !c.state_loaded[s]) load_state(c, h, s, id);
      if (!for_update && c.lookups != nullptr) ++c.lookups[0];
      return s;
    }
    if (c.ticks[s] < oldest) {
      oldest = c.ticks[s];
      victim = s;
    }
  }
  if (!for_update && c.lookups != nullptr) ++c.lookups[1];
  if (victim < 0) return -1;
  if (c.ids[victim] >= 0 && c.dirty[victim]) write_back(c, h, victim);
  std::memcpy(slot_row(c, victim), host_row(h, id), h.row_bytes);
  c.state_loaded[victim] = 0;
  if (for_update) load_state(c, h, victim, id);
  c.ids[victim] = id;
  c.ticks[victim] = now;
  c.dirty[victim] = 0;
  return victim;
}

}  // namespace

void assign_cache_slots_cpu(const CacheSlots& cache, const CacheHostRows& host, const int64_t* ids, int64_t count,
                            int64_t now, bool for_update, int64_t* slots) {
  for (int64_t i = 0; i < count; ++i) {
    const int64_t slot = find_or_insert(cache, host, ids[i], now, for_update);
    if (slot >= 0 && for_update) cache.dirty[slot] = 1;
    slots[i] = slot;
  }
}

void read_cached_rows_cpu(const CacheSlots& cache, const CacheHostRows& host, const int64_t* ids,
                          const int64_t* slots, int64_t count, char* out) {
  at::parallel_for(0, count, 256, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const char* src = slots[i] >= 0 ? slot_row(cache, slots[i]) : host_row(host, ids[i]);
      std::memcpy(out + i * host.row_bytes, src, host.row_bytes);
    }
  });
}

void flush_cache_slots_cpu(const CacheSlots& cache, const CacheHostRows& host, bool empty) {
  const int64_t slots = cache.sets * cache.ways;
  for (int64_t s = 0; s < slots; ++s) {
    if (cache.ids[s] >= 0 && cache.dirty[s]) write_back(cache, host, s);
    if (empty) {
      cache.ids[s] = -1;
      cache.ticks[s] = -1;
      cache.state_loaded[s] = 0;
    }
  }
}

}  // namespace speedtorch
