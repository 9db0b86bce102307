"""``speedtorch.TrainPipeline``: the training loop that hides host-RAM tables behind the model's compute, as
TorchRec's ``TrainPipelineSparseDist`` and FBGEMM's prefetch pipeline do, and trains exactly as the plain loop does.

While step ``t`` runs on the GPU, three batches are in flight:

    copy stream   batch t+2's tensors copied to the GPU (non_blocking: pinned batches copy asynchronously)
    side stream   batch t+1's rows gathered from host RAM (``module.prefetch``), bounded to ``max_sms`` SMs
    main stream   batch t: forward, backward, the host tables' fused updates, the dense optimizer

Exactness: the gather of t+1 may read rows that step t's update then changes. The update hands the prefetch the rows
it changes, from the fused step's own output on the GPU (speedtorch/nn/_prefetched_rows.py; a GPU row cache ("hybrid")
re-reads them from GPU memory), so every forward sees the rows the plain loop would: the results are the same bits,
and no row crosses PCIe twice. The gather of t+1 waits for each table's last write (step t-1's update), not for
forward t, and the host never waits for step t's work to count t+1's ids. A table placed in GPU memory reads nothing
ahead (its rows are there already). The prefetch's own host work (counting t+1's distinct ids, which waits for the
GPU, and queueing the gather) runs on a thread of its own while this thread queues the backward, on a GPU, when
every host table is a plain HostEmbedding, a table that grows (DynamicHostEmbedding: its next batch's ids are
mapped there too) or a collection of plain ones, updated at ``step()``, and no profiler records
(it would see this thread's ranges only), with this thread's speedtorch settings; otherwise after the backward.

Errors: a bad batch t+1 (an id out of range) raises at the step that trains t+1, as in the plain loop: its prefetch
is dropped, step t trains, and the next forward meets the error itself.

The loop it replaces, for a model whose ``forward(batch)`` returns the loss (or a tuple whose first item is it)::

    for batch in batches:
        loss = model(batch.to(device))
        loss.backward()
        for m in host_modules: m.step()      # HostEmbedding / HostEmbeddingBagCollection / DistributedHostEmbedding
        optimizer.step(); optimizer.zero_grad()

(the host modules a ``speedtorch.optim.HostEmbeddingOptimizer`` in ``optimizer`` holds are left to its step, so an
LR scheduler driving it, through a ``CombinedOptimizer`` too, works as in the plain loop.)

Which input a host module gets: ``sparse_inputs(batch)``, a list of ``(module, input)``; by default the model's own
``sparse_inputs`` method (the model inside ``DistributedDataParallel`` too). Without one, nothing is prefetched (the
copies still overlap). The input must be the very object forward passes to the module (prefetch matches by identity).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import statistics
import time
from typing import Any, Callable, Iterable, Optional, Union

import torch

from ._phases import phase
from ._prefetch_thread import PrefetchThread
from .nn import HostEmbedding, HostEmbeddingBagCollection
from .ops import transfer_config_override
from .optim import host_embeddings_stepped_by

__all__ = ["TrainPipeline", "move_batch"]


class TrainPipeline:
    """Trains ``model`` on ``batches``, one step per :meth:`progress` (or per item when iterated).

    Args:
        model: ``model(batch)`` returns the loss, or a tuple whose first item is the loss. May be wrapped in
            ``DistributedDataParallel`` (the dense part; host tables are not parameters, DDP leaves them alone).
        optimizer: the dense parameters' torch optimizer, a list of optimizers (e.g. SparseAdam and Adam), or
            None. They step after the host tables, in order.
        batches: an iterable of batches on the CPU (pin them, e.g. ``DataLoader(pin_memory=True)``, for copies that
            overlap) or already on ``device``: tensors, or tuples / lists / dicts / dataclasses of them, or objects
            with ``to(device, non_blocking=...)``.
        device: where the model computes (default: the current CUDA device, else the CPU).
        sparse_inputs: ``batch -> [(host module, its input), ...]``, for prefetching (default: the model's
            ``sparse_inputs`` method, if any).
        step_host_tables: call ``step()`` of every host table the model holds (HostEmbedding, its subclasses, the
            groups of a HostEmbeddingBagCollection) each step, except the ones ``optimizer`` steps itself: a
            :class:`speedtorch.optim.HostEmbeddingOptimizer`, alone or in a ``CombinedOptimizer``, updates its
            tables with the hyper-parameters its scheduler set (a step here first would use the old ones). False:
            none (the optimizers, or you, step them).
        max_sms: bound the side stream's gathers and the host tables' steps (which run beside the next forward when
            their rows were read ahead) to this many SMs (the transfer option ``max_sms``), so they leave
            the rest of the GPU to the model; "auto" (the default): a quarter of the GPU's SMs (on an H200, DLRM
            with host tables ran 1.19x the all-GPU step at 32 of 132 SMs, 1.25x at 64 and 1.41-1.49x on all of
            them: the model's kernels slow down beside the row kernels), none when every table is in GPU memory
            (``placement="gpu"``: nothing runs beside the model, the steps are on its stream) or when the process
            has a bound of its own (``set_transfer_config(max_sms=...)``, ``SPEEDTORCH_MAX_SMS``); None keeps the
            process's setting.
        prefetch: "auto" (the default): a trial over the first 27 steps (3 with prefetch, then 2 rounds of a block
            with it and a block without, each a step to settle and 5 steps timed on the training stream; on a GPU
            with ``copy_engines="auto"`` a third block each round, 39 steps: see ``copy_engines``)
            keeps the faster way (with prefetch unless the steps without it took at least 3% less; under
            torch.distributed, with distributed tables, whose prefetch exchanges ids, the same on every rank, agreed
            by an all-reduce over the default process group as the 28th step starts; other tables' ranks decide
            alone); ``prefetch`` then says which, :attr:`prefetch_trial` the
            milliseconds a step of each. The trial is the pipeline's own: over 27 batches or fewer it never ends
            (``prefetch`` stays "auto"), and a new pipeline (one an epoch) tries again: pass the first one's
            ``prefetch`` to the next. With nothing to read ahead (no ``sparse_inputs``) it is False at once. True: always gather the next batch's rows ahead; False: never (copies still
            overlap). A prefetch has fixed costs (counting the next batch's distinct ids, a write-back and a gather
            in stream order) that only a long enough step hides: on an H200 a DLRM step of 14-17 ms gained
            1.28-1.35x from it, but the 3-3.5 ms step of bench/dynamic_table.py's recommender ran 1.56-1.78x slower
            with it than without; "auto" kept prefetch for the first and dropped it for the second (bench/
            RESULTS.md, fifteenth session). Every way trains the same bits.
        copy_engines: on a GPU, move the host tables' rows read ahead and written back by CPU threads in stream order
            and the copy engines (the transfer option ``stream_ordered_staging``), no SM taken from the model, and
            step the rows read ahead where they are, writing the table only (True). False: UVA row kernels bounded by
            ``max_sms``. "auto" (the default): with ``prefetch="auto"`` on a GPU, the trial times a third way,
            prefetch over UVA row kernels, in each round (39 steps in all) and keeps the fastest of the three
            (``copy_engines`` then says which); else True. Which is faster depends on the machine and on the loop:
            on an H200, DLRM with host tables ran 1.043-1.059x the all-GPU step (14.4-14.7 ms) with copy engines
            against 1.21-1.25x with UVA row kernels; on one H200 machine, whose CPU copies moved 10 GB/s instead of
            25-33, 2.03x against 1.21x; and a loop that reads the loss every step (``loss.item()``, which waits for
            each step's forward) ran the copy engines' steps at 20.3 ms instead of 15.3, UVA's unchanged (17.7)
            (bench/RESULTS.md, sixteenth session). The trial times the loop as it runs, so it keeps what suits it.
            The CPU copies of a
            step's write-back and of the next gather (about 9 ms a step, in host functions, which the CUDA driver
            runs one at a time) run beside the model on torch's CPU threads.
    """

    _beside_backward_on_cpu = False  # tests: the GPU's prefetch thread on the CPU too

    def __init__(self, model: torch.nn.Module, optimizer, batches: Iterable, *,
                 device=None, sparse_inputs: Optional[Callable[[Any], list]] = None, step_host_tables: bool = True,
                 max_sms: Union[int, str, None] = "auto", prefetch: Union[bool, str] = "auto",
                 copy_engines: Union[bool, str] = "auto"):
        if device is None:
            device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        self.model = model
        self.optimizers = [] if optimizer is None else list(optimizer) if isinstance(optimizer, (list, tuple)) \
            else [optimizer]
        self.host_modules = host_modules(model)
        inner = getattr(model, "module", model)  # DistributedDataParallel's model
        self.sparse_inputs = sparse_inputs or getattr(inner, "sparse_inputs", None)
        self.step_host_tables = step_host_tables
        # The tables this loop steps: those no optimizer given steps (a second step would find no gradient, but the
        # first, here, would miss the learning rate a scheduler set on the optimizer's param groups).
        stepped = {id(m) for m in host_embeddings_stepped_by(self.optimizers)}
        self._tables_to_step = [t for t in _tables_of(self.host_modules) if id(t) not in stepped]
        self.max_sms = _resolved_max_sms(max_sms, self.device, _tables_of(self.host_modules))
        if prefetch not in (True, False, "auto"):
            raise ValueError(f"TrainPipeline: prefetch must be True, False or 'auto', got {prefetch!r}")
        self.prefetch = prefetch
        self.prefetch_trial: Optional[dict] = None  # "auto": {"with": ms a step, "without": ms a step} once decided
        if not (isinstance(copy_engines, bool) or copy_engines == "auto"):
            raise ValueError(f"TrainPipeline: copy_engines must be True, False or 'auto', got {copy_engines!r}")
        # "auto": tried beside prefetch="auto"'s ways on a GPU (prefetch over UVA row kernels as a third way); else
        # the copy engines.
        tried = copy_engines == "auto" and prefetch == "auto" and self.device.type == "cuda"
        self.copy_engines = True if copy_engines == "auto" else copy_engines
        ways = ((True, True), (True, False), (False, True)) if tried else \
            ((True, self.copy_engines), (False, self.copy_engines))
        self._trial = _PrefetchTrial(ways) if prefetch == "auto" else None
        self.steps = 0
        self._batches = iter(batches)
        self._exhausted = False
        self._staged: collections.deque = collections.deque()
        cuda = self.device.type == "cuda"
        self._copy_stream = torch.cuda.Stream(self.device) if cuda else None
        # Where the gathers of batch t+1 are started: a stream that waits for step t-1's updates and t+1's copy only,
        # not for forward t, so they run beside batch t's forward and backward.
        # High priority: the host waits for its small kernels (the ids' checks and counts), which must not queue
        # behind the model's.
        self._gather_gate = torch.cuda.Stream(self.device, priority=-1) if cuda else None
        # Plain and growing host tables updated at step(): the next batch's prefetch runs on a thread of its own
        # while this thread queues the backward.
        self._prefetch_thread = PrefetchThread(self.device, on_cpu=TrainPipeline._beside_backward_on_cpu)
        self._gathers_beside_backward = self._prefetch_thread.on_device and _prefetch_is_local(self.host_modules)
        self._vetted = {id(m) for m in self.host_modules}

    def __iter__(self):
        while True:
            try:
                yield self.progress()
            except StopIteration:
                return

    def progress(self):
        """One training step on the next batch; returns what the model returned. Raises StopIteration when the
        batches are done."""
        self._stage(2)  # this batch and the next: copied, or being copied
        if not self._staged:
            self._prefetch_thread.shutdown()
            raise StopIteration
        if self._trial is not None:
            if self.sparse_inputs is None or not self.host_modules:  # nothing to read ahead: no trial, no waits
                self.prefetch, self._trial = False, None
            else:
                self._trial_step()
        batch = self._take()
        output = self.model(batch)
        loss = output[0] if isinstance(output, (tuple, list)) else output
        self._stage(2)  # batch t+2's copies run beside this step
        # Forward has taken this batch's prefetched rows: each module's prefetch slot is free for the next batch. The
        # prefetch's host work (counting the distinct ids, which waits for the GPU, and queueing the gather) must not
        # hold the backward's launch: on the calling thread it left the GPU idle 2-2.6 ms a DLRM step (bench/
        # RESULTS.md, fourteenth session). It runs on a thread of its own while this one queues the backward (which
        # touches neither the tables nor the prefetch slots when every table updates at step()); else after it.
        prefetching = self.prefetch if self._trial is None else self._trial.prefetches(self.steps)
        gathering = prefetching and self.sparse_inputs is not None and bool(self._staged)
        beside, inputs = None, None
        # Not while a profiler records (PrefetchThread.may_run_beside): the prefetch then follows the backward.
        if gathering and self._gathers_beside_backward and self._prefetch_thread.may_run_beside():
            inputs = self._sparse_inputs_of(self._staged[0])
            if inputs is not None and all(id(module) in self._vetted for module, _ in inputs):
                # A module the model does not hold was not vetted: it prefetches after the backward.
                beside = self._prefetch_thread.submit(self._start_gathers, self._staged[0], inputs)
        try:
            loss.backward()
        finally:  # a backward that raises (or a Ctrl-C) leaves no prefetch running behind the caller's back
            if beside is not None:
                self._prefetch_thread.wait(beside)
        if gathering and beside is None:
            self._start_gathers(self._staged[0], inputs)
        if self.step_host_tables:
            with self._sm_bound():  # the updates a prefetch lets run beside the next forward share the GPU with it
                for table in self._tables_to_step:
                    table.step()
        with phase("dense optimizer"):  # a HostEmbeddingOptimizer's tables: their own phase, the update
            for optimizer in self.optimizers:
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
        self.steps += 1
        return output

    # --- the stages ------------------------------------------------------------------------------------------------

    def _stage(self, count: int) -> None:
        """Starts copying batches until ``count`` are staged (or the batches are done)."""
        while len(self._staged) < count and not self._exhausted:
            try:
                batch = next(self._batches)
            except StopIteration:
                self._exhausted = True
                return
            if self._copy_stream is None:
                with phase("copies"):
                    self._staged.append(_Staged(move_batch(batch, self.device), None))
                continue
            # No wait for the main stream: earlier batches' memory returns to the copy stream's pool only once the
            # main stream is done with it (record_stream in _wait).
            with torch.cuda.stream(self._copy_stream), phase("copies"):
                moved = move_batch(batch, self.device, non_blocking=True)
                ready = torch.cuda.Event()
                ready.record(self._copy_stream)
            self._staged.append(_Staged(moved, ready))

    def _wait(self, staged: "_Staged") -> None:
        if staged.ready is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_event(staged.ready)
            _record_stream(staged.batch, current)  # made on the copy stream, used and freed on this one
            staged.ready = None

    def _take(self):
        staged = self._staged.popleft()
        self._wait(staged)
        return staged.batch

    def _sm_bound(self):
        """The transfer options of the row work that runs beside the model (the gathers ahead, the host tables'
        updates): ``max_sms``, and stream-ordered staging with ``copy_engines`` on a GPU."""
        copy_engines = self.copy_engines if self._trial is None else self._trial.way(self.steps)[1]
        return row_transfers(self.device, copy_engines, self.max_sms)

    def _trial_step(self) -> None:
        """prefetch="auto": at each block's edges, marks the time (on a GPU, an event on this stream: the block's time
        is the stream's, so the work a block's last step leaves behind on other streams, which a training loop
        overlaps with the next step, is not charged to it; read once the GPU has passed it, never waited for); once
        every block is timed, keeps the fastest way."""
        trial = self._trial
        if trial.at_edge(self.steps):
            mark = time.perf_counter()
            if self.device.type == "cuda":
                mark = torch.cuda.Event(enable_timing=True)
                mark.record(torch.cuda.current_stream(self.device))
            over = trial.record(self.steps, mark)
        elif self.steps > trial.STEPS:
            over = trial.resolve()
        else:
            return
        if over:
            choice, self.copy_engines = trial.choice()
            self.prefetch = _agreed(choice, self.device) if _prefetch_is_collective(self.host_modules) else choice
            self.prefetch_trial = trial.summary()
            self._trial = None

    def _sparse_inputs_of(self, staged: "_Staged") -> Optional[list]:
        """``sparse_inputs`` of ``staged``'s batch, as a list; None when it raises (the prefetch after the backward
        meets the error again and handles it)."""
        try:
            return list(self.sparse_inputs(staged.batch))
        except Exception:  # noqa: BLE001
            return None

    def _start_gathers(self, staged: "_Staged", inputs: Optional[list] = None) -> None:
        """Starts gathering ``staged``'s rows: each host module's prefetch, called on the gate stream, which has waited
        for the batch's copy only (each module's gather waits for its table's last write itself), so neither the ids'
        work nor the host waits for this step's forward. A batch whose ids a prefetch refuses is left to its own
        step's forward, which raises the same error there (this step still trains, as in the plain loop)."""
        bound = self._sm_bound()
        gate = contextlib.nullcontext()
        if self._gather_gate is not None:
            if staged.ready is not None:
                self._gather_gate.wait_event(staged.ready)
            _record_stream(staged.batch, self._gather_gate)
            gate = torch.cuda.stream(self._gather_gate)
        try:
            with gate, bound:
                for module, features in self.sparse_inputs(staged.batch) if inputs is None else inputs:
                    module.prefetch(features)
        except Exception:  # noqa: BLE001 (raised again by that batch's own forward)
            for module in self.host_modules:
                module.drop_prefetch()


