"""Tables that grow (issue 33; docs/dynamic_tables.md): :class:`DynamicHostEmbedding`, a
:class:`speedtorch.nn.HostEmbedding` that takes raw int64 ids of any value, and :data:`IdIndex`, the host-RAM index
(``torch.classes.speedtorch.IdIndex``, csrc/embedding/id_index.h) that gives them rows.

``HostEmbedding(None, dim, capacity=...)`` builds a :class:`DynamicHostEmbedding`. The table is a
:class:`speedtorch.PinnedEmbedding` of ``capacity`` rows; an id gets a row (a *slot*) once it was seen ``admit_after``
times, and when every slot is taken the lowest-scored row (``evict="lru"`` or ``"lfu"``) that was not looked up since
the last optimizer update is evicted. A lookup of an id without a row returns a zero row, and that id gets no update.
"""

from __future__ import annotations

import contextlib
import os
from typing import Callable, Optional

import torch

from .._library import PinnedEmbedding
from .._phases import phase
from ..data import load_npy, save_npy
from ..ops import deferred_index_checks, transfers_without_the_host, unique_indices
from ._prefetched_rows import PrefetchedRows
from ._row_draws import RowDraws, check_taken
from .embedding import _UNSET, HostEmbedding, _options

# IdIndex is a TorchScript custom class (no docstrings of its own): not in __all__, documented in docs/dynamic_tables.md.
__all__ = ["DynamicHostEmbedding"]

#: ``torch.classes.speedtorch.IdIndex``: raw int64 ids -> slots, with admission and eviction (a TorchScript custom
#: class; its methods are documented in csrc/embedding/id_index.h and docs/dynamic_tables.md).
IdIndex = torch.classes.speedtorch.IdIndex

