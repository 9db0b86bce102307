// PinnedEmbedding (see pinned_embedding.h).
#include "embedding/pinned_embedding.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <ATen/core/Generator.h>
#include <ATen/ops/from_blob.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <mutex>
#include <shared_mutex>
#include <sstream>

#include "cache/row_cache.h"
#include "core/checked_size.h"
#include "memory/pinned_host_buffer.h"
#include "optim/optimizer_config.h"
#include "optim/row_optimizer.h"
#include "transfer/checked_row_transfer.h"
#include "memory/host_access_tracker.h"
#include "transfer/transfer_policy.h"

namespace speedtorch {
namespace {

constexpr int64_t kInitChunkRows = 1 << 14;

// Bytes from `from` to `to` (two places in one buffer: a row and its state, a view and its buffer's start).
int64_t bytes_between(const void* from, const void* to) {
  return static_cast<const char*>(to) - static_cast<const char*>(from);
}

void check_dtype(c10::ScalarType dtype) {
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16,
              "PinnedEmbedding: dtype must be float32, float16 or bfloat16, got ", dtype);
}

uint64_t default_generator_seed() {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get<at::CPUGeneratorImpl>()->random64();
}

}  // namespace

PinnedEmbedding::PinnedEmbedding(int64_t num_rows, int64_t dim, c10::ScalarType dtype) {
  TORCH_CHECK(num_rows >= 0, "PinnedEmbedding: num_rows must be >= 0, got ", num_rows);
  TORCH_CHECK(dim > 0, "PinnedEmbedding: dim must be > 0, got ", dim);
  check_dtype(dtype);
  const int64_t bytes =
      checked_dense_bytes({num_rows, dim}, static_cast<int64_t>(c10::elementSize(dtype)), "PinnedEmbedding");
  table_buffer_ = std::make_shared<PinnedHostBuffer>(bytes == 0 ? 1 : static_cast<std::size_t>(bytes));
  table_ = tensor_over(table_buffer_, 0, {num_rows, dim}, {dim, 1}, dtype);
}

// Readers take lock_ shared, writers exclusively (see the top of pinned_embedding.h); private helpers never lock.
// Row calls go straight to the core (transfer/, optim/), not back through the dispatcher: the lock is held, and
// csrc/ does not depend on the registration layer (ops/).
using ReadLock = std::shared_lock<TableLock>;
using WriteLock = std::unique_lock<TableLock>;

at::Tensor PinnedEmbedding::gather(const at::Tensor& indices, std::optional<at::Device> device) const {
  ReadLock read(lock_);
  const TransferConfigScope settings(transfer_overrides_, "PinnedEmbedding.gather");
  if (RowCache* cache = usable_cache()) return cache->gather(table_, state_, indices, device, "PinnedEmbedding.gather");
  return gather_table_rows(table_, indices, device, "PinnedEmbedding.gather");
}

std::tuple<at::Tensor, at::Tensor> PinnedEmbedding::gather_with_state(const at::Tensor& indices,
                                                                      std::optional<at::Device> device) const {
  const char* op = "PinnedEmbedding.gather_with_state";
  ReadLock read(lock_);
  TORCH_CHECK(state_.defined(), op, ": the table has no optimizer state; call set_optimizer first");
  TORCH_CHECK(indices.dim() == 1, op, ": indices must be 1-D, got shape ", indices.sizes());
  const TransferConfigScope settings(transfer_overrides_, op);
  // Records: each row's bytes, then its state's, table_.stride(0) elements apart, in table_buffer_.
  const int64_t record = table_.stride(0) * table_.element_size();
  const int64_t state_at = bytes_between(table_.data_ptr(), state_.data_ptr());
  const int64_t state_bytes = state_.size(1) * state_.element_size();
  RowCache* cache = usable_cache();
  const bool records = !cache && !state_buffer_ && table_buffer_ && table_.size(0) > 0 && state_at > 0 &&
                       state_at + state_bytes <= record && state_.stride(0) * state_.element_size() == record;
  if (!records) {  // rows that a cache may hold newer, or state in a buffer of its own: two reads
    // The cache's updated rows carry their newer state until written back: the host state is exact only after a
    // flush (the rows stay cached). Under the read lock, as flush_cache(): no update runs meanwhile.
    if (cache) cache->flush(table_, state_, /*empty=*/false);
    at::Tensor rows = cache ? cache->gather(table_, state_, indices, device, op)
                            : gather_table_rows(table_, indices, device, op);
    return {rows, gather_table_rows(state_, indices, device, op)};
  }
  const at::Tensor all = tensor_over(table_buffer_, bytes_between(table_buffer_->data(), table_.data_ptr()),
                                     {table_.size(0), record}, {record, 1}, at::kByte);
  const at::Tensor both = gather_table_rows(all, indices, device, op);
  return {both.narrow(1, 0, table_.size(1) * table_.element_size()).view(table_.scalar_type()),
          both.narrow(1, state_at, state_bytes).view(state_.scalar_type())};
}

