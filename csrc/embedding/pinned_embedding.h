// PinnedEmbedding: an embedding table of num_rows x dim kept in exact-size pinned host memory, exchanged with GPUs
// row by row. A torch::CustomClass (registered in ops/pinned_embedding_class.cpp), so Python, TorchScript and C++
// share one object. Its row operations are those of speedtorch::gather / scatter_ / row_optimizer_step_, called in the
// core (transfer/checked_row_transfer.h, optim/row_optimizer.h), not through the dispatcher.
//
// Its files (save / load / open, in pinned_embedding_io.cpp) are those of io/embedding_files.h; how it travels
// inside a torch.jit.save'd model is embedding/embedding_pickle.h.
//
// Threads (docs/reliability.md; proved by tests/cpp/test_concurrency.cpp under ThreadSanitizer): any number of
// threads may call one table's methods at once. Readers (gather, save, flush, the accessors) share a lock; writers
// (scatter_, apply_gradients, set_optimizer, set_step_count, the initialisers, set_sidecar; table() and state(),
// which hand the rows out) hold it alone
// (embedding/table_lock.h: a waiting writer goes before new readers). So each call sees the table entirely before
// or entirely after any other call, never a row half written, and no update is lost; a save is a consistent
// snapshot (rows, state and step count of one moment), writers waiting until it is on disk.
// - CPU path (host indices and rows): this is the whole guarantee; every row is read and written inside the call.
// - CUDA path: the lock covers the host side of a call (checks, CPU-thread shares, staging, the enqueue of its
//   kernels), so calls are enqueued in lock order, but the kernels run later on each caller's current stream. On
//   one stream they run in that order; kernels of different streams are not ordered by the lock (order the
//   streams). Host-side reads and writes of the rows (CPU shares, CPU optimizer steps, initialisers, save) wait
//   for the in-flight kernels that conflict with them (memory/host_access_tracker.h).
// - With a row cache (enable_cache), the cache's own mutex also serialises the calls that use it (gathers too).
// - Not covered: the tensors table() and state() return, and the free operators (speedtorch::gather, ...) applied
//   to them, touch the memory without the lock; whoever uses them orders them.
#pragma once

#include <ATen/core/Dict.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/custom_class.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "embedding/table_lock.h"
#include "io/embedding_files.h"
#include "memory/pinned_host_buffer.h"
#include "transfer/transfer_policy.h"

namespace speedtorch {

class RowCache;

class PinnedEmbedding : public torch::CustomClassHolder {
 public:
  PinnedEmbedding(int64_t num_rows, int64_t dim, c10::ScalarType dtype);
  // A table over files opened "r+" gets its row cache's updates written back (they reach the files).
  ~PinnedEmbedding() override;

  // Rows for `indices` (any shape, int32/int64, any device), shaped indices.shape + (dim,), on `device` if given,
  // else on the indices' device.
  at::Tensor gather(const at::Tensor& indices, std::optional<at::Device> device) const;
  // gather() of 1-D `indices` with their rows' optimizer state: (rows, state), as gather() and state()[indices]
  // would give. State kept beside the rows is read with them, one record a row (one read over PCIe, not a second
  // one of 16 bytes a row), and both are views of that one tensor; otherwise two reads (with a row cache, after its
  // updated rows are written back, as flush_cache() does: their state is newer in the cache).
  std::tuple<at::Tensor, at::Tensor> gather_with_state(const at::Tensor& indices,
                                                       std::optional<at::Device> device) const;
  // The inverse of gather_with_state for an optimizer step computed elsewhere (on rows read ahead to a GPU): writes
  // `rows` and `state` into the rows of 1-D distinct `indices` and sets the step count to `step`, under one lock.
  // When rows and state are views of one tensor of records laid out as the table's (gather_with_state's), one write
  // a row; otherwise two.
  void scatter_with_state_(const at::Tensor& indices, const at::Tensor& rows, const at::Tensor& state, int64_t step);
  // Writes src (indices.shape + (dim,)) into those rows; duplicate indices: the last occurrence wins. Returns the
  // table, as table() does.
  at::Tensor scatter_(const at::Tensor& indices, const at::Tensor& src);