_POLICIES = ("lru", "lfu")
_WHOLE_NUMBERS = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


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
            from N(0, init_std^2) by the module's own generator (seeded by ``seed``), in admission order, in blocks
            of 4,096 rows (fewer for rows wider than 256; setting :attr:`init_std` rescales the rows not yet
            handed out): the k-th admitted row depends on k and the seed alone, not on how admissions fall
            into batches, so
            :meth:`prefetch` draws the next forward's rows ahead, off its critical path. Its optimizer state starts
            at zero.

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
        self.on_evict = on_evict
        generator = torch.Generator()
        generator.manual_seed(int(torch.randint(2**62, (1,))) if seed is None else int(seed))
        self._row_draws = RowDraws(embedding_dim, float(init_std), generator)
        # The index step of the oldest lookup whose gradient the optimizer has not applied yet (None: none): rows
        # seen since then keep their ids until it has, and the next training lookup stays in that step.
        self._pending_step: Optional[int] = None
        # Whether the last lookup had ids without a row (they point at a zero row past the distinct rows; _lookup).
        self._missing = False

    @property
    def init_std(self) -> float:
        """The standard deviation of the rows admitted from now on (the row draws' scale)."""
        return self._row_draws.std

    @init_std.setter
    def init_std(self, value: float) -> None:
        self._row_draws.rescale(value)

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
        self._admitted(*mapped)
        return mapped[0]

    def _admitted(self, slots, admitted, evicted_keys, evicted_slots) -> Optional[torch.Tensor]:
        """After the index admitted and evicted: hands the evicted rows to ``on_evict``, initialises the admitted
        ones, and notes the step's pending gradient. Returns the admitted rows as written (on :attr:`device`, in
        admission order), or None when none was admitted."""
        if self.trains and torch.is_grad_enabled() and self._pending_step is None:
            self._pending_step = self.index.step()
        if evicted_slots.numel() and self.on_evict is not None:
            self._sync_for_host_access()  # an update still running on the GPU may write these rows and their state
            rows = self.table.gather(evicted_slots, torch.device("cpu"))
            state = self.table.state()[evicted_slots].clone() if self.table.optimizer() else None
            self.on_evict(evicted_keys, rows, state)
        if admitted.numel():
            return self._initialise_rows(admitted)
        return None

    @torch.no_grad()
    def _initialise_rows(self, slots: torch.Tensor) -> torch.Tensor:
        """Draws the rows of newly admitted ``slots`` (CPU, admission order) and writes them with zero optimizer
        state. On a GPU the write is a kernel on the current stream after the module's last write (an evicted row's
        update may still be running): the host does not wait for the GPU. Returns the rows (on :attr:`device`)."""
        # On a GPU the rows come pinned (a block's slice): _to_device copies them without staging them again.
        rows = self._row_draws.take(slots.numel(), pin=self.device.type == "cuda")
        rows = rows.to(self._table_param.dtype)
        if self.device.type == "cuda":
            slots, rows = _to_device(slots, self.device), _to_device(rows, self.device)
            self._wait_for_writes()
        with self._without_host_waits():
            if self.table.optimizer():
                state = self.table.state()
                zeros = torch.zeros(slots.numel(), state.shape[1], dtype=state.dtype, device=rows.device)
                del state
                # One call for rows and state: a CPU write waits for the GPU work on the table itself (the host
                # access tracker), a GPU one is ordered by its stream; the table's step count stays.
                self.table.scatter_with_state_(slots, rows, zeros, self.table.step_count())
            else:
                self.table.scatter_(slots, rows)
        self._note_write()
        return rows

    def _lookup(self, input: torch.Tensor):
        # Ids without a row point one past the distinct rows (_rows_for sets _missing): a zero row, appended after the
        # rows that take a gradient, so it gets none and no id of the gradient is -1 (no mask, no wait for the GPU).
        self._missing = False
        unique, inverse, rows = super()._lookup(input)
        if self._missing:
            rows = torch.cat([rows, rows.new_zeros(1, rows.shape[1])])
        return unique, inverse, rows

    def _rows_for(self, input: torch.Tensor):
        pending, self._prefetched = self._prefetched, None  # a prefetch is for the next forward only
        if pending is not None and pending.key is input and (pending.mapping is not None or not self.training):
            return self._take_prefetched(pending)
        with phase("ids"):  # the raw ids mapped to slots (a trace's "ids" phase)
            host_ids = torch.as_tensor(input).to("cpu", torch.int64)  # CUDA ids: a synchronising copy
            slots = self._assign(host_ids) if self.training else self.index.find(host_ids)
        with phase("dedup"):
            unique, inverse, self._missing = _distinct(slots, self.device)
        self._wait_for_writes()
        with self._without_host_waits():
            return unique, inverse, self.table.gather(unique, self.device)

    def _without_host_waits(self):
        """On a GPU, the row transfers of slots the index made (in range by construction): their kernels check the
        slots (no host wait for a check kernel) and move every row (no share copied by the calling thread, which
        waits for the stream first). Elsewhere nothing."""
        if self.device.type != "cuda":
            return contextlib.nullcontext()
        stack = contextlib.ExitStack()
        stack.enter_context(deferred_index_checks())
        stack.enter_context(transfers_without_the_host())
        return stack

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
        were in the table. In ``eval()`` mode the mapping only reads (``find``). In training the rows the next
        forward may admit are drawn here (speedtorch/nn/_row_draws.py: a row is the same wherever it is drawn).

        The next forward then only admits the new ids and places their rows among those read ahead (no second
        mapping, no pass over the batch on the host); on a GPU nothing in either waits for the GPU but the copy of
        CUDA ids to the host here (on the current stream: TrainPipeline's waits only for the batch's copy)."""
        self._prefetched = None
        with phase("ids"):
            host_ids = torch.as_tensor(next_input).to("cpu", torch.int64)  # CUDA ids: a synchronising copy
            mapping = None
            if self.training:
                self.index.advance_step()  # the batch's own step, as its forward in the plain loop would open
                slots = self.index.touch(host_ids)
                mapping = (host_ids, slots)
                # The next forward admits at most the ids still without a row (and at most a table's worth): their
                # rows are drawn here, on the prefetch thread, not on the forward's critical path.
                self._row_draws.ensure(min(int((slots < 0).sum()), self.capacity), pin=self.device.type == "cuda")
            else:
                slots = self.index.find(host_ids)
        pending = self._read_ahead(next_input, slots)
        pending.mapping = mapping
        self._prefetched = pending

    def _read_ahead(self, key, slots: torch.Tensor) -> PrefetchedRows:
        """The distinct rows of ``slots`` (CPU; -1 for ids without a row, which point one past them), read after the
        module's last write: on a GPU on the gather stream, which waits for the current stream's work so far and
        that write, nothing else. The distinct slots are found on the host (:func:`_distinct`: the host waits for
        nothing on the GPU)."""
        with phase("dedup"):
            unique, inverse, missing = _distinct(slots, self.device)
        if self.device.type != "cuda":
            state = torch.ops.speedtorch.gather(self.table.state(), unique, None) if self._updates_ahead() else None
            pending = PrefetchedRows(key, unique, inverse, self.table.gather(unique, self.device), None, state)
            pending.missing = missing
            return pending
        current = torch.cuda.current_stream(self.device)
        side = self._gather_stream()
        side.wait_stream(current)  # the copies of unique and inverse, queued on the current stream
        if self._written is not None:
            side.wait_event(self._written)
        for t in (unique, inverse):
            t.record_stream(side)
        with torch.cuda.stream(side), self._without_host_waits():
            rows = self.table.gather(unique, self.device)
            state = torch.ops.speedtorch.gather(self.table.state(), unique, self.device) \
                if self._updates_ahead() else None
            ready = torch.cuda.Event()
            ready.record(side)
        pending = PrefetchedRows(key, unique, inverse, rows, ready, state)
        pending.missing = missing
        return pending

    def _take_prefetched(self, pending: PrefetchedRows):
        """forward's (unique, inverse, rows) from a prefetch: the rows read ahead (kept exact through this step's
        update by PrefetchedRows), and in training the admission of the batch's new ids, whose rows (just drawn, on
        the device already) are placed among them: every size is known on the host, so nothing waits for the GPU."""
        unique, inverse, rows = pending.take()
        self._missing = pending.missing
        if pending.mapping is None or not self.training:
            return unique, inverse, rows
        host_ids, touched = pending.mapping
        with phase("ids"):
            slots, admitted, evicted_keys, evicted_slots = self.index.admit(host_ids, touched, self._pending_step)
            new_rows = self._admitted(slots, admitted, evicted_keys, evicted_slots)
        if new_rows is None:
            return unique, inverse, rows
        # The admitted slots were -1 (no row) when the rows were read ahead; none of them is among the slots read
        # (those were seen in this step: not evicted). Sorted, they merge with the read-ahead ones: each list's
        # place in the merged one is its own index plus how many of the other list come before it.
        self._missing = bool((slots < 0).any())  # ids still without a row (not admitted yet)
        order = torch.argsort(admitted)
        added = _to_device(admitted[order], self.device)
        new_rows = new_rows[_to_device(order, self.device)].to(rows.dtype)
        n, a = unique.numel(), added.numel()
        old_at = torch.arange(n, device=unique.device) + torch.searchsorted(added, unique)
        new_at = torch.arange(a, device=unique.device) + torch.searchsorted(unique, added)
        merged = unique.new_empty(n + a).index_copy_(0, old_at, unique).index_copy_(0, new_at, added)
        placed = rows.new_empty(n + a, rows.shape[1]).index_copy_(0, old_at, rows).index_copy_(0, new_at, new_rows)
        # Each id's place: an id read ahead moves with its row (old_at; those without a row pointed at n); a new id
        # goes to its slot's place among the admitted ones, or one past all rows if it is still without one.
        slots = _to_device(slots.view(-1), self.device)
        old_at = torch.cat([old_at, old_at.new_full((1,), n + a)])
        new_at = torch.cat([new_at, new_at.new_full((1,), n + a)])
        moved = old_at[inverse.reshape(-1)]
        admitted_at = new_at[torch.searchsorted(added, slots).clamp_(max=a)]
        merged_inverse = torch.where((slots >= 0) & (moved == n + a), admitted_at, moved).view(inverse.shape)
        return merged, merged_inverse, placed

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
        generator_state, taken = self._row_draws.state()
        out["init_generator"] = generator_state
        out["init_taken"] = torch.tensor(taken, dtype=torch.int64)
        out["init_std"] = torch.tensor(self.init_std, dtype=torch.float64)  # the scale of the rows drawn from here
        return out

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        taken = prefix + "init_taken"
        if taken in state_dict:  # checked before anything changes: HostEmbedding's load writes nothing after an error
            error = _taken_error(taken, state_dict[taken], self._row_draws.rows_per_block)
            if error is not None:
                error_msgs.append(error)
        elif prefix + "init_generator" in state_dict:  # saved before rows were drawn in blocks: none of one taken
            state_dict = {**state_dict, taken: torch.zeros((), dtype=torch.int64)}
        std = prefix + "init_std"
        if std not in state_dict and prefix + "init_generator" in state_dict:  # saved before init_std was: this one's
            state_dict = {**state_dict, std: torch.tensor(self.init_std, dtype=torch.float64)}
        elif std in state_dict and not _is_scale(state_dict[std]):
            error_msgs.append(f"{std}: expected one finite number >= 0 (the new rows' standard deviation), got "
                              f"{state_dict[std]!r}")
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    def _copy_table_tensors(self, found: dict) -> None:
        found = dict(found)
        self.index.load_state(found.pop("index"))
        self.init_std = float(found.pop("init_std"))
        self._row_draws.load(found.pop("init_generator").to(torch.uint8), int(found.pop("init_taken")))
        super()._copy_table_tensors(found)
        self._pending_step = None

    def save(self, path: str) -> None:
        """:meth:`HostEmbedding.save` (rows, optimizer state and configuration at ``path``, ``.state.npy``,
        ``.meta.json``), the index at ``path + ".index.npy"``, the row generator's state (before its block not
        fully taken) at ``path + ".index_rng.npy"``, and at ``path + ".index_rng_taken.npy"`` that block's rows
        taken and ``init_std`` (float64 ``[taken, init_std]``; each file atomic, the four not one atomic unit yet)."""
        self._sync_for_host_access()
        super().save(path)
        save_npy(self.index.state(), str(path) + ".index.npy")
        generator_state, taken = self._row_draws.state()
        save_npy(generator_state, str(path) + ".index_rng.npy")
        save_npy(torch.tensor([taken, self.init_std], dtype=torch.float64), str(path) + ".index_rng_taken.npy")

    @classmethod
    def load(cls, path: str, *, verify: bool = True, **kwargs) -> "DynamicHostEmbedding":
        """A table from :meth:`save`'s files, answering, evicting and drawing new rows as the saved one did
        (``init_std`` the saved one's unless given); ``kwargs`` as the constructor's (mode, device, on_evict, ...)."""
        path = str(path)
        table = PinnedEmbedding.load(path, verify)
        index = IdIndex.from_state(load_npy(path + ".index.npy", pinned=False))
        taken_path = path + ".index_rng_taken.npy"  # absent in files saved before rows were drawn in blocks
        position = load_npy(taken_path, pinned=False).double() if os.path.exists(taken_path) else torch.zeros(1)
        if position.numel() > 1 and "init_std" not in kwargs:  # [taken, init_std]; [taken] alone before init_std
            kwargs["init_std"] = float(position[1])
        out = cls(None, table.dim(), table=table, index=index, dtype=table.table().dtype, **kwargs)
        out._row_draws.load(load_npy(path + ".index_rng.npy", pinned=False), int(position[0]))
        return out

    def __getstate__(self) -> dict:
        state = super().__getstate__()
        state["index"] = self.index.state()
        del state["_row_draws"]  # its lock and drawn blocks stay: what restores the same rows is its state
        state["_init_generator"], state["_init_taken"] = self._row_draws.state()
        state["_init_std"] = self._row_draws.std
        return state

    def __setstate__(self, state: dict) -> None:
        state = dict(state)
        index = IdIndex.from_state(state.pop("index"))
        generator_state = state.pop("_init_generator")
        taken = state.pop("_init_taken", 0)  # pickled before rows were drawn in blocks: none of one taken
        std = state.pop("_init_std", state.pop("init_std", 1.0))  # an attribute of the module before
        state.pop("_step_open", None)  # pickled by an earlier version
        state.setdefault("_pending_step", None)
        state.setdefault("_missing", False)
        super().__setstate__(state)
        self.index = index
        self._row_draws = RowDraws(self.embedding_dim, std, torch.Generator())
        self._row_draws.load(generator_state, taken)


def _is_scale(value) -> bool:
    """Whether a checkpoint's ``init_std`` is one finite number >= 0."""
    return isinstance(value, torch.Tensor) and value.numel() == 1 and value.is_floating_point() and \
        bool(torch.isfinite(value)) and float(value) >= 0


def _taken_error(key: str, value, rows_per_block: int) -> Optional[str]:
    """Why a checkpoint's ``init_taken`` (the rows taken of the row generator's block) cannot be loaded, or None."""
    if not isinstance(value, torch.Tensor) or value.numel() != 1 or value.dtype not in _WHOLE_NUMBERS:
        return f"{key}: expected one whole number (the rows taken of the row generator's block), got {value!r}"
    try:
        check_taken(int(value), rows_per_block)
    except ValueError as e:
        return f"{key}: {e}"
    return None


def _to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` (CPU) on ``device``; to a GPU through pinned memory, so the copy is queued on the current stream and the
    host does not wait for it (a copy from pageable memory may wait for the stream). A pinned ``t`` (a slice of one
    too: ``pin_memory`` asks whether its storage is) is copied from where it is."""
    if device.type != "cuda":
        return t
    return t.pin_memory().to(device, non_blocking=True)


def _distinct(slots: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """``(unique, inverse, missing)`` of host ``slots`` (-1 for ids without a row): the distinct slots ascending
    without -1 and each id's place among them (ids without a row: one past them, :func:`_present`), on ``device``,
    and whether there were such ids. Found on the host (speedtorch's unique_indices: one hash pass over the batch,
    a sort of its distinct slots) and copied through pinned memory: on a GPU nothing waits for the device (its
    unique would wait for the copy of the slots and for all the work queued before it, so the mapping of the next
    batch could not run while this batch's rows move)."""
    unique, inverse = unique_indices(slots)
    missing = unique.numel() > 0 and int(unique[0]) < 0
    unique, inverse = _present(unique, inverse, missing)
    return _to_device(unique, device), _to_device(inverse, device), missing


def _present(unique: torch.Tensor, inverse: torch.Tensor, missing: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``(unique, inverse)`` of slots (unique_indices') without the slot -1 that ids without a row share (sorted
    first, when ``missing``, a host-known flag): those ids point one past the remaining distinct slots. No wait for
    the GPU: only sizes known on the host are used."""
    if not missing:
        return unique, inverse
    unique = unique[1:]
    return unique, torch.where(inverse == 0, unique.numel(), inverse - 1)