void PinnedEmbedding::scatter_with_state_(const at::Tensor& indices, const at::Tensor& rows, const at::Tensor& state,
                                          int64_t step) {
  const char* op = "PinnedEmbedding.scatter_with_state_";
  WriteLock write(lock_);
  check_writable("scatter_with_state_");
  TORCH_CHECK(state_.defined(), op, ": the table has no optimizer state; call set_optimizer first");
  TORCH_CHECK(indices.dim() == 1, op, ": indices must be 1-D, got shape ", indices.sizes());
  TORCH_CHECK(step >= 0, op, ": step must be >= 0, got ", step);
  TORCH_CHECK(state.dim() == 2 && state.size(0) == indices.size(0) && state.size(1) == state_.size(1) &&
                  state.scalar_type() == state_.scalar_type(),
              op, ": state must be ", indices.size(0), " x ", state_.size(1), " ", state_.scalar_type(), ", got ",
              state.sizes(), " ", state.scalar_type());
  const TransferConfigScope settings(transfer_overrides_, op);
  write_back_cache(true);
  const int64_t record = table_.stride(0) * table_.element_size();
  const int64_t state_at = bytes_between(table_.data_ptr(), state_.data_ptr());
  const auto stride_bytes = [](const at::Tensor& t) { return t.stride(0) * t.element_size(); };
  const bool records = !state_buffer_ && stride_bytes(state_) == record && rows.dim() == 2 &&
                       rows.scalar_type() == table_.scalar_type() && rows.size(1) == table_.size(1) &&
                       rows.stride(1) == 1 && stride_bytes(rows) == record && stride_bytes(state) == record &&
                       rows.storage().is_alias_of(state.storage()) &&
                       bytes_between(rows.data_ptr(), state.data_ptr()) == state_at;
  if (records && rows.size(0) > 0) {  // one write of each whole record
    const at::Tensor all = tensor_over(table_buffer_, bytes_between(table_buffer_->data(), table_.data_ptr()),
                                       {table_.size(0), record}, {record, 1}, at::kByte);
    scatter_table_rows(all, indices, rows.view(at::kByte).as_strided({rows.size(0), record}, {record, 1}), op);
  } else {
    scatter_table_rows(table_, indices, rows, op);
    scatter_table_rows(state_, indices, state, op);
  }
  step_ = step;
}

at::Tensor PinnedEmbedding::scatter_(const at::Tensor& indices, const at::Tensor& src) {
  WriteLock write(lock_);
  check_writable("scatter_");
  const TransferConfigScope settings(transfer_overrides_, "PinnedEmbedding.scatter_");
  write_back_cache(true);
  scatter_table_rows(table_, indices, src, "PinnedEmbedding.scatter_");
  return hand_out(table_);
}

void PinnedEmbedding::set_transfer_option(const std::string& name, double value) {
  WriteLock write(lock_);
  TransferOverrides next = transfer_overrides_;
  next[name] = value;
  // Checked against the process's settings now; applied over whatever they are at each call.
  with_overrides(process_transfer_config(), next, "PinnedEmbedding.set_transfer_option");
  transfer_overrides_ = std::move(next);
}

