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

    Not yet (docs/dynamic_tables.md): ``padding_idx``, ``max_norm``, placements other than ``"host"``,
    :meth:`prefetch`, TorchScript and compiled graphs of the lookup (torch.compile runs it eagerly, behind a graph
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
        # Whether the index's current step holds lookups whose gradient the optimizer has not applied yet (their
        # rows must keep their ids until it has): the next training lookup then stays in that step.
        self._step_open = False

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
        if not self._step_open:
            self.index.advance_step()
        slots, admitted, evicted_keys, evicted_slots = self.index.assign(ids)
        if self.trains and torch.is_grad_enabled():
            self._step_open = True
        if evicted_slots.numel() and self.on_evict is not None:
            rows = self.table.gather(evicted_slots, torch.device("cpu"))
            state = None
            if self.table.optimizer():
                self._sync_for_host_access()  # the state tensor is read without the table's ordering of GPU work
                state = self.table.state()[evicted_slots].clone()
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
        ids = torch.as_tensor(input)
        slots = self._assign(ids) if self.training else self.index.find(ids)
        unique, inverse = unique_indices(slots.to(self.device))  # -1 (no row), if any, comes first
        rows = self.table.gather(unique.clamp(min=0), self.device)
        if unique.numel():
            # Only the first distinct slot can be -1 (sorted); a where over one row needs no wait for the GPU.
            rows[:1] = torch.where(unique[:1].unsqueeze(1) >= 0, rows[:1], 0)
        return unique, inverse, rows

    def _receive_gradient(self, unique: torch.Tensor, grad_rows: torch.Tensor) -> None:
        keep = unique >= 0  # ids without a row get no update
        if not bool(keep.all()):
            unique, grad_rows = unique[keep], grad_rows[keep]
        super()._receive_gradient(unique, grad_rows)

    def _apply_gradients(self, unique, grad_rows, sorted_unique: bool = False) -> None:
        super()._apply_gradients(unique, grad_rows, sorted_unique)
        self._step_open = False

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drops gradients not yet applied; the rows they were for may be evicted again."""
        super().zero_grad(set_to_none)
        self._step_open = False

    def step(self) -> None:
        """Applies the pending gradients (:meth:`HostEmbedding.step`); afterwards the rows looked up since the last
        update may be evicted again."""
        super().step()
        self._step_open = False

    # --- what is not yet supported ------------------------------------------------------------------------------

    def _traceable(self) -> bool:
        return False  # the lookup maps ids through the index, which no graph holds: torch.compile runs it eagerly

    def prefetch(self, next_input: torch.Tensor) -> None:
        """Not yet supported for tables that grow (the next batch's admissions could evict rows this step updates):
        raises."""
        raise NotImplementedError(f"{type(self).__name__}.prefetch is not yet supported (mapping the next batch "
                                  f"could evict rows this step still updates); call forward without it "
                                  f"(docs/dynamic_tables.md)")

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
        self._step_open = False

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
        super().__setstate__(state)
        self.index = index
        self._init_generator = generator
