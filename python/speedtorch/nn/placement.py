"""Where a :class:`speedtorch.nn.HostEmbedding` keeps its rows and optimizer state: the placements besides the
default pinned host table (a :class:`speedtorch.PinnedEmbedding`).

- :class:`DeviceTable` (``placement="gpu"``): table and state in device memory (the fastest when they fit).
- :class:`HybridTable`: the hottest rows (by training frequency, or a caller-given set) and
  their state in device memory, all rows in a pinned host table; a ``num_rows`` remap on the device routes each id.
  ``HostEmbedding(placement="hybrid")`` uses the C++ row cache instead (:meth:`PinnedEmbedding.enable_cache`:
  least recently used eviction, no host round trip per split); pass a HybridTable as its ``table=`` to use this one.

Both offer the part of PinnedEmbedding's API that HostEmbedding uses (``gather``, ``apply_gradients``, ``table``,
``state``, ``optimizer``, ``optimizer_options``, ``step_count``, ``save``, ``copy_``), so the module's code is the
same for all three placements. Updates are the fused ``speedtorch::row_optimizer_step_`` on whichever memory holds a
row, with one table-wide step count: a row gets the same update wherever it lives.
"""

from __future__ import annotations

import contextlib
import math
from typing import Optional

import torch

from .._library import PinnedEmbedding
from ..counters import record_cache_lookups
from ..ops import check_indices

__all__ = ["DeviceTable", "HybridTable"]


def _sync_stream(device: torch.device) -> None:
    # Host-side work on the pinned table must not race copies the stream still runs into it (one stream, not the
    # whole device).
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