c10::Dict<std::string, double> PinnedEmbedding::transfer_options() const {
  ReadLock read(lock_);
  c10::Dict<std::string, double> out;
  for (const auto& [name, value] : transfer_overrides_) out.insert(name, value);
  return out;
}

void PinnedEmbedding::clear_transfer_options() {
  WriteLock write(lock_);
  transfer_overrides_.clear();
}

int64_t PinnedEmbedding::num_rows() const {
  ReadLock read(lock_);
  return table_.size(0);
}

int64_t PinnedEmbedding::dim() const {
  ReadLock read(lock_);
  return table_.size(1);
}

std::string PinnedEmbedding::optimizer() const {
  ReadLock read(lock_);
  return optimizer_;
}

c10::Dict<std::string, double> PinnedEmbedding::optimizer_options() const {
  ReadLock read(lock_);
  return options_.copy();  // a c10::Dict copy shares its entries: the caller must not reach the table's own
}

at::Tensor PinnedEmbedding::state() const {
  WriteLock write(lock_);
  write_back_cache(true);  // the caller may write the rows it gets
  return hand_out(state_);
}

int64_t PinnedEmbedding::step_count() const {
  ReadLock read(lock_);
  return step_;
}

at::Tensor PinnedEmbedding::table() const {
  WriteLock write(lock_);  // alone: no gather may fill the cache between the write-back and the hand-out
  write_back_cache(true);  // the caller may write the rows it gets
  return hand_out(table_);
}

at::Tensor PinnedEmbedding::hand_out(const at::Tensor& rows) const {
  if (!rows.defined()) return rows;
  handed_out_.erase(std::remove_if(handed_out_.begin(), handed_out_.end(), [](const auto& s) { return s.expired(); }),
                    handed_out_.end());
  at::Tensor out = at::from_blob(
      rows.data_ptr(), rows.sizes(), rows.strides(), [keep = rows.storage()](void*) mutable { keep = c10::Storage(); },
      rows.options());
  handed_out_.push_back(out.storage().getWeakStorageImpl());
  return out;
}

bool PinnedEmbedding::host_rows_in_use() const {
  ReadLock read(lock_);
  return std::any_of(handed_out_.begin(), handed_out_.end(), [](const auto& s) { return !s.expired(); });
}

RowCache* PinnedEmbedding::usable_cache() const {
  if (!cache_) return nullptr;
  if (std::any_of(handed_out_.begin(), handed_out_.end(), [](const auto& s) { return !s.expired(); })) {
    TORCH_WARN_ONCE("PinnedEmbedding: the row cache stands aside while a tensor from table(), state() or scatter_() "
                    "is alive (HostEmbedding.weight, a state_dict, a view of them): rows are read and updated in "
                    "host memory, so that reads and writes through that tensor stay exact. Drop it to use the cache "
                    "again.");
    return nullptr;  // table() emptied the cache before handing the rows out; it stays empty until they are back
  }
  return cache_.get();
}

void PinnedEmbedding::set_sidecar(const std::string& path) {
  WriteLock write(lock_);
  sidecar_ = path;
}

std::string PinnedEmbedding::sidecar() const {
  ReadLock read(lock_);
  return sidecar_;
}

PinnedEmbedding::Snapshot PinnedEmbedding::snapshot() const {
  ReadLock read(lock_);
  write_back_cache(false);
  // Rows a GPU kernel is still writing must land before they are copied.
  wait_for_uva_conflicts(table_.storage().data(), UvaAccess::kRead);
  if (state_.defined()) wait_for_uva_conflicts(state_.storage().data(), UvaAccess::kRead);
  Snapshot out;
  out.table = table_.clone(at::MemoryFormat::Contiguous);
  if (state_.defined()) out.state = state_.clone(at::MemoryFormat::Contiguous);
  out.optimizer = optimizer_;
  out.options = options_.copy();
  out.step = step_;
  // Side by side, a row's stride spans its weights and its state.
  out.state_beside_rows = state_.defined() && table_.stride(0) != table_.size(1);
  return out;
}