  // This table's own transfer settings (names and meaning as transfer/transfer_policy.h's): each applies over the
  // process's settings (speedtorch.set_transfer_config) during this table's gather, scatter_ and apply_gradients,
  // in whichever thread calls them; the right split depends on the table. Runtime only: not saved or pickled.
  void set_transfer_option(const std::string& name, double value);
  c10::Dict<std::string, double> transfer_options() const;  // the ones set on this table
  void clear_transfer_options();

  int64_t num_rows() const;
  int64_t dim() const;
  // Host bytes owned: the table and its optimizer state.
  int64_t nbytes() const;

  // Configures the fused optimizer (names and options as optim/optimizer_config.h: torch.optim's, e.g. "adam",
  // {"lr": 1e-3}). Allocates its state, zeroed, exact-size in pinned memory: beside each row (one host page walk
  // per row for weights and state) unless state_beside_rows is false (a table of its own). The weights move into
  // the new layout (for a moment both layouts exist). Configuring again resets the state and the step count. A
  // table opened "r+" whose old state is still in use (a tensor from state(), another table over the same files) is
  // refused, unchanged: the new state replaces the state file at the next flush(), which that use would block.
  void set_optimizer(const std::string& kind, const c10::Dict<std::string, double>& options, bool state_beside_rows);
  // One optimizer step on the rows `indices` name: grad (indices.shape + (dim,), any device) is summed per distinct
  // row, then rows and state are updated in place (optim/row_optimizer.h, what speedtorch::row_optimizer_step_
  // runs). Needs set_optimizer first. sorted_unique: the indices are strictly increasing (torch.unique's output),
  // so the summing pass is skipped; checked, an error before any update when they are not.
  // updated_rows (with sorted_unique): also receives the rows' new weights, row i for indices[i], on the device
  // that does the work (optim/row_optimizer.h); not with a row cache.
  void apply_gradients(const at::Tensor& indices, const at::Tensor& grad, bool sorted_unique = false,
                       const std::optional<at::Tensor>& updated_rows = std::nullopt);
  // Changes the configured optimizer's hyper-parameters in place (lr, betas, weight_decay, ...: the options
  // set_optimizer takes, given whole: options not named take their defaults), keeping its state and step count, as
  // an LR scheduler changes a torch.optim param group between steps. Options that would change the state's layout
  // (SGD's momentum from or to 0, amsgrad, RMSprop's centered) need set_optimizer; they raise here, as does a table
  // without an optimizer. Takes effect from the next apply_gradients.
  void set_optimizer_options(const c10::Dict<std::string, double>& options);
  // Every option the optimizer `kind` accepts with its default value (optim/optimizer_config.h).
  static c10::Dict<std::string, double> optimizer_defaults(const std::string& kind);
  // The optimizer's name ("" when none; canonical: optim/optimizer_config.h's canonical_optimizer_name), options,
  // state (num_rows x state width float32, shares memory, handed out as table() is; undefined when none), and the
  // table-wide step count.
  std::string optimizer() const;
  c10::Dict<std::string, double> optimizer_options() const;  // a copy
  at::Tensor state() const;
  int64_t step_count() const;
  // Sets the table-wide step count (when restoring a table trained elsewhere).
  void set_step_count(int64_t step);
  // The width of the state rows the optimizer `kind` with `options` keeps for rows of `dim` (floats, 16-byte
  // multiples), as set_optimizer allocates them.
  static int64_t state_width(const std::string& kind, const c10::Dict<std::string, double>& options, int64_t dim);
  bool is_pinned() const;
  // One line saying what the table is: "PinnedEmbedding(1000 x 64, float32, optimizer=adam, step=3, pinned, ...)",
  // Python's repr() of it.
  std::string repr() const;
  // The host table itself (shares memory). Host-side reads and writes of it are not ordered after GPU work that
  // is still running (synchronise the stream first), nor with other threads' calls (the lock is not held). With a
  // row cache, while the tensor (or any view of it) is alive, the cache stands aside: see enable_cache.
  at::Tensor table() const;
  // Whether a tensor that table(), state() or scatter_() returned (or a view of one) is still alive: the caller may
  // read or write the host rows through it at any time. (speedtorch.nn.placement.HybridTable asks it too.)
  bool host_rows_in_use() const;

