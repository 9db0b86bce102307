// TableLock: the reader-writer lock of one PinnedEmbedding (pinned_embedding.h says which calls read and which
// write), and of the example server's model (torchscript_examples/request_handler.h). Many readers at once, one
// writer alone, and writers go first: a writer that is waiting stops new readers at the door.
//
// Why not std::shared_mutex alone: on Linux it is a glibc rwlock that prefers readers, so new readers keep coming
// in while a writer waits. A server gathering without pause would then hold an optimizer step back indefinitely.
// The door (a plain mutex) is held by a waiting writer until it has the lock; a reader only passes through it.
// Not recursive: a thread holding the lock must not take it again (the door can be shut behind it).
#pragma once

#include <mutex>
#include <shared_mutex>

namespace speedtorch {

class TableLock {
 public:
  // Lockable and SharedLockable: use std::unique_lock / std::shared_lock.
  void lock() {
    std::lock_guard<std::mutex> door(door_);
    rows_.lock();
  }
  void unlock() { rows_.unlock(); }
  void lock_shared() {
    { std::lock_guard<std::mutex> door(door_); }
    rows_.lock_shared();
  }
  void unlock_shared() { rows_.unlock_shared(); }

 private:
  std::mutex door_;
  std::shared_mutex rows_;
};

}  // namespace speedtorch