void PinnedEmbedding::check_writable(const char* op) const {
  TORCH_CHECK(table_buffer_->mapping() != FileMapping::kReadOnly, "PinnedEmbedding.", op, ": the table was opened "
              "read-only (mode 'r') from ", table_buffer_->path(), "; open it with mode 'r+' (changes reach the "
              "file) or 'c' (copy-on-write), or load() it");
}

void PinnedEmbedding::set_step_count(int64_t step) {
  WriteLock write(lock_);
  TORCH_CHECK(step >= 0, "PinnedEmbedding.set_step_count: step must be >= 0, got ", step);
  step_ = step;
}

int64_t PinnedEmbedding::state_width(const std::string& kind, const c10::Dict<std::string, double>& options,
                                     int64_t dim) {
  TORCH_CHECK(dim > 0, "PinnedEmbedding.state_width: dim must be > 0, got ", dim);
  // State rows (and, side by side, whole records) stay 16-byte aligned for the kernels' vector accesses.
  constexpr const char* kWhat = "PinnedEmbedding: the optimizer state's width";
  const int64_t floats = checked_add(kStateHeaderFloats, checked_mul(state_slots(parse_optimizer(kind, options)), dim,
                                                                     kWhat), kWhat);
  return checked_add(floats, 3, kWhat) / 4 * 4;
}

bool PinnedEmbedding::is_pinned() const {
  ReadLock read(lock_);
  return is_pinned_host_memory(table_.storage().data());
}

std::string PinnedEmbedding::repr() const {
  ReadLock read(lock_);
  std::ostringstream out;
  out << "PinnedEmbedding(" << table_.size(0) << " x " << table_.size(1) << ", "
      << c10::toString(table_.scalar_type()) << ", optimizer=" << (optimizer_.empty() ? "none" : optimizer_);
  if (!optimizer_.empty()) out << ", step=" << step_ << (state_buffer_ ? ", state apart" : ", state beside rows");
  out << (is_pinned_host_memory(table_.storage().data()) ? ", pinned" : ", not pinned");
  switch (table_buffer_->mapping()) {
    case FileMapping::kReadOnly: out << ", mapped 'r' from " << table_buffer_->path(); break;
    case FileMapping::kReadWrite: out << ", mapped 'r+' from " << table_buffer_->path(); break;
    case FileMapping::kCopyOnWrite: out << ", mapped 'c' from " << table_buffer_->path(); break;
    case FileMapping::kNone: break;
  }
  if (!sidecar_.empty()) out << ", sidecar '" << sidecar_ << "'";
  if (cache_) out << ", row cache of " << cache_->slots() << " rows on " << cache_->device();
  out << ")";
  return out.str();
}

int64_t PinnedEmbedding::nbytes() const {
  ReadLock read(lock_);
  return static_cast<int64_t>(table_buffer_->size() + (state_buffer_ ? state_buffer_->size() : 0));
}