  // In-place initialisers; none needs a table-sized temporary. With a seed, the values depend only on the seed
  // (not on the thread count); without one, they come from torch's default CPU generator.
  void zero_();
  void uniform_(double low, double high, std::optional<int64_t> seed);
  void normal_(double mean, double std, std::optional<int64_t> seed);
  // Copies a (num_rows, dim) tensor of any device and floating dtype into the table.
  void copy_(const at::Tensor& src);

  // --- files (pinned_embedding_io.cpp; formats in io/embedding_files.h) ---
  // Saves the rows, the optimizer's name, options, state and step count to `path` (+ .state.npy, .meta.json),
  // streamed in chunks, atomically. Onto the files of an "r+" table (its own: flush(); another's: refused), as
  // io/mapped_file_guard.h says.
  void save(const std::string& path) const;
  // save(path) unless the files at `path` already hold exactly this table: whole files whose meta records the
  // table's shape, dtype, optimizer, options and step count, and content hashes equal to those of the rows and state
  // as they are now (hashed: a read of the table, no write). Returns what the meta file says afterwards. Pickling
  // a model with a sidecar uses it, so copy.deepcopy of the model leaves an up-to-date sidecar alone.
  io::EmbeddingMeta save_unless_held(const std::string& path) const;
  // A new table read from a save (or from a plain 2-D .npy: rows only) straight into pinned memory. With
  // `verify`, the data must match the content hashes of the meta file.
  static c10::intrusive_ptr<PinnedEmbedding> load(const std::string& path, bool verify);
  // A table over the files themselves, memory-mapped as numpy's mmap_mode: "r" (read-only: speedtorch's writes
  // raise, a plain torch write stays in this process's private pages), "r+" (changes reach the files: call flush()
  // at checkpoints) or "c" (copy-on-write). Nothing is copied; page-locking reads each page once (see
  // docs/persistence.md for the limits). Headers are read from the mappings and checked against the meta.
  static c10::intrusive_ptr<PinnedEmbedding> open(const std::string& path, const std::string& mode);
  // A zero table (and zeroed optimizer state, each in its own file) over new files at `path`, mapped as open(path,
  // "r+") maps them: numpy's open_memmap(mode="w+"). The files get their blocks at once (zeros, not written), so a
  // file system without room for them is an error here, not a SIGBUS at a later write. Refuses, before touching
  // anything, when any of the three files exists; on failure removes only the files it made. Other processes may
  // open() the same files to share the table (on a memory file system such as /dev/shm, their GPUs may write it
  // too).
  static c10::intrusive_ptr<PinnedEmbedding> create(const std::string& path, int64_t num_rows, int64_t dim,
                                                    c10::ScalarType dtype, const std::string& optimizer,
                                                    const c10::Dict<std::string, double>& options);
  // For a table opened with "r+": writes its pages back and rewrites the meta file (step count, content hashes);
  // an optimizer state configured after open() is written to its file.
  void flush();
  // "r", "r+" or "c" for a table over files; "" for a table in anonymous memory.
  std::string mapping() const;

  // Where torch.jit.save writes this table (a "sidecar", io/embedding_files.h's files) instead of inside the model;
  // "" (the default) keeps it inline (above SPEEDTORCH_INLINE_MAX_BYTES with a warning). A relative path is
  // resolved against $SPEEDTORCH_SIDECAR_DIR if set, else the current directory, when saving and when loading.
  void set_sidecar(const std::string& path);
  std::string sidecar() const;

