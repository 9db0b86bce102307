"""``speedtorch.nn.HostEmbedding``: a drop-in for ``nn.Embedding`` / ``nn.EmbeddingBag`` whose table and optimizer
state live in a :class:`speedtorch.PinnedEmbedding` in pinned host RAM (or, by ``placement``, in GPU memory, or split:
the hottest rows on the GPU and the rest in host RAM; speedtorch/placement.py).

Forward gathers the batch's distinct rows to the compute device; backward yields one summed gradient per distinct
row (so the update tells the op its ids are torch.unique's, ``sorted_unique=True``, and the op does not de-duplicate
them again: it only checks them); the update runs fused on the host-resident rows and their state
(``speedtorch::row_optimizer_step_``), either inside backward (``update="backward"``, as FBGEMM's TBE does) or at an
explicit :meth:`HostEmbedding.step`. The rest of the model keeps its ordinary torch optimizer. Only the batch's rows
ever occupy GPU memory.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F

from . import PinnedEmbedding
from .ops import check_indices
from .placement import DeviceTable, HybridTable
from .table_state import (adopt_options, checked_extra_state, copy_table_entries, entry_shapes, load_table_entries,
                          set_table_extra_state, table_entries, table_extra_state)
from .table_state import track_table_state  # noqa: F401  (speedtorch.nn.track_table_state)

__all__ = ["HostEmbedding", "HostEmbeddingBagCollection", "NgramHashEmbedding", "TableConfig", "track_table_state"]


class _HostRows(torch.autograd.Function):
    """Rows of the table for distinct ids; backward hands their gradient to the module instead of to a leaf."""

    @staticmethod
    def forward(ctx, anchor, module, unique, rows):
        ctx.module = module
        ctx.unique = unique
        return rows

    @staticmethod
    def backward(ctx, grad_rows):
        ctx.module._receive_gradient(ctx.unique, grad_rows)
        return None, None, None, None


class HostEmbedding(torch.nn.Module):
    """An embedding table of ``num_embeddings x embedding_dim`` in pinned host memory, trained by a fused optimizer.

    Args:
        num_embeddings, embedding_dim: table size.
        mode: ``None`` for ``nn.Embedding`` behaviour, ``"sum"`` or ``"mean"`` for ``nn.EmbeddingBag``.
        optimizer: ``"sgd"``, ``"adagrad"``, ``"adam"``, ``"adamw"``, ``"adamax"``, ``"rmsprop"``, ``"adadelta"``,
            ``"asgd"`` or ``"rprop"`` (torch.optim's math, applied lazily to the touched rows), or
            ``"rowwise_adagrad"`` (FBGEMM's row-wise Adagrad: one float of state per row; options ``lr``, ``eps``
            (1e-8), ``weight_decay``, ``initial_accumulator_value``), or ``"rowwise_adam"`` (FBGEMM's partial
            row-wise Adam: Adam's first moment per element, its second one float per row; options ``lr``,
            ``beta1``, ``beta2``, ``eps``, ``weight_decay``).
        optimizer_options: torch.optim's hyper-parameters by name (``betas`` as ``beta1``/``beta2``; booleans as
            0/1), e.g. ``{"lr": 1e-3, "weight_decay": 0.0}``; ``per_row_step=1`` for per-row bias correction.
        update: ``"step"`` (gradients wait for :meth:`step`) or ``"backward"`` (applied as backward reaches the rows).
        device: where forward's output lives (default: the current CUDA device when there is one, else the CPU).
            ``model.to(...)``, ``.cuda()``, ``.cpu()`` and ``.half()`` / ``.float()`` / ... change the device and
            dtype forward returns, never the table's memory or dtype (see ``_apply`` below).
        dtype: table dtype (float32, float16, bfloat16); optimizer state is float32.
        state_beside_rows: keep each row's optimizer state next to it in host memory (one page walk per row).
            False keeps it in a table of its own: gathers of many spread rows run up to 1.6x faster; on the
            training benchmark the two layouts are within 6% of each other (bench/RESULTS.md, runs 25-30).
        init_std: the table starts as N(0, init_std^2) (nn.Embedding's N(0, 1) by default).
        seed: seed of that initialisation (default: from torch's generator). The values depend on the placement.
        placement: ``"host"`` (pinned host RAM, the default), ``"gpu"`` (table and state in ``device`` memory: the
            fastest when they fit) or ``"hybrid"`` (every row in pinned host RAM, the most recently used ones and
            their state also in a row cache in ``device`` memory: :meth:`speedtorch.PinnedEmbedding.enable_cache`).
            The API and the math are the same for all three, bit for bit.
        cache_rows: for ``"hybrid"``: how many rows the cache holds (at least; whole sets of 32).
        hot_fraction: for ``"hybrid"`` without ``cache_rows``: the cache's size as a share of the rows.
        hot_rows: for ``"hybrid"`` without ``cache_rows`` or ``hot_fraction``: ids to load into the cache first (its
            size is their count); afterwards the cache follows the ids used (least recently used rows leave).
        table: an existing table to wrap instead of a new one (a :class:`speedtorch.PinnedEmbedding`, e.g. from
            :meth:`PinnedEmbedding.load` or :meth:`PinnedEmbedding.open`, or a placement table); its optimizer, if
            configured, is kept, and it is not re-initialised.
    """

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        *,
        mode: Optional[str] = None,
        optimizer: str = "adam",
        optimizer_options: Optional[dict] = None,
        update: str = "step",
        device: Optional[torch.device | str] = None,
        dtype: torch.dtype = torch.float32,
        state_beside_rows: bool = True,
        init_std: float = 1.0,
        seed: Optional[int] = None,
        placement: str = "host",
        hot_rows: Optional[torch.Tensor] = None,
        hot_fraction: Optional[float] = None,
        cache_rows: Optional[int] = None,
        table=None,
    ):
        super().__init__()
        if placement not in ("host", "gpu", "hybrid"):
            raise ValueError(f"HostEmbedding: placement must be 'host', 'gpu' or 'hybrid', got {placement!r}")
        if mode not in (None, "sum", "mean"):
            raise ValueError(f"HostEmbedding: mode must be None, 'sum' or 'mean', got {mode!r}")
        if update not in ("step", "backward"):
            raise ValueError(f"HostEmbedding: update must be 'step' or 'backward', got {update!r}")
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.mode = mode
        self.update = update
        if device is None:
            device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        self.placement = placement
        if table is not None:
            if (table.num_rows(), table.dim()) != (num_embeddings, embedding_dim):
                raise ValueError(f"HostEmbedding: the table is {table.num_rows()} x {table.dim()}, expected "
                                 f"{num_embeddings} x {embedding_dim}")
            if placement == "gpu" and not isinstance(table, DeviceTable):
                raise ValueError("HostEmbedding: placement='gpu' wraps a speedtorch.placement.DeviceTable")
            self.table = table
            if not table.optimizer():
                table.set_optimizer(optimizer, {k: float(v) for k, v in (optimizer_options or {}).items()},
                                    state_beside_rows and table.mapping() == "")
        else:
            if placement == "gpu":
                self.table = DeviceTable(num_embeddings, embedding_dim, dtype, self.device)
            else:
                self.table = PinnedEmbedding(num_embeddings, embedding_dim, dtype)
            options = {k: float(v) for k, v in (optimizer_options or {}).items()}
            # Optimizer first, while the table is still empty: its rows move into the new layout cheaply.
            self.table.set_optimizer(optimizer, options, state_beside_rows)
            self.table.normal_(0.0, init_std, seed)
        if placement == "hybrid" and not isinstance(self.table, HybridTable):
            if isinstance(self.table, DeviceTable):
                raise ValueError("HostEmbedding: placement='hybrid' needs a speedtorch.PinnedEmbedding table")
            self.table.enable_cache(_cache_size(num_embeddings, cache_rows, hot_rows, hot_fraction), self.device)
            if hot_rows is not None:
                self.set_hot_rows(hot_rows)
        # What forward returns its rows as: the table's dtype until a conversion (model.half(), ...) changes it.
        self.output_dtype = self.table.table().dtype
        # Autograd only runs a Function's backward when an input needs a gradient: this empty tensor is that input
        # (requires_grad_(False) on this module clears it: the table is then frozen).
        self._anchor = torch.zeros(0, requires_grad=True)
        self._pending: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._prefetched = None
        self._updated_since_prefetch: list[torch.Tensor] = []
        self._side_stream = None

    def extra_repr(self) -> str:
        converted = "" if self.output_dtype == self.table.table().dtype else f", output_dtype={self.output_dtype}"
        return (f"{self.num_embeddings}, {self.embedding_dim}, mode={self.mode}, optimizer={self.table.optimizer()}, "
                f"update={self.update}, device={self.device}, placement={self.placement}{converted}")

    # --- nn.Module's conversions and other methods --------------------------------------------------------------
    # model.to(...), .cuda(), .cpu(), .float(), .half(), .bfloat16(), .double(), .type() and .to_empty() reach this
    # module through nn.Module._apply(fn), which converts parameters and buffers with fn. The module has neither: its
    # rows and optimizer state stay where the placement put them (pinned host RAM; the device of placement="gpu"),
    # in the dtype chosen at construction, because copying or re-typing a table that may be larger than any GPU is
    # what it exists to avoid. A conversion changes what forward computes with instead: fn applied to an empty tensor
    # of forward's device and dtype gives the new ones, forward then returns its rows there (gathered to that device,
    # then cast), and their gradients come back through the cast to update the table in its own dtype.
    # model.share_memory() raises unless the rows are already shared between processes (DistributedHostEmbedding):
    # a process started afterwards would train a copy, and its updates would be lost.

    #: Whether the rows already live in memory that other processes share (DistributedHostEmbedding's /dev/shm).
    _rows_shared_between_processes = False

    def _apply(self, fn, recurse=True):
        converted = fn(torch.empty(0, dtype=self.output_dtype, device=self.device))
        on_host = fn(torch.empty(1))
        if on_host.device.type == "cpu" and on_host.is_shared() and not self._rows_shared_between_processes:
            raise RuntimeError(
                f"{type(self).__name__}: share_memory() cannot share this table: its rows live in this process's "
                "pinned memory, so a process started afterwards would train a copy and its updates would be lost. "
                "To train one table from several processes use speedtorch.distributed.DistributedHostEmbedding (one "
                "copy per host, in /dev/shm)")
        self.device = converted.device
        self.output_dtype = converted.dtype
        return super()._apply(fn, recurse)

    def requires_grad_(self, requires_grad: bool = True) -> "HostEmbedding":
        """Freezes (``False``) or unfreezes the table: while frozen, forward's rows need no gradient and no update
        reaches the table. Call it on this module: ``model.requires_grad_()`` walks ``model.parameters()``, and the
        table is not a parameter (so that DDP and the dense optimizer leave it alone)."""
        self._anchor.requires_grad_(requires_grad)
        return super().requires_grad_(requires_grad)

    # --- forward / backward -------------------------------------------------------------------------------------

    def forward(self, input: torch.Tensor, offsets: Optional[torch.Tensor] = None,
                per_sample_weights: Optional[torch.Tensor] = None) -> torch.Tensor:
        if self.mode is None and (offsets is not None or per_sample_weights is not None):
            raise ValueError("HostEmbedding: offsets and per_sample_weights need mode='sum' or 'mean'")
        unique, inverse, rows = self._rows_for(input)
        if torch.is_grad_enabled():
            rows = _HostRows.apply(self._anchor, self, unique, rows)
        rows = rows.to(self.output_dtype)  # a no-op unless a conversion (model.half(), ...) chose another dtype
        if self.mode is None:
            if rows.device.type == "cpu":
                # The same rows; its backward (index_add_ into the distinct rows) runs 2.3x faster on the CPU than
                # embedding's, which walks every index with a TensorIterator per row (bench/RESULTS.md, CPU runs).
                return rows.index_select(0, inverse.reshape(-1)).reshape(*inverse.shape, rows.shape[-1])
            return F.embedding(inverse, rows)
        if offsets is not None:
            offsets = offsets.to(self.device)
        if per_sample_weights is not None:
            per_sample_weights = per_sample_weights.to(self.device)
        return F.embedding_bag(inverse, rows, offsets, mode=self.mode, per_sample_weights=per_sample_weights)

    def _rows_for(self, input: torch.Tensor):
        if self._prefetched is not None and self._prefetched[0] is input:
            return self._take_prefetched()
        ids = input.to(self.device, non_blocking=True)
        unique, inverse = torch.unique(ids, sorted=True, return_inverse=True)
        try:
            return unique, inverse, self.table.gather(unique, self.device)
        except IndexError:  # it names a position among the distinct ids: name the caller's instead
            named = _out_of_range_in(ids, self.num_embeddings, type(self).__name__)
            if named is None:
                raise
            raise named from None

    def _receive_gradient(self, unique: torch.Tensor, grad_rows: torch.Tensor) -> None:
        if self.update == "backward":
            self._apply_gradients(unique, grad_rows, sorted_unique=True)
        else:
            self._pending.append((unique, grad_rows))

    def _apply_gradients(self, unique: torch.Tensor, grad_rows: torch.Tensor, sorted_unique: bool = False) -> None:
        # sorted_unique: `unique` is one forward's torch.unique(sorted=True) output, so the op need not de-duplicate
        # it again (it still checks the claim).
        self.table.apply_gradients(unique, grad_rows, sorted_unique)
        if self._prefetched is not None:
            self._updated_since_prefetch.append(unique)

    # --- optimizer -------------------------------------------------------------------------------------------------

    @torch.no_grad()
    def step(self) -> None:
        """Applies the gradients of every backward since the last step in one fused update (a row reached by several
        backward passes gets the sum of their gradients). Nothing to do with ``update="backward"``."""
        if not self._pending:
            return
        one_backward = len(self._pending) == 1
        if one_backward:
            unique, grad = self._pending[0]
        else:  # rows reached by several backward passes repeat: the op sums them
            unique = torch.cat([u for u, _ in self._pending])
            grad = torch.cat([g for _, g in self._pending])
        self._pending.clear()
        self._apply_gradients(unique, grad, sorted_unique=one_backward)

    def zero_grad(self, set_to_none: bool = True) -> None:  # noqa: ARG002 (nn.Module's signature)
        """Drops gradients not yet applied by :meth:`step`. ``model.zero_grad()`` on a model holding this module does
        not call it (nn.Module's walks the parameters): :meth:`step` consumes the gradients it applies."""
        self._pending.clear()

    # --- prefetch -------------------------------------------------------------------------------------------------

    def prefetch(self, next_input: torch.Tensor) -> None:
        """Starts gathering the rows of the next batch on a side stream while this step computes. Pass the same
        tensor object to the next forward. Rows that this step's update changes after the prefetch read them are
        gathered again at that forward, on the current stream, so nothing stale is used."""
        if self.device.type != "cuda":
            self._prefetched = (next_input, *self._rows_for(next_input))
            self._updated_since_prefetch = []
            return
        if self._side_stream is None:
            self._side_stream = torch.cuda.Stream(self.device)
        current = torch.cuda.current_stream(self.device)
        self._side_stream.wait_stream(current)
        self._prefetched = None
        with torch.cuda.stream(self._side_stream):
            unique, inverse, rows = self._rows_for(next_input)
            ready = torch.cuda.Event()
            ready.record(self._side_stream)
        for t in (unique, inverse, rows):
            t.record_stream(current)
        # The side stream may still be reading the table's device tensors (a hybrid table's hot rows) after this
        # returns, and may have made new ones there (_refresh_hot_rows) that the current stream then uses: whichever
        # stream frees them, the caching allocator must reuse their memory only once both streams are done.
        if hasattr(self.table, "record_stream"):
            self.table.record_stream(self._side_stream)
            self.table.record_stream(current)
        self._prefetched = (next_input, unique, inverse, rows, ready)
        self._updated_since_prefetch = []

    def _take_prefetched(self):
        _, unique, inverse, rows, *ready = self._prefetched
        self._prefetched = None
        if ready:
            current = torch.cuda.current_stream(self.device)
            current.wait_event(ready[0])
            for t in (unique, inverse, rows):  # prefetch() may have been called on another stream than this one
                t.record_stream(current)
        if self._updated_since_prefetch:
            updated = torch.cat(self._updated_since_prefetch)
            self._updated_since_prefetch = []
            stale = torch.isin(unique, updated).nonzero().squeeze(1)
            if stale.numel():
                rows = rows.clone()
                rows[stale] = self.table.gather(unique[stale], self.device)
        return unique, inverse, rows

    def distinct_rows(self, input: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(inverse, rows)``: the distinct rows ``input`` names (in id order, on :attr:`device`; the prefetched
        ones if :meth:`prefetch` was given this very tensor) and where each id's row is (``input == ids[inverse]``).
        Backward through ``rows`` yields one gradient per distinct row, applied as ``update`` says. forward's part
        before pooling; :class:`speedtorch.HostEmbeddingBagCollection` pools them itself."""
        unique, inverse, rows = self._rows_for(input)
        if torch.is_grad_enabled():
            rows = _HostRows.apply(self._anchor, self, unique, rows)
        return inverse, rows

    # --- placement ---------------------------------------------------------------------------------------------

    def update_hot_rows(self) -> None:
        """For a wrapped :class:`speedtorch.placement.HybridTable` chosen by frequency: re-chooses its
        device-resident rows now. The row cache of ``placement="hybrid"`` needs no such call (it follows the ids)."""
        table = self._hybrid("update_hot_rows")
        if not isinstance(table, HybridTable):
            raise RuntimeError("HostEmbedding.update_hot_rows: the row cache follows the ids used by itself (least "
                               "recently used rows leave); there is nothing to re-choose. set_hot_rows(ids) loads "
                               "rows into it")
        table.update_hot_rows()

    @torch.no_grad()
    def set_hot_rows(self, ids: torch.Tensor) -> None:
        """``placement="hybrid"``: loads the rows ``ids`` into the row cache now (their weights; a row's optimizer state
        follows at its first update). They may leave later, least recently used first, and a row whose set (32 ways,
        by a hash of its id) is already full of the given rows stays on the host. For a wrapped HybridTable: makes
        ``ids`` its device-resident rows."""
        table = self._hybrid("set_hot_rows")
        if isinstance(table, HybridTable):
            table.set_hot_rows(ids)
            return
        ids = torch.as_tensor(ids)
        check_indices(ids, self.num_embeddings, "HostEmbedding.set_hot_rows", "hot row ids")
        ids = torch.unique(ids.to(self.device, torch.int64))
        if ids.numel() > table.cache_slots():
            raise ValueError(f"HostEmbedding.set_hot_rows: {ids.numel()} rows given, the cache has room for "
                             f"{table.cache_slots()}")
        table.gather(ids, self.device)

    def _hybrid(self, what: str):
        if self.placement != "hybrid":
            raise RuntimeError(f"HostEmbedding.{what}: only for placement='hybrid' (this one is {self.placement!r})")
        return self.table

    # --- persistence -------------------------------------------------------------------------------------------

    # state_dict: the table, its optimizer state and step count, sharing the table's memory, and the optimizer as
    # extra state (speedtorch/table_state.py); load_state_dict writes them back in place.

    def _table_tensors(self) -> dict:
        """The state_dict entries (name -> tensor); subclasses may return other tensor types (DTensor)."""
        return table_entries(self.table)

    def get_extra_state(self) -> dict:
        return table_extra_state(self.table)

    def set_extra_state(self, state) -> None:
        set_table_extra_state(self.table, state, type(self).__name__)

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        self._sync_for_host_access()
        for name, value in self._table_tensors().items():
            destination[prefix + name] = value

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        # All or nothing, as nn.Module's: the extra state (optimizer options) and every entry are checked before
        # anything changes; the options are adopted only then (they re-lay the optimizer state out).
        extra = prefix + "_extra_state"
        targets = self._table_tensors()
        ours = {prefix + name for name in targets} | {extra}
        rest = {k: v for k, v in state_dict.items() if k not in ours}
        super()._load_from_state_dict(rest, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)  # strict: reports the extra state missing, as it is from `rest`
        options = None
        if extra in state_dict:
            if extra in missing_keys:
                missing_keys.remove(extra)
            options = checked_extra_state(self.table, state_dict[extra], type(self).__name__)
        found = load_table_entries(entry_shapes(targets, self.table, options), state_dict, prefix, missing_keys,
                                   error_msgs, type(self).__name__)
        if found is None or error_msgs or extra in missing_keys:
            return  # nothing is written unless every entry fits
        self._sync_for_host_access()
        adopt_options(self.table, options)
        self._copy_table_tensors(found)
        self._pending.clear()
        self._prefetched = None

    def _copy_table_tensors(self, found: dict) -> None:
        copy_table_entries(self.table, found)

    def _sync_for_host_access(self) -> None:
        # Updates still running on the GPU must land before the host rows are handed out or overwritten.
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()


    @property
    def weight(self) -> torch.Tensor:
        """The table (num_embeddings x embedding_dim; shares memory): pinned host memory for ``"host"`` and
        ``"hybrid"`` (the device-resident rows written back first; while it is held, the row cache stands aside, so
        it stays exact: docs/persistence.md), device memory for ``"gpu"``. Synchronize before reading it on the host
        while updates may be running."""
        return self.table.table()

    def save(self, path: str) -> None:
        """Writes the rows, the optimizer state and its configuration to ``path`` (+ ``.state.npy`` and
        ``.meta.json``; docs/persistence.md), whatever the placement: files NumPy reads, written atomically.
        Gradients waiting for :meth:`step` are not part of it."""
        self.table.save(str(path))

    @classmethod
    def load(cls, path: str, *, mmap_mode: Optional[str] = None, verify: bool = True, placement: str = "host",
             **kwargs) -> "HostEmbedding":
        """A HostEmbedding over the files of :meth:`save` (or :meth:`PinnedEmbedding.save`, or a plain 2-D .npy of
        rows), with their optimizer, options, state and step count; ``kwargs`` as the constructor's (mode, update,
        device, hot_rows, ...). ``mmap_mode`` (``"r"``, ``"r+"``, ``"c"``; host placement) maps the files instead of
        reading them (:meth:`PinnedEmbedding.open`)."""
        path = str(path)
        if placement == "gpu":
            if mmap_mode is not None:
                raise ValueError("HostEmbedding.load: mmap_mode needs placement='host' or 'hybrid'")
            device = kwargs.get("device") or ("cuda" if torch.cuda.is_available() else "cpu")
            table = DeviceTable.load(path, device, verify)
        elif mmap_mode is not None:
            table = PinnedEmbedding.open(path, mmap_mode)
        else:
            table = PinnedEmbedding.load(path, verify)
        return cls(table.num_rows(), table.dim(), table=table, placement=placement, **kwargs)


def _out_of_range_in(ids: torch.Tensor, num_rows: int, owner: str) -> Optional[IndexError]:
    """The library's error (speedtorch.ops.check_indices) for the first id of ``ids`` (the caller's input) outside
    ``[0, num_rows)``, named by its place in ``ids``; None when every id is in range (the table's error was about
    something else)."""
    try:
        check_indices(ids, num_rows, owner, "input")
    except IndexError as error:
        return error
    return None


def _cache_size(num_rows: int, cache_rows: Optional[int], hot_rows: Optional[torch.Tensor],
                hot_fraction: Optional[float]) -> int:
    """How many rows the row cache of placement='hybrid' holds: cache_rows, else a share of the rows, else the
    count of hot_rows."""
    if cache_rows is not None:
        if int(cache_rows) < 1:
            raise ValueError(f"HostEmbedding: cache_rows must be >= 1, got {cache_rows!r}")
        return int(cache_rows)
    if hot_fraction is not None:
        if not 0.0 < hot_fraction <= 1.0:
            raise ValueError(f"HostEmbedding: hot_fraction must be in (0, 1], got {hot_fraction!r}")
        return max(1, math.ceil(hot_fraction * num_rows))
    if hot_rows is not None:
        return max(1, int(torch.unique(torch.as_tensor(hot_rows)).numel()))
    raise ValueError("HostEmbedding: placement='hybrid' needs the cache's size: cache_rows, hot_fraction in (0, 1] or "
                     "hot_rows (ids)")


# Built on HostEmbedding, so imported after it (these modules import this one).
from .embedding_collection import HostEmbeddingBagCollection, TableConfig  # noqa: E402  (many tables in one module)
from .ngram_embedding import NgramHashEmbedding  # noqa: E402