void PinnedEmbedding::set_optimizer(const std::string& kind, const c10::Dict<std::string, double>& options,
                                    bool state_beside_rows) {
  WriteLock write(lock_);
  // No check_writable: a table mapped read-only may still get an optimizer (its state is a table of its own, below);
  // its steps are what raise. That lets a frozen, mapped table serve inside a HostEmbedding.
  const OptimizerHyper hyper = parse_optimizer(kind, options);  // validates before anything moves
  const int64_t n = table_.size(0);
  const int64_t d = table_.size(1);
  const auto elem = static_cast<int64_t>(table_.element_size());
  const int64_t state_floats = state_width(kind, options, d);
  TORCH_CHECK(!state_beside_rows || table_buffer_->mapping() == FileMapping::kNone, "PinnedEmbedding.set_optimizer: "
              "the table is mapped from ", table_buffer_->path(), " and its rows stay there; pass "
              "state_beside_rows=False (the state gets a table of its own)");
  // An 'r+' table's state file is replaced at the next flush() by one for the new state: it must then be mapped by
  // nothing of this process, or flush() would have to refuse after the rows (written through their mapping all
  // along) had moved on from what the meta file describes. So a state still in use is refused here, while the
  // files are a consistent pair.
  if (table_buffer_->mapping() == FileMapping::kReadWrite && state_is_mapped()) {
    const void* state_data = state_.data_ptr();
    const bool handed_out = std::any_of(handed_out_.begin(), handed_out_.end(), [&](const auto& s) {
      const auto storage = s.lock();
      return storage && storage->data() == state_data;
    });
    const auto mappings = read_write_mappings_of_file(state_buffer_->path());
    const bool mapped_elsewhere = std::any_of(mappings.begin(), mappings.end(), [&](const FileMappingRange& m) {
      return m.data != state_buffer_->data();
    });
    TORCH_CHECK(!handed_out && !mapped_elsewhere, "PinnedEmbedding.set_optimizer: this table is mapped from ",
                table_buffer_->path(), " ('r+') and its optimizer state from ", state_buffer_->path(), ", which ",
                handed_out ? "a tensor of the state still uses (from state() or a state_dict(), or a view of one)"
                           : "another mapping of this process still uses (another table opened on these files)",
                ". The new state replaces that file at the next flush(), which a file still mapped would refuse "
                "after the rows had moved on, leaving files that no longer match. Drop ",
                handed_out ? "that tensor" : "that table", " first, then set the optimizer; nothing was changed");
  }
  // Every size is checked before anything moves: a refused optimizer leaves the table as it was.
  constexpr const char* kWhat = "PinnedEmbedding.set_optimizer: the optimizer state's bytes";
  const int64_t weight_bytes = checked_add(checked_mul(d, elem, kWhat), 15, kWhat) / 16 * 16;
  const int64_t record = checked_add(weight_bytes, checked_mul(state_floats, 4, kWhat), kWhat);
  const int64_t beside_bytes = checked_mul(n, record, kWhat);
  const int64_t state_bytes = checked_mul(n, checked_mul(state_floats, 4, kWhat), kWhat);
  write_back_cache(true);
  wait_for_uva_conflicts(table_.storage().data(), UvaAccess::kWrite);
  if (state_.defined()) wait_for_uva_conflicts(state_.storage().data(), UvaAccess::kWrite);
  if (state_beside_rows) {
    // Pinned only once the rows are in: the old table is released as they move, so peak memory stays one table.
    auto buffer = std::make_shared<PinnedHostBuffer>(n == 0 ? 1 : static_cast<std::size_t>(beside_bytes), false);
    at::Tensor weights = tensor_over(buffer, 0, {n, d}, {record / elem, 1}, table_.scalar_type());
    move_rows(weights);
    buffer->pin();
    // No rows, no records: the (empty) state view starts where the buffer of one byte does.
    state_ = tensor_over(buffer, n == 0 ? 0 : weight_bytes, {n, state_floats}, {record / 4, 1}, at::kFloat);
    table_ = weights;
    table_buffer_ = std::move(buffer);
    state_buffer_.reset();
  } else {
    if (table_.stride(0) != d) {  // leaving a side-by-side layout: make the rows dense again
      auto buffer =
          std::make_shared<PinnedHostBuffer>(n * d * elem == 0 ? 1 : static_cast<std::size_t>(n * d * elem), false);
      at::Tensor weights = tensor_over(buffer, 0, {n, d}, {d, 1}, table_.scalar_type());
      move_rows(weights);
      buffer->pin();
      table_ = weights;
      table_buffer_ = std::move(buffer);
    }
    state_buffer_ = std::make_shared<PinnedHostBuffer>(n == 0 ? 1 : static_cast<std::size_t>(state_bytes));
    state_ = tensor_over(state_buffer_, 0, {n, state_floats}, {state_floats, 1}, at::kFloat);
  }
  optimizer_ = optimizer_name(hyper);
  options_ = options.copy();
  step_ = 0;
  if (cache_) {  // a cache for the new layout; should building it fail, the table is left with none, not a stale one
    const int64_t slots = cache_->slots();
    const at::Device device = cache_->device();
    cache_.reset();
    cache_ = std::make_shared<RowCache>(slots, device, table_, state_);
  }
}

