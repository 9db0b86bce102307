"""Tables that grow (issue 33; docs/dynamic_tables.md): :class:`DynamicHostEmbedding`, a
:class:`speedtorch.nn.HostEmbedding` that takes raw int64 ids of any value, and :data:`IdIndex`, the host-RAM index
(``torch.classes.speedtorch.IdIndex``, csrc/embedding/id_index.h) that gives them rows.

``HostEmbedding(None, dim, capacity=...)`` builds a :class:`DynamicHostEmbedding`. The table is a
:class:`speedtorch.PinnedEmbedding` of ``capacity`` rows; an id gets a row (a *slot*) once it was seen ``admit_after``
times, and when every slot is taken the lowest-scored row (``evict="lru"`` or ``"lfu"``) that was not looked up since
the last optimizer update is evicted. A lookup of an id without a row returns a zero row, and that id gets no update.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from .._library import PinnedEmbedding
from ..data import load_npy, save_npy
from ..ops import unique_indices
from ._prefetched_rows import PrefetchedRows
from .embedding import _UNSET, HostEmbedding, _options

# IdIndex is a TorchScript custom class (no docstrings of its own): not in __all__, documented in docs/dynamic_tables.md.
__all__ = ["DynamicHostEmbedding"]

#: ``torch.classes.speedtorch.IdIndex``: raw int64 ids -> slots, with admission and eviction (a TorchScript custom
#: class; its methods are documented in csrc/embedding/id_index.h and docs/dynamic_tables.md).
IdIndex = torch.classes.speedtorch.IdIndex

_POLICIES = ("lru", "lfu")


class DynamicHostEmbedding(HostEmbedding):
    """An embedding table of ``capacity`` rows in pinned host memory whose ids are raw int64 values of any range,
    given rows as they come (docs/dynamic_tables.md has the exact rules).

    Args:
        num_embeddings: ``None`` (the table grows; ``capacity`` bounds it).
        embedding_dim: row width.
        capacity: rows of the table: at most this many ids hold a row at once.
        admit_after: an id gets a row at its ``admit_after``-th sighting (1: at once). Until then its lookups return a
            zero row and it gets no update.
        evict: when every row is taken, an admitted id takes the row of the least recently seen id (``"lru"``) or of
            the least often seen one, least recently seen among equals (``"lfu"``), among the rows not looked up since
            the last optimizer update (those are never evicted; when all are, the id waits).
        candidate_capacity: how many not-yet-admitted ids the index counts (default: ``capacity``; unused when
            ``admit_after`` is 1). When it is full, the id seen least recently is forgotten.
        on_evict: ``on_evict(keys, rows, state)``, called with the evicted ids, their rows (CPU copies) and their
            optimizer state (float32 copies, or None without an optimizer) before their rows are reused; without
            it, evicted rows are dropped.
        mode, include_last_offset, scale_grad_by_freq, optimizer, optimizer_options, update, device, dtype,
        state_beside_rows, init_std, seed: as :class:`speedtorch.nn.HostEmbedding`'s. A newly admitted row is drawn
            from N(0, init_std^2) by the module's own generator (seeded by ``seed``), in admission order; its optimizer
            state starts at zero.

    :meth:`prefetch` (and so :class:`speedtorch.TrainPipeline`) maps the next batch while this step computes and
    admits its new ids at its forward, after this step's update: the same results as the plain loop when the
    optimizer steps between the two.

    Not yet (docs/dynamic_tables.md): ``padding_idx``, ``max_norm``, placements other than ``"host"``,
    TorchScript and compiled graphs of the lookup (torch.compile runs it eagerly, behind a graph
    break), the table collection and the distributed table.

    In ``eval()`` mode lookups only read: no id is admitted and no count or recency changes.
    """

    def __init__(self, num_embeddings: Optional[int] = None, embedding_dim: Optional[int] = None,
                 padding_idx: Optional[int] = None, max_norm: Optional[float] = None, norm_type: float = 2.0,
                 scale_grad_by_freq: bool = False, sparse: bool = True, *, capacity: Optional[int] = None,
                 admit_after: int = 1, evict: str = "lru", candidate_capacity: Optional[int] = None,
                 on_evict: Optional[Callable] = None, optimizer: Optional[str] = _UNSET,
                 optimizer_options: Optional[dict] = None, dtype: torch.dtype = torch.float32,
                 state_beside_rows: bool = True, init_std: float = 1.0, seed: Optional[int] = None,
                 placement: str = "host", table=None, index=None, **kwargs):
        name = type(self).__name__
        if num_embeddings is not None:
            raise ValueError(f"{name}: num_embeddings must be None (the table grows; capacity bounds it), got "
                             f"{num_embeddings!r}; a table of ids in [0, N) is HostEmbedding(N, dim)")
        if embedding_dim is None or int(embedding_dim) < 1:
            raise ValueError(f"{name}: embedding_dim must be >= 1, got {embedding_dim!r}")
        if padding_idx is not None or max_norm is not None:
            raise ValueError(f"{name}: padding_idx and max_norm are not yet supported for tables that grow (raw ids "
                             f"have no fixed padding row); docs/dynamic_tables.md")
        if placement != "host":
            raise ValueError(f"{name}: placement={placement!r} is not yet supported for tables that grow; use "
                             f"placement='host' (docs/dynamic_tables.md)")
        if evict not in _POLICIES:
            raise ValueError(f"{name}: evict must be 'lru' or 'lfu', got {evict!r}")
        if index is not None:
            capacity = index.capacity()
        if capacity is None or int(capacity) < 1:
            raise ValueError(f"{name}: capacity (rows of the table) must be >= 1, got {capacity!r}")
        if int(admit_after) < 1:
            raise ValueError(f"{name}: admit_after must be >= 1 (sightings before an id gets a row), got "
                             f"{admit_after!r}")
        capacity, embedding_dim = int(capacity), int(embedding_dim)
        if candidate_capacity is None:
            candidate_capacity = capacity if int(admit_after) > 1 else 0
        if index is None:
            index = IdIndex(capacity, int(admit_after), evict, int(candidate_capacity))
        if table is None:
            # The rows are drawn at admission: a new table stays zero until then.
            table = PinnedEmbedding(capacity, embedding_dim, dtype)
            if optimizer == _UNSET:
                optimizer = "adam"
            if optimizer is not None:
                table.set_optimizer(optimizer, _options(optimizer_options, dtype), state_beside_rows)
        elif table.num_rows() != index.capacity():
            raise ValueError(f"{name}: the table has {table.num_rows()} rows, the index {index.capacity()} slots")
        super().__init__(capacity, embedding_dim, None, None, norm_type, scale_grad_by_freq, sparse,
                         optimizer=optimizer, optimizer_options=optimizer_options, dtype=dtype,
                         state_beside_rows=state_beside_rows, init_std=init_std, seed=seed, placement="host",
                         table=table, **kwargs)
        self.index = index
        self.capacity = capacity
        self.init_std = float(init_std)
        self.on_evict = on_evict
        self._init_generator = torch.Generator()
        self._init_generator.manual_seed(int(torch.randint(2**62, (1,))) if seed is None else int(seed))
        # The index step of the oldest lookup whose gradient the optimizer has not applied yet (None: none): rows
        # seen since then keep their ids until it has, and the next training lookup stays in that step.
        self._pending_step: Optional[int] = None

    def extra_repr(self) -> str:
        """The sizes and options printed in the module's repr."""
        return (f"None, {self.embedding_dim}, capacity={self.capacity}, size={self.index.size()}, "
                f"admit_after={self.index.admit_after()}, evict={self.index.policy()}, mode={self.mode}, "
                f"optimizer={self.table.optimizer() if self.trains else None}, device={self.device}")

    # --- ids to slots -----------------------------------------------------------------------------------------------

    @torch.no_grad()
    def slots(self, ids: torch.Tensor) -> torch.Tensor:
        """The rows (slots) that ``ids`` (raw int64 ids, any shape and device) name now, -1 for ids without one,
        changing nothing (no admission, no count, no recency)."""
        return self.index.find(torch.as_tensor(ids))

    def _assign(self, ids: torch.Tensor) -> torch.Tensor:
        """Slots for a training lookup: admits and evicts (initialising the admitted rows, handing evicted ones to
        ``on_evict``) in the index's current step, opened here unless gradients of the last one are pending."""
        if self._pending_step is None:
            self.index.advance_step()
        if self._pending_step is None or self._pending_step >= self.index.step():
            mapped = self.index.assign(ids)
        else:  # a prefetch opened a later step while older gradients are pending: their rows stay too
            mapped = self.index.admit(ids, self.index.touch(ids), self._pending_step)
        return self._admitted(*mapped)

    def _admitted(self, slots, admitted, evicted_keys, evicted_slots) -> torch.Tensor:
        """After the index admitted and evicted: hands the evicted rows to ``on_evict``, initialises the admitted
        ones, and notes the step's pending gradient. Returns ``slots``."""
        if self.trains and torch.is_grad_enabled() and self._pending_step is None:
            self._pending_step = self.index.step()
        if evicted_slots.numel() and self.on_evict is not None:
            self._sync_for_host_access()  # an update still running on the GPU may write these rows and their state
            rows = self.table.gather(evicted_slots, torch.device("cpu"))
            state = self.table.state()[evicted_slots].clone() if self.table.optimizer() else None
            self.on_evict(evicted_keys, rows, state)
        if admitted.numel():
            self._initialise_rows(admitted)
        return slots

    @torch.no_grad()
    def _initialise_rows(self, slots: torch.Tensor) -> None:
        rows = torch.randn(slots.numel(), self.embedding_dim, generator=self._init_generator) * self.init_std
        self.table.scatter_(slots, rows.to(self._table_param.dtype))  # waits for GPU work on these rows itself
        if self.table.optimizer():
            # Written through the state tensor, which the table does not order after GPU updates still running on
            # these rows (an evicted row's last step): wait for them first. (A state scatter in C++ would not.)
            self._sync_for_host_access()
            self.table.state()[slots] = 0

    def _rows_for(self, input: torch.Tensor):
        pending, self._prefetched = self._prefetched, None  # a prefetch is for the next forward only
        if pending is not None and pending.key is input and (pending.mapping is not None or not self.training):
            return self._take_prefetched(pending)
        ids = torch.as_tensor(input)
        slots = self._assign(ids) if self.training else self.index.find(ids)
        unique, inverse = unique_indices(slots.to(self.device))  # -1 (no row), if any, comes first
        self._wait_for_writes()
        return unique, inverse, self._rows_of(unique)

    def _rows_of(self, unique: torch.Tensor) -> torch.Tensor:
        """The rows of sorted distinct slots, a zero row for -1 (ids without a row)."""
        rows = self.table.gather(unique.clamp(min=0), self.device)
        if unique.numel():
            # Only the first distinct slot can be -1 (sorted); a where over one row needs no wait for the GPU.
            rows[:1] = torch.where(unique[:1].unsqueeze(1) >= 0, rows[:1], 0)
        return rows

    def _receive_gradient(self, unique: torch.Tensor, grad_rows: torch.Tensor) -> None:
        keep = unique >= 0  # ids without a row get no update
        if not bool(keep.all()):
            unique, grad_rows = unique[keep], grad_rows[keep]
        super()._receive_gradient(unique, grad_rows)

    def _apply_gradients(self, unique, grad_rows, sorted_unique: bool = False) -> None:
        super()._apply_gradients(unique, grad_rows, sorted_unique)
        self._pending_step = None

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drops gradients not yet applied; the rows they were for may be evicted again."""
        super().zero_grad(set_to_none)
        self._pending_step = None

    def step(self) -> None:
        """Applies the pending gradients (:meth:`HostEmbedding.step`); afterwards the rows looked up since the last
        update may be evicted again."""
        super().step()
        self._pending_step = None

    # --- prefetch: the mapping of batch t+1 while step t computes ----------------------------------------------

    def prefetch(self, next_input: torch.Tensor) -> None:
        """Maps the next batch and starts reading its rows while this step computes (:meth:`HostEmbedding.prefetch`;
        pass the same ids object to the next forward). The mapping is split in two (IdIndex.touch / admit): here,
        in a step of its own, the ids already in the table are counted as seen and their rows read ahead (on a side
        stream on a GPU); the new ids are admitted (and rows evicted for them) by the next forward, once this
        step's update is done, so no row a step in flight reads or updates is evicted. Nothing else changes the
        index in between: slots, admissions, evictions and rows are the plain loop's when the optimizer steps
        between the two forwards (as :class:`speedtorch.TrainPipeline` does). With gradients still pending at the
        next forward (accumulation), their rows are kept too, and the prefetched batch stays in its own step.
        A prefetch the next forward does not take (other ids, :meth:`drop_prefetch`) has still counted its ids that
        were in the table. In ``eval()`` mode the mapping only reads (``find``)."""
        self._prefetched = None
        host_ids = torch.as_tensor(next_input).to("cpu", torch.int64)  # CUDA ids: a synchronising copy
        mapping = None
        if self.training:
            self.index.advance_step()  # the batch's own step, as its forward in the plain loop would open
            slots = self.index.touch(host_ids)
            mapping = (host_ids, slots)
        else:
            slots = self.index.find(host_ids)
        pending = self._read_ahead(next_input, slots)
        pending.mapping = mapping
        self._prefetched = pending

    def _read_ahead(self, key, slots: torch.Tensor) -> PrefetchedRows:
        """The distinct rows of ``slots`` (CPU), read after the module's last write: on a GPU on the gather stream,
        which waits for the current stream's work so far and that write, nothing else."""
        unique, inverse = unique_indices(slots)
        if self.device.type != "cuda":
            state = torch.ops.speedtorch.gather(self.table.state(), unique.clamp(min=0), None) \
                if self._updates_ahead() else None
            return PrefetchedRows(key, unique, inverse, self._rows_of(unique), None, state)
        side = self._gather_stream()
        side.wait_stream(torch.cuda.current_stream(self.device))
        if self._written is not None:
            side.wait_event(self._written)
        with torch.cuda.stream(side):
            unique = unique.to(self.device, non_blocking=True)
            inverse = inverse.to(self.device, non_blocking=True)
            rows = self._rows_of(unique)
            state = torch.ops.speedtorch.gather(self.table.state(), unique.clamp(min=0), self.device) \
                if self._updates_ahead() else None
            ready = torch.cuda.Event()
            ready.record(side)
        return PrefetchedRows(key, unique, inverse, rows, ready, state)

    def _take_prefetched(self, pending: PrefetchedRows):
        """forward's (unique, inverse, rows) from a prefetch: the rows read ahead (kept exact through this step's
        update by PrefetchedRows), and in training the admission of the batch's new ids, whose new rows join them."""
        unique, inverse, rows = pending.take()
        if pending.mapping is None or not self.training:
            return unique, inverse, rows
        host_ids, touched = pending.mapping
        slots, admitted, evicted_keys, evicted_slots = self.index.admit(host_ids, touched, self._pending_step)
        self._admitted(slots, admitted, evicted_keys, evicted_slots)
        if not admitted.numel():
            return unique, inverse, rows
        # The admitted slots were -1 (no row) when the rows were read ahead; none of them is among the slots read
        # (those were seen in this step: not evicted). Their rows, new, are read now and placed among the others.
        self._wait_for_writes()
        new_unique, new_inverse = unique_indices(slots)
        new_unique, new_inverse = new_unique.to(self.device), new_inverse.to(self.device)
        n = new_unique.numel()
        placed = rows.new_empty(n + 1, rows.shape[1])  # the last row: a spare for the read-ahead -1, if it went
        at = torch.searchsorted(new_unique, unique).clamp_(max=n - 1)
        placed.index_copy_(0, torch.where(new_unique[at] == unique, at, n), rows)
        admitted = torch.sort(admitted).values.to(self.device)
        placed.index_copy_(0, torch.searchsorted(new_unique, admitted), self.table.gather(admitted, self.device))
        return new_unique, new_inverse.view(inverse.shape), placed[:n]

    # --- what is not yet supported ------------------------------------------------------------------------------

    def _traceable(self) -> bool:
        return False  # the lookup maps ids through the index, which no graph holds: torch.compile runs it eagerly

    def __prepare_scriptable__(self):
        raise RuntimeError(f"torch.jit.script({type(self).__name__}) is not yet supported: the lookup maps raw ids "
                           f"through the IdIndex in Python; script a HostEmbedding, or call index.find and "
                           f"table.gather yourself (docs/dynamic_tables.md)")

    # --- export, state_dict, files, pickling ----------------------------------------------------------------------

    @torch.no_grad()
    def export(self, predicate: Optional[Callable] = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(keys, rows)``: the ids that hold a row and their rows (CPU copies, in slot order), for serving.
        ``predicate(keys, counts, last_steps)`` (int64 tensors, one entry per id: its sighting count and the index
        step it was last seen) returns a bool mask of the ids to keep; None keeps all."""
        keys = self.index.keys()
        slots = torch.arange(keys.numel(), dtype=torch.int64)
        if predicate is not None:
            mask = torch.as_tensor(predicate(keys, self.index.counts(), self.index.last_steps()), dtype=torch.bool)
            if mask.shape != keys.shape:
                raise ValueError(f"{type(self).__name__}.export: predicate must return a bool mask of shape "
                                 f"{tuple(keys.shape)} (one per id), got shape {tuple(mask.shape)}")
            keys, slots = keys[mask], slots[mask]
        self._sync_for_host_access()
        return keys, self.table.gather(slots, torch.device("cpu"))

    def _table_tensors(self) -> dict:
        out = super()._table_tensors()
        out["index"] = self.index.state()
        out["init_generator"] = self._init_generator.get_state()
        return out

    def _copy_table_tensors(self, found: dict) -> None:
        found = dict(found)
        self.index.load_state(found.pop("index"))
        self._init_generator.set_state(found.pop("init_generator").to(torch.uint8))
        super()._copy_table_tensors(found)
        self._pending_step = None

    def save(self, path: str) -> None:
        """:meth:`HostEmbedding.save` (rows, optimizer state and configuration at ``path``, ``.state.npy``,
        ``.meta.json``), and the index at ``path + ".index.npy"`` and the row generator's state at
        ``path + ".index_rng.npy"`` (each file atomic; the three are not one atomic unit yet)."""
        self._sync_for_host_access()
        super().save(path)
        save_npy(self.index.state(), str(path) + ".index.npy")
        save_npy(self._init_generator.get_state(), str(path) + ".index_rng.npy")

    @classmethod
    def load(cls, path: str, *, verify: bool = True, **kwargs) -> "DynamicHostEmbedding":
        """A table from :meth:`save`'s files, answering and evicting as the saved one did; ``kwargs`` as the
        constructor's (mode, device, on_evict, ...)."""
        path = str(path)
        table = PinnedEmbedding.load(path, verify)
        index = IdIndex.from_state(load_npy(path + ".index.npy", pinned=False))
        out = cls(None, table.dim(), table=table, index=index, dtype=table.table().dtype, **kwargs)
        out._init_generator.set_state(load_npy(path + ".index_rng.npy", pinned=False))
        return out

    def __getstate__(self) -> dict:
        state = super().__getstate__()
        state["index"] = self.index.state()
        state["_init_generator"] = self._init_generator.get_state()
        return state

    def __setstate__(self, state: dict) -> None:
        state = dict(state)
        index = IdIndex.from_state(state.pop("index"))
        generator = torch.Generator()
        generator.set_state(state.pop("_init_generator"))
        state.pop("_step_open", None)  # pickled by an earlier version
        state.setdefault("_pending_step", None)
        super().__setstate__(state)
        self.index = index
        self._init_generator = generator
