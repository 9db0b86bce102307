// Values one thread sets over a process-wide setting, each in force until it is removed by the id it got, in any
// order: what a `with` block of Python (speedtorch.transfer_config_override, speedtorch.deferred_index_checks) or a
// push/pop pair of TorchScript holds. A block ends on the thread that began it, so each thread keeps its own list
// (thread_local) and no thread ever sees another's values; ids are unique in the process, so a pop on the wrong
// thread finds nothing and says so instead of removing another block's value.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <utility>
#include <vector>

namespace speedtorch {

template <typename T>
class ThreadScopedValues {
 public:
  struct Entry {
    int64_t id;
    T value;
  };

  // Adds `value` after the others; returns its id (> 0).
  int64_t push(T value) {
    static std::atomic<int64_t> next_id{1};
    const int64_t id = next_id.fetch_add(1);
    entries_.push_back({id, std::move(value)});
    return id;
  }

  // Removes the entry `id`, wherever it is in the list; false when this list holds none.
  bool pop(int64_t id) {
    const auto found = std::find_if(entries_.begin(), entries_.end(), [&](const Entry& e) { return e.id == id; });
    if (found == entries_.end()) return false;
    entries_.erase(found);
    return true;
  }

  // Oldest first: the later ones apply over the earlier ones.
  const std::vector<Entry>& entries() const { return entries_; }
  bool empty() const { return entries_.empty(); }

 private:
  std::vector<Entry> entries_;
};

}  // namespace speedtorch