void PinnedEmbedding::set_optimizer_options(const c10::Dict<std::string, double>& options) {
  WriteLock write(lock_);
  TORCH_CHECK(state_.defined(), "PinnedEmbedding.set_optimizer_options: no optimizer; call set_optimizer(kind, "
              "options) first");
  parse_optimizer(optimizer_, options);  // validates the names and values
  const int64_t width = state_width(optimizer_, options, table_.size(1));
  TORCH_CHECK(width == state_.size(1), "PinnedEmbedding.set_optimizer_options: these options change the layout of ",
              optimizer_, "'s state (", state_.size(1), " floats a row now, ", width, " with them: momentum from or to "
              "0, amsgrad or centered); call set_optimizer(kind, options, state_beside_rows), which starts the state "
              "afresh");
  options_ = options.copy();
}

c10::Dict<std::string, double> PinnedEmbedding::optimizer_defaults(const std::string& kind) {
  return speedtorch::optimizer_defaults(kind);
}

void PinnedEmbedding::move_rows(at::Tensor& destination) {
  // When nothing else shares the old table (no tensor returned by table() is alive), release it chunk by chunk as
  // the rows move, so a table and its new layout never both exist at full size.
  const bool sole_owner = table_.storage().use_count() == 1 && table_.is_contiguous();
  if (sole_owner) table_buffer_->unpin();
  constexpr int64_t kChunkRows = 1 << 16;
  const int64_t row_bytes = table_.stride(0) * table_.element_size();
  const int64_t n = table_.size(0);
  for (int64_t first = 0; first < n; first += kChunkRows) {
    const int64_t rows = std::min(kChunkRows, n - first);
    destination.narrow(0, first, rows).copy_(table_.narrow(0, first, rows));
    if (sole_owner) table_buffer_->discard(first * row_bytes, rows * row_bytes);
  }
}

void PinnedEmbedding::apply_gradients(const at::Tensor& indices, const at::Tensor& grad, bool sorted_unique,
                                      const std::optional<at::Tensor>& updated_rows) {
  WriteLock write(lock_);
  check_writable("apply_gradients");
  TORCH_CHECK(state_.defined(), "PinnedEmbedding.apply_gradients: no optimizer; call set_optimizer(kind, options) "
              "first");
  const TransferConfigScope settings(transfer_overrides_, "PinnedEmbedding.apply_gradients");
  if (RowCache* cache = usable_cache()) {
    TORCH_CHECK(!updated_rows.has_value(), "PinnedEmbedding.apply_gradients: updated_rows is not supported with a "
                "row cache (its rows stay on the GPU already: gather them)");
    // The cache sums duplicates itself, so sorted_unique has nothing to skip there; the claim is still checked, so
    // that a caller gets the same answer whatever the placement.
    if (sorted_unique) check_sorted_unique_indices(indices, table_.size(0), "PinnedEmbedding.apply_gradients");
    cache->apply_gradients(table_, state_, indices, grad, parse_optimizer(optimizer_, options_), step_ + 1,
                           "PinnedEmbedding.apply_gradients");
    ++step_;
    return;
  }
  apply_row_optimizer(table_, state_, indices, grad, parse_optimizer(optimizer_, options_), step_ + 1,
                      "PinnedEmbedding.apply_gradients", sorted_unique, updated_rows);
  ++step_;  // only once the step went through
}