class _PrefetchTrial:
    """prefetch="auto"'s schedule over ``ways``, each ``(prefetch, copy_engines)``, the first the default: WARMUP
    steps the first way, then ROUNDS rounds of a block of each way in turn, each block SETTLE + BLOCK steps of which
    the last BLOCK are timed (a block's first step is neither way: its forward takes, or finds no, rows the block
    before read ahead); the way kept: the fastest, the first unless another was MARGIN faster than it."""
    WARMUP, SETTLE, BLOCK, ROUNDS, MARGIN = 3, 1, 5, 2, 0.97

    def __init__(self, ways=((True, True), (False, True))):
        self.ways = list(ways)
        self.times: dict[tuple, list[float]] = {way: [] for way in self.ways}
        self._started: Optional[float] = None
        # Closed blocks the device has not finished yet, (way, start, end): read later, never waited for, so the host
        # keeps its lead over the GPU through the trial as in training.
        self._pending: list = []
        self.STEPS = self.steps_for(len(self.ways))  # the trial is over before step STEPS runs

    @classmethod
    def steps_for(cls, ways: int) -> int:
        """Steps of a trial of ``ways`` ways: 27 for two, 39 for three."""
        return cls.WARMUP + ways * cls.ROUNDS * (cls.SETTLE + cls.BLOCK)

    def way(self, step: int) -> tuple:
        """``(prefetch, copy_engines)`` of step ``step`` (0-based): whether it starts the next batch's prefetch, and
        how the host tables' rows move."""
        if step < self.WARMUP or step >= self.STEPS:  # after the schedule, until its last block is read: the first
            return self.ways[0]
        return self.ways[(step - self.WARMUP) // (self.SETTLE + self.BLOCK) % len(self.ways)]

    def prefetches(self, step: int) -> bool:
        """Whether step ``step`` (0-based) starts the next batch's prefetch."""
        return self.way(step)[0]

    def at_edge(self, step: int) -> bool:
        """Whether the time is marked before step ``step``: a block's timed steps start or end there."""
        within = self.WARMUP <= step <= self.STEPS
        return within and (step - self.WARMUP) % (self.SETTLE + self.BLOCK) in (0, self.SETTLE)

    def record(self, step: int, now: Union[float, torch.cuda.Event]) -> bool:
        """At an edge before step ``step`` (``now``: seconds, or a CUDA event recorded there): starts timing a block's
        steps or closes the block that ended there; True when the trial is over (every block timed)."""
        if (step - self.WARMUP) % (self.SETTLE + self.BLOCK) == self.SETTLE:
            self._started = now
        elif self._started is not None:
            self._pending.append((self.way(step - 1), self._started, now))
            self._started = None
        return self.resolve()

    def resolve(self) -> bool:
        """Times the closed blocks the device has finished, without waiting for the others; True when every block of
        the schedule is timed."""
        waiting = []
        for way, start, end in self._pending:
            if isinstance(end, torch.cuda.Event) and not end.query():
                waiting.append((way, start, end))
            else:
                self.times[way].append(_seconds(start, end) / self.BLOCK)
        self._pending = waiting
        return all(len(times) == self.ROUNDS for times in self.times.values())

    def choice(self) -> tuple:
        """The way kept, ``(prefetch, copy_engines)``."""
        median = {way: statistics.median(t) for way, t in self.times.items()}
        fastest = min(self.ways, key=lambda way: median[way])
        return fastest if median[fastest] < self.MARGIN * median[self.ways[0]] else self.ways[0]

    def summary(self) -> dict:
        """Milliseconds a step of each way: "with" (prefetch), "with, UVA row kernels" (prefetch without the copy
        engines, when tried), "without" (no prefetch)."""
        names = {}
        for prefetch, copy_engines in self.ways:
            uva = not copy_engines and any(ce for p, ce in self.ways if p)
            names[(prefetch, copy_engines)] = ("with" + (", UVA row kernels" if uva else "")) if prefetch else "without"
        return {names[way]: statistics.median(t) * 1e3 for way, t in self.times.items()}


def row_transfers(device, copy_engines: bool, max_sms: Optional[int] = None):
    """The transfer options of host tables' row work beside a model (prefetches, updates), as a ``with`` block for the
    calling thread: at most ``max_sms`` SMs (None: the process's setting), and on a GPU with ``copy_engines`` the rows
    moved by CPU threads and the copy engines in stream order (``stream_ordered_staging``). TrainPipeline and the
    Engram example's Trainer both set them so."""
    options = {} if max_sms is None else {"max_sms": max_sms}
    if copy_engines and torch.device(device).type == "cuda":
        options["stream_ordered_staging"] = 1
    return transfer_config_override(**options) if options else contextlib.nullcontext()


def prefetch_trial_steps(device, copy_engines: Union[bool, str] = "auto") -> int:
    """Steps of :class:`TrainPipeline`'s ``prefetch="auto"`` trial on ``device`` with ``copy_engines`` (three ways
    with "auto" on a GPU, else two)."""
    three = copy_engines == "auto" and torch.device(device).type == "cuda"
    return _PrefetchTrial.steps_for(3 if three else 2)


def _seconds(start: Union[float, torch.cuda.Event], end: Union[float, torch.cuda.Event]) -> float:
    """Seconds from ``start`` to ``end``: two clock readings, or two CUDA events (``end`` done: no wait)."""
    if isinstance(end, torch.cuda.Event):
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    return end - start


@dataclasses.dataclass
class _Staged:
    batch: Any
    ready: Optional[torch.cuda.Event]


def host_modules(model: torch.nn.Module) -> list:
    """The host-table modules ``model`` holds (HostEmbedding, its subclasses, HostEmbeddingBagCollection), in
    ``modules()`` order."""
    return [m for m in model.modules() if isinstance(m, (HostEmbedding, HostEmbeddingBagCollection))]


def _prefetch_is_collective(modules: list) -> bool:
    """Whether a host module's prefetch may exchange ids with other ranks (a distributed table's): then every rank
    must prefetch, or none. Other tables' trials decide on each rank alone (no collective a rank must reach)."""
    return any(getattr(m, "_prefetch_is_collective", False) for m in modules)


def _agreed(prefetch: bool, device: torch.device) -> bool:
    """A trial's choice, the same on every rank of the default process group when there is one (a distributed
    table's prefetch exchanges ids: every rank must prefetch, or none): with prefetch only where all chose it."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return prefetch
    on = device if "nccl" in str(torch.distributed.get_backend()) else torch.device("cpu")
    flag = torch.tensor([int(prefetch)], device=on)
    torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MIN)
    return bool(flag.item())


def _prefetch_is_local(modules: list) -> bool:
    """Whether every host module's prefetch may run beside the backward on another thread: plain HostEmbeddings,
    tables that grow and collections of them, each updated at step() (a table updated in backward changes the rows a
    prefetch reads and its prefetch slot; another subclass's prefetch may exchange ids with other ranks). A growing
    table's prefetch maps the ids in its IdIndex (which locks itself; its backward does not read the index, and its
    forward, which admits and evicts, is over before the backward starts)."""
    from .nn.dynamic_embedding import DynamicHostEmbedding

    local = (HostEmbedding, DynamicHostEmbedding)
    tables = _tables_of(modules)
    return bool(tables) and all(type(m) in local + (HostEmbeddingBagCollection,) for m in modules) and \
        all(type(t) in local and t.update == "step" for t in tables)


def _tables_of(modules: list) -> list:
    """The HostEmbeddings that step: each HostEmbedding of ``modules``, and the groups of each collection."""
    out = {}
    for m in modules:
        for table in m.groups if isinstance(m, HostEmbeddingBagCollection) else [m]:
            out.setdefault(id(table), table)
    return list(out.values())


def move_batch(batch, device: torch.device, non_blocking: bool = False):
    """``batch`` on ``device``: tensors, objects with ``to``, and tuples / lists / dicts / dataclasses of them."""
    if isinstance(batch, torch.Tensor) or (hasattr(batch, "to") and not isinstance(batch, type)):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, (list, tuple)):
        moved = [move_batch(b, device, non_blocking) for b in batch]
        return type(batch)(*moved) if hasattr(batch, "_fields") else type(batch)(moved)
    if isinstance(batch, dict):
        return {k: move_batch(v, device, non_blocking) for k, v in batch.items()}
    if dataclasses.is_dataclass(batch):
        return dataclasses.replace(batch, **{f.name: move_batch(getattr(batch, f.name), device, non_blocking)
                                             for f in dataclasses.fields(batch)})
    return batch


def _record_stream(batch, stream) -> None:
    if isinstance(batch, torch.Tensor):
        if batch.is_cuda:
            batch.record_stream(stream)
    elif hasattr(batch, "record_stream"):
        batch.record_stream(stream)
    elif isinstance(batch, (list, tuple)):
        for b in batch:
            _record_stream(b, stream)
    elif isinstance(batch, dict):
        for b in batch.values():
            _record_stream(b, stream)
    elif dataclasses.is_dataclass(batch):
        for f in dataclasses.fields(batch):
            _record_stream(getattr(batch, f.name), stream)


def _resolved_max_sms(max_sms: Union[int, str, None], device: torch.device, tables: list) -> Optional[int]:
    """TrainPipeline's ``max_sms``: "auto" is a quarter of the GPU's SMs (None on the CPU, when every table is in
    GPU memory: nothing runs beside the model there, and a bound would only slow the steps on the main stream, and
    when the process has a bound of its own, ``set_transfer_config(max_sms=...)`` or ``SPEEDTORCH_MAX_SMS``)."""
    if max_sms == "auto":
        if device.type != "cuda" or all(t.placement == "gpu" for t in tables) or \
                torch.ops.speedtorch.get_transfer_option("max_sms") > 0:
            return None
        return max(1, torch.cuda.get_device_properties(device).multi_processor_count // 4)
    if max_sms is not None and (isinstance(max_sms, bool) or not isinstance(max_sms, int) or max_sms < 0):
        raise ValueError(f"TrainPipeline: max_sms must be 'auto', None or an int >= 0 (0: every SM), got {max_sms!r}")
    return max_sms