class DeviceTable:
    """A ``num_rows x dim`` table and its optimizer state in ``device`` memory (a CUDA device, or the CPU)."""

    def __init__(self, num_rows: int, dim: int, dtype: torch.dtype = torch.float32, device="cuda"):
        if dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise ValueError(f"DeviceTable: dtype must be float32, float16 or bfloat16, got {dtype}")
        self.device = torch.device(device)
        self._table = torch.zeros(num_rows, dim, dtype=dtype, device=self.device)
        self._state: Optional[torch.Tensor] = None
        self._optimizer = ""
        self._options: dict[str, float] = {}
        self._step = 0

    # --- PinnedEmbedding's API ---------------------------------------------------------------------------------

    def num_rows(self) -> int:
        """Rows of the table."""
        return self._table.shape[0]

    def dim(self) -> int:
        """Width of a row."""
        return self._table.shape[1]

    def nbytes(self) -> int:
        """Bytes of the rows and the optimizer state (float32), in device memory."""
        state = 0 if self._state is None else self._state.numel() * 4
        return self._table.numel() * self._table.element_size() + state

    def table(self) -> torch.Tensor:
        """The ``num_rows x dim`` table tensor itself, in device memory (writes through it change the table)."""
        return self._table

    def mapping(self) -> str:
        """``""``: not a mapped file (PinnedEmbedding's ``mapping()`` names one)."""
        return ""

    def state(self) -> Optional[torch.Tensor]:
        """The optimizer state, ``num_rows x state_width`` float32 in device memory, or None before
        :meth:`set_optimizer`."""
        return self._state

    def optimizer(self) -> str:
        """The fused optimizer's canonical name, or ``""`` without one."""
        return self._optimizer

    def optimizer_options(self) -> dict[str, float]:
        """The optimizer's hyper-parameters, by name (a copy)."""
        return dict(self._options)

    def step_count(self) -> int:
        """Optimizer steps taken (the table-wide count the updates use)."""
        return self._step

    def set_step_count(self, step: int) -> None:
        """Sets the step count (a checkpoint's)."""
        self._step = int(step)

    def set_optimizer(self, kind: str, options: dict, state_beside_rows: bool = True) -> None:  # noqa: ARG002
        """Chooses the fused optimizer ``kind`` with ``options`` (checked as PinnedEmbedding checks them) and starts its
        state at zero and the step count at 0. ``state_beside_rows`` is accepted for PinnedEmbedding's signature; the
        state is a tensor of its own here."""
        options = {k: float(v) for k, v in options.items()}
        width = PinnedEmbedding.state_width(kind, options, self.dim())  # validates the name and options
        self._state = torch.zeros(self.num_rows(), width, dtype=torch.float32, device=self.device)
        # The name every placement reports and every checkpoint records (C++'s, one rule for all).
        self._optimizer = PinnedEmbedding.canonical_optimizer_name(kind)
        self._options, self._step = options, 0

    def set_optimizer_options(self, options: dict) -> None:
        """Changes the hyper-parameters in place, state and step count kept (PinnedEmbedding's rule)."""
        if not self._optimizer:
            raise RuntimeError("DeviceTable.set_optimizer_options: no optimizer; call set_optimizer(kind, options) "
                               "first")
        options = {k: float(v) for k, v in options.items()}
        width = PinnedEmbedding.state_width(self._optimizer, options, self.dim())  # validates them
        if width != self._state.shape[1]:
            raise RuntimeError(f"DeviceTable.set_optimizer_options: these options change the layout of "
                               f"{self._optimizer}'s state ({self._state.shape[1]} floats a row now, {width} with "
                               f"them); call set_optimizer(kind, options), which starts the state afresh")
        self._options = options

    def gather(self, indices: torch.Tensor, device=None) -> torch.Tensor:
        """Rows for ``indices`` (any shape), shaped ``indices.shape + (dim,)``, on ``device`` (default: the indices');
        bad indices raise IndexError."""
        return torch.ops.speedtorch.gather(self._table, indices, None if device is None else torch.device(device))

    def scatter_(self, indices: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
        """Writes ``src`` (``indices.shape + (dim,)``) into those rows (a repeated id: its last row wins); returns the
        table."""
        return torch.ops.speedtorch.scatter_(self._table, indices, src)

    def apply_gradients(self, indices: torch.Tensor, grad: torch.Tensor, sorted_unique: bool = False) -> None:
        """One step of the fused optimizer on the rows ``indices`` with their gradients ``grad`` (moved to the table's
        device); ``sorted_unique`` says the ids are sorted and distinct already. Raises without an optimizer."""
        if self._state is None:
            raise RuntimeError("DeviceTable.apply_gradients: no optimizer; call set_optimizer(kind, options) first")
        # The table stays where it was built while a module's forward may have moved (model.cuda() on a table
        # built on the CPU): its gradients come back to the table's device.
        indices, grad = indices.to(self._table.device), grad.to(self._table.device)
        torch.ops.speedtorch.row_optimizer_step_(self._table, self._state, indices, grad, self._optimizer,
                                                 self._options, self._step + 1, sorted_unique)
        self._step += 1

    def normal_(self, mean: float, std: float, seed: Optional[int] = None) -> None:
        """Fills the table with N(mean, std^2) values, in place; ``seed`` makes them reproducible."""
        generator = None
        if seed is not None:
            generator = torch.Generator(self.device).manual_seed(seed)
        self._table.normal_(mean, std, generator=generator)

    def uniform_(self, low: float, high: float, seed: Optional[int] = None) -> None:
        """Fills the table with U(low, high) values, in place; ``seed`` makes them reproducible."""
        if not low <= high:
            raise ValueError(f"DeviceTable.uniform_: low ({low}) must be <= high ({high})")
        generator = None
        if seed is not None:
            generator = torch.Generator(self.device).manual_seed(seed)
        self._table.uniform_(low, high, generator=generator)

    def record_stream(self, stream) -> None:
        """Marks the table and state as used on ``stream`` (Tensor.record_stream), for work queued there on them."""
        for t in (self._table, self._state):
            if t is not None and t.is_cuda:
                t.record_stream(stream)

    def copy_(self, src: torch.Tensor) -> None:
        """Copies ``src`` (``num_rows x dim``, any device and floating dtype) into the table."""
        if tuple(src.shape) != tuple(self._table.shape):
            raise RuntimeError(f"DeviceTable.copy_: src must have shape {tuple(self._table.shape)}, got "
                               f"{tuple(src.shape)}")
        self._table.copy_(src)

    def save(self, path: str) -> None:
        """The files of :meth:`speedtorch.PinnedEmbedding.save` (rows, state, meta), copied down in chunks."""
        torch.ops.speedtorch.save_embedding_files(self._table, self._state, self._optimizer, self._options,
                                                  self._step, str(path))

    @classmethod
    def load(cls, path: str, device="cuda", verify: bool = True) -> "DeviceTable":
        """A table read from :meth:`save`'s (or PinnedEmbedding's) files, streamed to ``device`` in chunks."""
        (rows, dim), dtype, optimizer, options, step, _ = torch.ops.speedtorch.read_embedding_meta(str(path))
        out = cls(rows, dim, getattr(torch, dtype), device)
        if optimizer:
            out.set_optimizer(optimizer, options)
        torch.ops.speedtorch.load_embedding_files_(out._table, out._state, str(path), verify)
        out._step = step
        return out


class HybridTable:
    """All rows and their state in a pinned host table, the hottest ``num_hot`` of them in ``device`` memory.

    A row lives in one place at a time: ``remap[id]`` is its slot on the device, or -1. Hot rows are the caller's
    ``hot_rows``, or (``hot_rows=None``) the rows updated most often, counted on the device and re-chosen every
    ``refresh`` updates and at :meth:`update_hot_rows`. Moving rows writes the leaving ones (rows and state) back to
    the host table and gathers the arriving ones. While rows are on the device the host copies are stale:
    :meth:`table`, :meth:`state` and :meth:`save` write them back first. :meth:`table` / :meth:`state` hand out the
    host rows, as the row cache of ``placement="hybrid"`` does (:meth:`speedtorch.PinnedEmbedding.enable_cache`),
    and by the same mechanism: while the caller holds such a tensor (``host.host_rows_in_use()``) every row is read
    and updated in the host table, so reads and writes through it are exact; once it is dropped, the next row
    operation gathers the hot rows from the host table again.

    Each :meth:`gather` adds its hot ids to ``speedtorch.stats()["cache_hits"]`` and the others to ``cache_misses``.
    """

    def __init__(self, host: PinnedEmbedding, device, num_hot: int, hot_rows: Optional[torch.Tensor] = None,
                 refresh: int = 1000):
        if host.state() is None:
            raise RuntimeError("HybridTable: configure the host table's optimizer (set_optimizer) first")
        self.host = host
        self.device = torch.device(device)
        self.num_hot = max(0, min(int(num_hot), host.num_rows()))
        self.refresh = int(refresh)
        # remap is the middle of _route, whose two extra -1 entries (cold) take the ids out of range: those go to
        # the host table, whose check (the library's one rule) refuses them before any row is touched (_refusing).
        self._route = torch.full((host.num_rows() + 2,), -1, dtype=torch.int32, device=self.device)
        self.remap = self._route[1:-1]
        self.hot_ids = torch.empty(0, dtype=torch.int64, device=self.device)
        self.hot_table = torch.empty(0, host.dim(), dtype=host.table().dtype, device=self.device)
        self.hot_state = torch.empty(0, host.state().shape[1], dtype=torch.float32, device=self.device)
        self.counts = None if hot_rows is not None else torch.zeros(host.num_rows(), dtype=torch.int32,
                                                                      device=self.device)
        self._updates = 0
        self._device_rows_stale = False  # the host rows were handed out since the device copies were made
        if hot_rows is not None:
            self.set_hot_rows(hot_rows)

    # --- placement --------------------------------------------------------------------------------------------

    @torch.no_grad()
    def set_hot_rows(self, ids: torch.Tensor) -> None:
        """Makes ``ids`` (distinct row ids, at most ``num_hot`` of them) the device-resident rows."""
        check_indices(ids, self.host.num_rows(), "HybridTable.set_hot_rows", "hot row ids")
        ids = torch.unique(ids.to(self.device, torch.int64))
        if ids.numel() > self.num_hot:
            raise ValueError(f"HybridTable: {ids.numel()} hot rows given, room for {self.num_hot}")
        self.sync_to_host()
        self._device_rows_stale = False  # the host rows are current: the new hot rows are gathered from them
        self.remap[self.hot_ids] = -1
        self.hot_table = self.host.gather(ids, self.device)
        self.hot_state = torch.ops.speedtorch.gather(self.host.state(), ids, self.device)
        self.remap[ids] = torch.arange(ids.numel(), dtype=torch.int32, device=self.device)
        self.hot_ids = ids

    @torch.no_grad()
    def update_hot_rows(self) -> None:
        """Re-chooses the hot rows by update frequency (counts halve after each choice, so they follow drift)."""
        if self.counts is None:
            raise RuntimeError("HybridTable.update_hot_rows: the hot rows were given by the caller; call "
                               "set_hot_rows(ids) to change them")
        touched = int((self.counts > 0).sum())
        k = min(self.num_hot, touched)
        self.set_hot_rows(torch.topk(self.counts, k).indices if k else self.hot_ids[:0])
        self.counts.div_(2, rounding_mode="floor")

    @torch.no_grad()
    def sync_to_host(self) -> None:
        """Writes the device-resident rows and their state back to the host table (they stay on the device too),
        unless the host rows are the current ones (handed out since)."""
        if self.hot_ids.numel() == 0 or self._device_rows_stale:
            return
        self.host.scatter_(self.hot_ids, self.hot_table)
        torch.ops.speedtorch.scatter_(self.host.state(), self.hot_ids, self.hot_state)
        _sync_stream(self.device)

    # --- PinnedEmbedding's API ---------------------------------------------------------------------------------

    def num_rows(self) -> int:
        """Rows of the table (all in the host table)."""
        return self.host.num_rows()

    def dim(self) -> int:
        """Width of a row."""
        return self.host.dim()

    def nbytes(self) -> int:
        """Bytes of the host table (rows and state) plus the device-resident rows and their state."""
        return self.host.nbytes() + self.hot_table.numel() * self.hot_table.element_size() + self.hot_state.numel() * 4

    def optimizer(self) -> str:
        """The host table's optimizer (canonical name)."""
        return self.host.optimizer()

    def optimizer_options(self) -> dict[str, float]:
        """The optimizer's hyper-parameters, by name."""
        return self.host.optimizer_options()

    def step_count(self) -> int:
        """Optimizer steps taken (one count for the host and device rows)."""
        return self.host.step_count()

    def set_optimizer_options(self, options: dict) -> None:
        """Changes the hyper-parameters in place (PinnedEmbedding.set_optimizer_options): the device rows use the new
        ones from the next update."""
        self.host.set_optimizer_options(options)

    def set_step_count(self, step: int) -> None:
        """Sets the step count (a checkpoint's)."""
        self.host.set_step_count(step)

    def mapping(self) -> str:
        """The host table's mapping (the file it maps, or ``""``)."""
        return self.host.mapping()

    def table(self) -> torch.Tensor:
        """The host table, with the device-resident rows written back first; while the caller holds it, every row
        operation uses the host rows (see the class)."""
        self.sync_to_host()
        self._device_rows_stale = True
        return self.host.table()

    def state(self) -> torch.Tensor:
        """The host table's optimizer state, with the device-resident rows' state written back first; while the caller
        holds it, every row operation uses the host rows (see the class)."""
        self.sync_to_host()
        self._device_rows_stale = True
        return self.host.state()

    @torch.no_grad()
    def _device_rows_usable(self) -> bool:
        """Whether this row operation may use the device copies: not while the host rows are handed out; after
        that, once they are gathered again from the host rows (which the caller may have written)."""
        if self.host.host_rows_in_use():
            self._device_rows_stale = True  # whatever changes the host rows meanwhile, the device copies miss
            return False
        if self._device_rows_stale:
            _sync_stream(self.device)
            if self.hot_ids.numel():
                self.hot_table = self.host.gather(self.hot_ids, self.device)
                self.hot_state = torch.ops.speedtorch.gather(self.host.state(), self.hot_ids, self.device)
            self._device_rows_stale = False
        return True

    def _split(self, ids: torch.Tensor):
        usable = self._device_rows_usable()
        n = self.host.num_rows()
        # Clamped onto _route's ends, an id out of range reads -1 (cold; indexing past the remap would be a device
        # assert): the host table's row operation refuses it, and _refusing names it.
        slots = self._route[ids.clamp(-1, n) + 1]
        hot = (slots >= 0) & usable
        # One stable sort puts the cold positions first and the hot ones after; the split size comes back in one
        # sync.
        order = torch.sort(hot.to(torch.uint8), stable=True).indices
        cold_count = ids.numel() - int(hot.sum())
        return order[cold_count:], order[:cold_count], slots

    @contextlib.contextmanager
    def _refusing(self, indices: torch.Tensor):
        """The host table refuses an id out of range by its place among the cold ids: the library's rule
        (speedtorch.ops.check_indices) names the caller's place in ``indices`` instead."""
        try:
            yield
        except IndexError:
            try:
                check_indices(indices, self.host.num_rows(), "HybridTable")
            except IndexError as named:
                raise named from None
            raise  # every id is in range: the host's error was about something else

    def gather(self, indices: torch.Tensor, device=None) -> torch.Tensor:
        """Rows for ``indices`` (any shape), shaped ``indices.shape + (dim,)``, on ``device`` (default: the table's
        device): device-resident ones from device memory, the others from the host table. Counts cache hits and
        misses."""
        device = self.device if device is None else torch.device(device)
        ids = indices.to(self.device).reshape(-1)
        hot_pos, cold_pos, slots = self._split(ids)
        rows = torch.empty(ids.numel(), self.dim(), dtype=self.hot_table.dtype, device=device)
        if hot_pos.numel():
            rows[hot_pos.to(device)] = torch.ops.speedtorch.gather(self.hot_table, slots[hot_pos], device)
        if cold_pos.numel():
            with self._refusing(indices):
                rows[cold_pos.to(device)] = self.host.gather(ids[cold_pos], device)
        # The split's sizes are already on the host (_split synchronized once for them): counting adds no sync.
        record_cache_lookups(hot_pos.numel(), cold_pos.numel())
        return rows.reshape(*indices.shape, self.dim())

    def apply_gradients(self, indices: torch.Tensor, grad: torch.Tensor, sorted_unique: bool = False) -> None:
        """One step of the fused optimizer on the rows ``indices`` with their gradients ``grad``, each row updated where
        it lives (the host step first: it advances the table-wide step count and refuses bad ids before any row
        changes); counts updates for the choice of hot rows."""
        ids = indices.to(self.device).reshape(-1)
        grad = grad.reshape(ids.numel(), self.dim())
        hot_pos, cold_pos, slots = self._split(ids)
        # The host step goes first (empty or not): it advances the table-wide step count both parts use, and it
        # refuses an id out of range before either part is touched.
        # sorted_unique holds for both parts: the split keeps the order of positions, and slots follow id order.
        with self._refusing(indices):
            self.host.apply_gradients(ids[cold_pos], grad[cold_pos.to(grad.device)], sorted_unique)
        if hot_pos.numel():
            torch.ops.speedtorch.row_optimizer_step_(self.hot_table, self.hot_state, slots[hot_pos],
                                                     grad[hot_pos.to(grad.device)], self.host.optimizer(),
                                                     self.host.optimizer_options(), self.host.step_count(),
                                                     sorted_unique)
        if self.counts is not None:
            self.counts.index_add_(0, ids, torch.ones_like(ids, dtype=torch.int32))
            self._updates += 1
            if self.refresh > 0 and self._updates % self.refresh == 0:
                self.update_hot_rows()

    def scatter_(self, indices: torch.Tensor, src: torch.Tensor) -> None:
        """Writes ``src`` (``indices.shape + (dim,)``) into those rows, wherever each lives (a repeated id: its last row
        wins)."""
        ids = indices.to(self.device).reshape(-1)
        src = src.reshape(ids.numel(), self.dim())
        hot_pos, cold_pos, slots = self._split(ids)
        if cold_pos.numel():  # first: it refuses an id out of range before either part is written
            with self._refusing(indices):
                self.host.scatter_(ids[cold_pos], src[cold_pos.to(src.device)])
        if hot_pos.numel():
            torch.ops.speedtorch.scatter_(self.hot_table, slots[hot_pos], src[hot_pos.to(src.device)])

    def record_stream(self, stream) -> None:
        """Marks the device tensors as used on ``stream`` (Tensor.record_stream): the caching allocator keeps their
        memory until the work queued there is done, even when another stream replaces them (set_hot_rows)."""
        for t in (self.remap, self.hot_ids, self.hot_table, self.hot_state, self.counts):
            if t is not None and t.is_cuda:
                t.record_stream(stream)

    def copy_(self, src: torch.Tensor) -> None:
        """Copies ``src`` (``num_rows x dim``) into the host table and the device-resident rows."""
        self.host.copy_(src)
        if self.hot_ids.numel() and not self._device_rows_stale:  # (stale ones are gathered again before use)
            self.hot_table.copy_(src[self.hot_ids.to(src.device)])

    def save(self, path: str) -> None:
        """Writes the device-resident rows back, then saves the host table (:meth:`speedtorch.PinnedEmbedding.save`'s
        files)."""
        self.sync_to_host()
        self.host.save(str(path))

    @staticmethod
    def hot_count(num_rows: int, hot_rows: Optional[torch.Tensor], hot_fraction: Optional[float]) -> int:
        """How many device slots a hybrid table gets: the caller's set, or a fraction of the rows."""
        if hot_rows is not None:
            return int(torch.unique(hot_rows).numel())
        if hot_fraction is None or not 0.0 < hot_fraction <= 1.0:
            raise ValueError(f"placement='hybrid' needs hot_rows (ids) or hot_fraction in (0, 1], got "
                             f"{hot_fraction!r}")
        return max(1, math.ceil(hot_fraction * num_rows))