template <typename Fill>
void PinnedEmbedding::fill_by_chunks(std::optional<int64_t> seed, Fill&& fill) {
  wait_for_uva_conflicts(table_.storage().data(), UvaAccess::kWrite);
  const uint64_t base = seed.has_value() ? static_cast<uint64_t>(*seed) : default_generator_seed();
  const int64_t rows = table_.size(0);
  const int64_t chunks = (rows + kInitChunkRows - 1) / kInitChunkRows;
  // One generator per chunk, seeded from (seed, chunk): the result does not depend on how chunks meet threads.
  at::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(base + 0x9E3779B97F4A7C15ull * (c + 1));
      const int64_t first = c * kInitChunkRows;
      at::Tensor part = table_.narrow(0, first, std::min(kInitChunkRows, rows - first));
      fill(part, gen);
    }
  });
}

void PinnedEmbedding::zero_() {
  WriteLock write(lock_);
  check_writable("zero_");
  write_back_cache(true);
  wait_for_uva_conflicts(table_.storage().data(), UvaAccess::kWrite);
  table_.zero_();
}

void PinnedEmbedding::uniform_(double low, double high, std::optional<int64_t> seed) {
  WriteLock write(lock_);
  check_writable("uniform_");
  write_back_cache(true);
  TORCH_CHECK(low <= high, "PinnedEmbedding.uniform_: low (", low, ") must be <= high (", high, ")");
  fill_by_chunks(seed, [&](at::Tensor& part, at::Generator& gen) { part.uniform_(low, high, gen); });
}

void PinnedEmbedding::normal_(double mean, double std, std::optional<int64_t> seed) {
  WriteLock write(lock_);
  check_writable("normal_");
  write_back_cache(true);
  TORCH_CHECK(std >= 0, "PinnedEmbedding.normal_: std must be >= 0, got ", std);
  fill_by_chunks(seed, [&](at::Tensor& part, at::Generator& gen) { part.normal_(mean, std, gen); });
}

void PinnedEmbedding::copy_(const at::Tensor& src) {
  WriteLock write(lock_);
  check_writable("copy_");
  write_back_cache(true);
  TORCH_CHECK(src.sizes() == table_.sizes(), "PinnedEmbedding.copy_: src must have shape ", table_.sizes(), ", got ",
              src.sizes());
  TORCH_CHECK(at::isFloatingType(src.scalar_type()), "PinnedEmbedding.copy_: src must be floating point, got ",
              src.scalar_type());
  wait_for_uva_conflicts(table_.storage().data(), UvaAccess::kWrite);
  table_.copy_(src);  // a GPU source is copied by DMA straight into the pinned rows
}

PinnedEmbedding::~PinnedEmbedding() {
  if (!cache_ || !table_buffer_ || table_buffer_->mapping() != FileMapping::kReadWrite) return;
  try {
    write_back_cache(false);
  } catch (const std::exception& e) {  // a destructor must not throw; the files keep what they had
    std::fprintf(stderr, "speedtorch: PinnedEmbedding: writing the row cache back to %s failed: %s\n",
                 table_buffer_->path().c_str(), e.what());
  }
}

void PinnedEmbedding::write_back_cache(bool empty) const {
  if (cache_) cache_->flush(table_, state_, empty);
}

void PinnedEmbedding::enable_cache(int64_t num_rows, at::Device device) {
  WriteLock write(lock_);
  TORCH_CHECK(num_rows >= 1, "PinnedEmbedding.enable_cache: num_rows (rows the cache holds) must be >= 1, got ",
              num_rows, "; disable_cache() removes a cache");
  write_back_cache(true);
  cache_.reset();
  cache_ = std::make_shared<RowCache>(num_rows, device, table_, state_);
}

void PinnedEmbedding::disable_cache() {
  WriteLock write(lock_);
  write_back_cache(true);
  cache_.reset();
}

int64_t PinnedEmbedding::cache_slots() const {
  ReadLock read(lock_);
  return cache_ ? cache_->slots() : 0;
}

int64_t PinnedEmbedding::cached_rows() const {
  ReadLock read(lock_);
  return cache_ ? cache_->cached_rows() : 0;
}

void PinnedEmbedding::flush_cache() const {
  ReadLock read(lock_);
  write_back_cache(false);
}

}  // namespace speedtorch
