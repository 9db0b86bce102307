// Pinned staging buffers for the staged transfer path: a ring of chunks per transfer, so CPU threads fill (or
// drain) one chunk while the copy engine moves another.
//
// Rings are pooled per device and handed to one transfer at a time; each chunk carries the event of its last use,
// and is waited for before the chunk is touched again, also by the next transfer that takes the ring: by the host
// on the staged path, by a stream on the stream-ordered one (transfer/stream_ordered_staging.h).
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <memory>

#include "memory/pinned_host_buffer.h"

namespace speedtorch {

class StagingRing {
 public:
  static constexpr int kChunks = 3;

  StagingRing(int device, int64_t chunk_bytes);
  ~StagingRing();
  StagingRing(const StagingRing&) = delete;
  StagingRing& operator=(const StagingRing&) = delete;

  int device() const { return device_; }
  int64_t chunk_bytes() const { return chunk_bytes_; }
  char* chunk(int i) const { return static_cast<char*>(buffer_->data()) + i * chunk_bytes_; }
  // Recorded after the last use of chunk i (a copy, or a host function); wait for it before touching the chunk.
  cudaEvent_t chunk_event(int i) const { return events_[i]; }
  // Spare events for ordering the copy stream with the caller's stream.
  cudaEvent_t start_event() const { return start_; }
  cudaEvent_t done_event() const { return done_; }

 private:
  int device_;
  int64_t chunk_bytes_;
  std::unique_ptr<PinnedHostBuffer> buffer_;
  std::array<cudaEvent_t, kChunks> events_{};
  cudaEvent_t start_ = nullptr;
  cudaEvent_t done_ = nullptr;
};

// A ring borrowed from the pool for one transfer; returned when destroyed.
class BorrowedStagingRing {
 public:
  BorrowedStagingRing(int device, int64_t chunk_bytes);
  ~BorrowedStagingRing();
  BorrowedStagingRing(const BorrowedStagingRing&) = delete;
  BorrowedStagingRing& operator=(const BorrowedStagingRing&) = delete;
  StagingRing& operator*() const { return *ring_; }
  StagingRing* operator->() const { return ring_.get(); }

 private:
  std::unique_ptr<StagingRing> ring_;
};

}  // namespace speedtorch