  // --- row cache (cache/row_cache.h) ---
  // Keeps copies of the most recently used rows (at least num_rows of them, least recently used evicted) and their
  // optimizer state in the memory of `device` (a GPU, or the CPU): gather and apply_gradients then read and update
  // the copies (bit for bit the host path's results), which reach the host table when evicted or flushed. Whatever
  // reads the host rows (save(), flush(), snapshots, pickling) writes the cache back first, and whatever writes them
  // (scatter_, copy_, the initialisers, set_optimizer) also empties it, so the host table is exact whenever it is
  // read. table() and state() write the cache back and empty it too, and hand out the host rows: while the caller
  // holds such a tensor (HostEmbedding.weight, a state_dict, any view of them; host_rows_in_use()), gather and
  // apply_gradients use the host rows and leave the cache empty, so reads and writes through the tensor are exact
  // at any time, as without a cache; once it is dropped the cache fills again. Runtime only: a saved or pickled
  // table has no cache. Enabling again replaces the cache (the old one written back first).
  void enable_cache(int64_t num_rows, at::Device device);
  // Writes the cache back and drops it (nothing if there is none).
  void disable_cache();
  // The cache's slots (0 without a cache) and how many hold a row.
  int64_t cache_slots() const;
  int64_t cached_rows() const;
  // Writes the cache's updated rows back to the host table (they stay cached).
  void flush_cache() const;

  // Copies of the rows and the optimizer state with the configuration and step count they go with, read under one
  // lock so that no optimizer step or write lands between them (a model saved inline, embedding_pickle.cpp).
  struct Snapshot {
    at::Tensor table;  // dense copies in ordinary host memory
    at::Tensor state;  // undefined when there is no optimizer
    std::string optimizer;
    c10::Dict<std::string, double> options;
    int64_t step = 0;
    bool state_beside_rows = false;
  };
  Snapshot snapshot() const;

 private:
  // The private helpers below expect the caller to hold lock_ (shared for the const ones, exclusively otherwise).
  // Rejects writes to a table opened read-only.
  void check_writable(const char* op) const;
  // flush() for a caller holding the lock (save() onto the table's own files).
  void flush_locked() const;
  // save() and save_unless_held()'s check, for a caller holding the lock.
  void save_locked(const std::string& path) const;
  bool files_hold_table_locked(const std::string& path) const;
  // Where the optimizer's state lives when it does not share the table's buffer (for flush()).
  bool state_is_mapped() const;
  // A table over the files of `meta` at `path`, mapped as `mapping` says (open() and create()).
  static c10::intrusive_ptr<PinnedEmbedding> map_files(const std::string& path, const io::EmbeddingMeta& meta,
                                                       FileMapping mapping);
  // Copies the rows into `destination` (a new layout), releasing the old table's memory as it goes when possible.
  void move_rows(at::Tensor& destination);

  // Writes the row cache back to the host rows, and with `empty` forgets its rows (before host writes); nothing
  // without a cache.
  void write_back_cache(bool empty) const;
  // The cache, unless there is none or the host rows are handed out (host_rows_in_use()): then it stands aside.
  RowCache* usable_cache() const;
  // `rows` (table_ or state_) as the caller gets them: a tensor over the same memory with a storage of its own,
  // weakly referenced in handed_out_ so that host_rows_in_use() sees whether the caller still holds it. Its storage
  // holds `rows`' storage, so move_rows() sees it too. Needs the lock held exclusively.
  at::Tensor hand_out(const at::Tensor& rows) const;

  template <typename Fill>
  void fill_by_chunks(std::optional<int64_t> seed, Fill&& fill);

  std::shared_ptr<PinnedHostBuffer> table_buffer_;
  std::shared_ptr<PinnedHostBuffer> state_buffer_;  // null when the state sits in table_buffer_ or there is none
  at::Tensor table_;
  at::Tensor state_;
  std::string optimizer_;
  c10::Dict<std::string, double> options_;
  int64_t step_ = 0;
  std::string sidecar_;
  std::string files_path_;  // the path open() mapped (for flush())
  TransferOverrides transfer_overrides_;
  std::shared_ptr<RowCache> cache_;  // null without a row cache
  // The storages of the tensors handed out (hand_out); expired ones are dropped at the next hand_out.
  mutable std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> handed_out_;
  mutable TableLock lock_;  // guards every member above once the table is shared (see the top of this file)
};

}  // namespace speedtorch
