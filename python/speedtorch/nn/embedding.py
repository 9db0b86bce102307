"""``speedtorch.nn.HostEmbedding``: a drop-in for ``nn.Embedding`` / ``nn.EmbeddingBag`` whose table and optimizer
state live in a :class:`speedtorch.PinnedEmbedding` in pinned host RAM (or, by ``placement``, in GPU memory, or split:
the hottest rows on the GPU and the rest in host RAM; speedtorch/placement.py).

Forward gathers the batch's distinct rows to the compute device; backward yields one summed gradient per distinct
row, kept as the table parameter's ``grad`` (a sparse COO tensor, as ``nn.Embedding(sparse=True)``'s:
speedtorch/table_parameter.py) until the update, which runs fused on the host-resident rows and their state
(``speedtorch::row_optimizer_step_``, told that the ids are torch.unique's, ``sorted_unique=True``, so it does not
de-duplicate them again), either inside backward (``update="backward"``, as FBGEMM's TBE does) or at a step: of
:class:`speedtorch.optim.HostEmbeddingOptimizer` (a ``torch.optim.Optimizer``, which LR schedulers, ``GradScaler`` and
:class:`speedtorch.optim.CombinedOptimizer` drive like any other), or :meth:`HostEmbedding.step`. Only the batch's
rows ever occupy GPU memory. docs/training.md shows the standard loop; docs/api.md lists every method.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import math
import weakref
from multiprocessing.reduction import ForkingPickler
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F

from .._interrupt import run_interruptible
from .._library import PinnedEmbedding
from .._phases import phase
from ..ops import check_indices, deferred_index_checks, transfers_without_the_host, unique_indices
from ._prefetched_rows import PrefetchedRows
from ._table_parameter import HostTableParameter, add_rows_gradient, rows_gradient
from ._table_state import (adopt_options, checked_extra_state, copy_table_entries, entry_shapes, load_table_entries,
                          set_table_extra_state, table_entries, table_extra_state)
from .placement import DeviceTable, HybridTable

__all__ = ["HostEmbedding"]

_UNSET = "__unset__"  # optimizer= not given: "adam" for a new table, the table's own (or none) for a given one
_BAG_MODES = ("sum", "mean", "max")
_HALF_TYPES = (torch.float16, torch.bfloat16)


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


def _as_ids(value, what: str) -> torch.Tensor:
    """Ids as a tensor: tensors pass; NumPy arrays and (nested) lists of ints become int64 tensors."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "iu":
            raise TypeError(f"HostEmbedding: {what} must be integers, got a NumPy array of {value.dtype}")
        return torch.from_numpy(value.astype(np.int64, copy=False))
    try:
        out = torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError) as e:
        raise TypeError(f"HostEmbedding: {what} must be a tensor, a NumPy array or a list of ints, got "
                        f"{type(value).__name__}") from e
    if out.is_floating_point() or out.is_complex() or out.dtype == torch.bool:
        raise TypeError(f"HostEmbedding: {what} must be integers, got {out.dtype}")
    return out.to(torch.int64)


def _as_tensor(value):
    return value if value is None or isinstance(value, torch.Tensor) else torch.as_tensor(value)


_IS_EXPORTING = getattr(torch.compiler, "is_exporting", lambda: False)
_IS_DYNAMO_COMPILING = getattr(torch.compiler, "is_dynamo_compiling", lambda: False)


def _exporting() -> bool:
    """Whether torch.export traces without dynamo (non-strict, the default). Dynamo folds is_exporting() to True in
    every compile, torch.compile's included, so under dynamo this says no."""
    return _IS_EXPORTING() and not _IS_DYNAMO_COMPILING()


def _eager_forward_outside_graph(reason: str):
    """The module's eager forward behind a graph break (torch.compiler.disable), telling dynamo ``reason`` where it
    takes one (fullgraph=True's refusal shows it)."""
    disable = torch.compiler.disable
    if "reason" in inspect.signature(disable).parameters:
        disable = disable(reason=reason)

    @disable
    def forward(module, input, offsets, per_sample_weights):
        return module._forward_eager(input, offsets, per_sample_weights)

    return forward


# Under torch.compile, a HostEmbedding that trains runs eagerly: its backward hands the rows' gradient to the module
# (a side effect no graph holds). The compiled graph breaks around it.
_forward_outside_graph = _eager_forward_outside_graph(
    "speedtorch.nn.HostEmbedding: a lookup that trains the table runs outside the graph (its backward hands the rows' "
    "gradient to the module, a side effect no graph holds), which fullgraph=True refuses; compile without "
    "fullgraph=True, or look up without a gradient (torch.no_grad(), eval(), a frozen table). docs/training.md, "
    "Compilers")
# The same graph break for rows that no tensor holds.
_forward_untensored_outside_graph = _eager_forward_outside_graph(
    "speedtorch.nn.HostEmbedding: the rows of placement='hybrid' (its row cache) or of a DistributedHostEmbedding are "
    "in no tensor a graph can hold: the lookup runs outside the graph, which fullgraph=True refuses; compile without "
    "fullgraph=True, or use placement='host' or 'gpu'. docs/training.md, Compilers")


class HostEmbedding(torch.nn.Module):
    """An embedding table of ``num_embeddings x embedding_dim`` in pinned host memory, trained by a fused optimizer.

    Takes ``nn.Embedding``'s arguments (``padding_idx``, ``max_norm``, ``norm_type``, ``scale_grad_by_freq``;
    ``sparse`` is accepted and ignored: the gradient is always sparse) and, with ``mode``, ``nn.EmbeddingBag``'s
    (``include_last_offset``; ``offsets`` and ``per_sample_weights`` in forward). Ids may be tensors of any shape
    (int32/int64, any device), NumPy arrays or lists.

    Args:
        num_embeddings, embedding_dim: table size. ``num_embeddings=None`` with ``capacity=`` builds a table that
            grows over raw int64 ids of any value (:class:`speedtorch.nn.dynamic_embedding.DynamicHostEmbedding`,
            docs/dynamic_tables.md).
        padding_idx: this row gets no gradient (and is never updated); a new table starts with it zero. In bags its
            entries are left out (``nn.EmbeddingBag``'s rule).
        max_norm, norm_type: rows looked up whose ``norm_type``-norm exceeds ``max_norm`` are scaled down to it, in
            the table (``nn.Embedding``'s renormalisation; a compiled or exported graph returns them scaled but
            leaves the table as it was: docs/training.md, Compilers).
        scale_grad_by_freq: each id's gradient divided by its count in the batch.
        mode: ``None`` for ``nn.Embedding`` behaviour, ``"sum"``, ``"mean"`` or ``"max"`` for ``nn.EmbeddingBag``.
        include_last_offset: bags: ``offsets`` has one more entry, the end of the last bag.
        optimizer: ``"sgd"``, ``"adagrad"``, ``"adam"`` (the default for a new table), ``"adamw"``, ``"adamax"``,
            ``"rmsprop"``, ``"adadelta"``, ``"asgd"`` or ``"rprop"`` (torch.optim's math, applied lazily to the
            touched rows), ``"rowwise_adagrad"`` (FBGEMM's row-wise Adagrad: one float of state per row; options
            ``lr``, ``eps`` (1e-8), ``weight_decay``, ``initial_accumulator_value``), ``"rowwise_adam"`` (FBGEMM's
            partial row-wise Adam: Adam's first moment per element, its second one float per row; options ``lr``,
            ``beta1``, ``beta2``, ``eps``, ``weight_decay``), or ``None``: a frozen table (no optimizer state, no
            gradient; e.g. pretrained vectors). With ``table=``, not given: the table's own optimizer, or none.
        optimizer_options: torch.optim's hyper-parameters by name (``betas`` as ``beta1``/``beta2``; booleans as
            0/1), e.g. ``{"lr": 1e-3, "weight_decay": 0.0}``; ``per_row_step=1`` for per-row bias correction;
            ``stochastic_rounding`` (0/1) rounds updated float16/bfloat16 weights stochastically (the default for
            16-bit tables: rounding to nearest loses every update smaller than half a step of the format).
            :class:`speedtorch.optim.HostEmbeddingOptimizer` changes them between steps (LR schedules).
        update: ``"step"`` (gradients wait for a step) or ``"backward"`` (applied as backward reaches the rows; then
            neither GradScaler nor zero_grad can act on them: a GradScaler stepping a
            :class:`speedtorch.optim.HostEmbeddingOptimizer` that holds such a table raises, since the update it
            applied used the scaled gradient).
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
            The API and the math are the same for all three, bit for bit. docs/placement.md says which to choose.
        cache_rows: for ``"hybrid"``: how many rows the cache holds (at least; whole sets of 32).
        hot_fraction: for ``"hybrid"`` without ``cache_rows``: the cache's size as a share of the rows.
        hot_rows: for ``"hybrid"`` without ``cache_rows`` or ``hot_fraction``: ids to load into the cache first (its
            size is their count); afterwards the cache follows the ids used (least recently used rows leave).
        table: an existing table to wrap instead of a new one (a :class:`speedtorch.PinnedEmbedding`, e.g. from
            :meth:`PinnedEmbedding.load` or :meth:`PinnedEmbedding.open`, or a placement table); its optimizer, if
            configured, is kept, and it is not re-initialised.

    The table is the module's ``weight``, a :class:`speedtorch.nn.HostTableParameter` (shares the table's memory;
    ``named_parameters()`` and ``state_dict()`` show it) whose ``grad`` holds the rows' gradient until the update.
    With ``placement="hybrid"`` the parameter is a placeholder on the meta device (a tensor kept over the host rows
    would keep the row cache from working); ``weight`` and ``state_dict()`` hand out the rows themselves, and its
    ``detach()`` raises (``torch.optim.swa_utils.AveragedModel`` would otherwise average nothing).

    ``load_state_dict`` takes this module's checkpoints and ``nn.Embedding``'s (``weight`` alone): see
    :meth:`_load_from_state_dict`.
    """

    # TorchScript compiles properties unless told not to; `weight` syncs placements in Python.
    __jit_unused_properties__ = ["weight"]
    # What pickling and copying leave out (streams, events, pending work): rebuilt by _init_runtime_state. A subclass
    # with runtime attributes of its own adds them here and resets them there.
    _runtime_attributes = ("_table_param", "_anchor", "_prefetched", "_taken", "_written", "_side_stream",
                           "_rows_stream", "_update_stream")
    # On a GPU, run every update of the host table on the module's update stream (not only those a prefetch lets run
    # beside the next forward): readers wait for the module's write event (NgramHashEmbedding's rows set it).
    async_update = False
    # Tests set this to run, on the CPU, the GPU's way of keeping rows read ahead exact (PrefetchedRows.advance);
    # on the CPU a prefetch reads synchronously, so there is no update to run beside the next forward.
    _advance_on_cpu = False

    def __new__(cls, *args, **kwargs):
        # HostEmbedding(None, dim, capacity=...): a table that grows, taking raw int64 ids
        # (speedtorch.nn.dynamic_embedding.DynamicHostEmbedding, docs/dynamic_tables.md).
        if cls is HostEmbedding and (args or "num_embeddings" in kwargs) and \
                (args[0] if args else kwargs["num_embeddings"]) is None:
            from .dynamic_embedding import DynamicHostEmbedding
            cls = DynamicHostEmbedding
        return super().__new__(cls)

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        padding_idx: Optional[int] = None,
        max_norm: Optional[float] = None,
        norm_type: float = 2.0,
        scale_grad_by_freq: bool = False,
        sparse: bool = True,  # noqa: ARG002 (nn.Embedding's; the gradient is always sparse)
        *,
        mode: Optional[str] = None,
        include_last_offset: bool = False,
        optimizer: Optional[str] = _UNSET,
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
        if mode not in (None, *_BAG_MODES):
            raise ValueError(f"HostEmbedding: mode must be None, 'sum', 'mean' or 'max', got {mode!r}")
        if update not in ("step", "backward"):
            raise ValueError(f"HostEmbedding: update must be 'step' or 'backward', got {update!r}")
        if include_last_offset and mode is None:
            raise ValueError("HostEmbedding: include_last_offset needs mode='sum', 'mean' or 'max'")
        if padding_idx is not None:
            if not -num_embeddings <= padding_idx < num_embeddings:
                raise ValueError(f"HostEmbedding: padding_idx must be within [-{num_embeddings}, {num_embeddings}), "
                                 f"got {padding_idx}")
            padding_idx = padding_idx % num_embeddings
        if max_norm is not None and not max_norm > 0:
            raise ValueError(f"HostEmbedding: max_norm must be > 0, got {max_norm}")
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.padding_idx = padding_idx
        self.max_norm = None if max_norm is None else float(max_norm)
        self.norm_type = float(norm_type)
        self.scale_grad_by_freq = bool(scale_grad_by_freq)
        self.mode = mode
        self.include_last_offset = bool(include_last_offset)
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
                raise ValueError("HostEmbedding: placement='gpu' wraps a speedtorch.nn.placement.DeviceTable")
            self.table = table
            if optimizer not in (_UNSET, None) and not table.optimizer():
                table.set_optimizer(optimizer, _options(optimizer_options, table.table().dtype),
                                    state_beside_rows and table.mapping() == "")
        else:
            if placement == "gpu":
                self.table = DeviceTable(num_embeddings, embedding_dim, dtype, self.device)
            else:
                self.table = PinnedEmbedding(num_embeddings, embedding_dim, dtype)
            if optimizer == _UNSET:
                optimizer = "adam"
            if optimizer is not None:
                # Optimizer first, while the table is still empty: its rows move into the new layout cheaply.
                self.table.set_optimizer(optimizer, _options(optimizer_options, dtype), state_beside_rows)
            self.table.normal_(0.0, init_std, seed)
            if padding_idx is not None:
                self.table.scatter_(torch.tensor([padding_idx]), torch.zeros(1, embedding_dim, dtype=dtype))
        # Trains when the table has an optimizer and optimizer=None did not freeze it.
        self.trains = optimizer is not None and bool(self.table.optimizer())
        # Counts set_optimizer calls, so that a HostEmbeddingOptimizer holding the table takes the new options.
        self._optimizer_generation = 0
        self._init_runtime_state()  # before the row cache: handing out the table's tensor empties a cache
        # What forward returns its rows as: the table's dtype until a conversion (model.half(), ...) changes it.
        self.output_dtype = self._table_param.dtype
        if placement == "hybrid" and not isinstance(self.table, HybridTable):
            if isinstance(self.table, DeviceTable):
                raise ValueError("HostEmbedding: placement='hybrid' needs a speedtorch.PinnedEmbedding table")
            self.table.enable_cache(_cache_size(num_embeddings, cache_rows, hot_rows, hot_fraction), self.device)
            if hot_rows is not None:
                self.set_hot_rows(hot_rows)

    def _init_runtime_state(self) -> None:
        """The table parameter and what lives only while the module runs (not saved, pickled or copied)."""
        data = self._parameter_data()
        param = (_RowCachePlaceholder if data.is_meta else HostTableParameter)(data)
        param._grad_shape = (self.num_embeddings, self.embedding_dim)
        param._owner = weakref.ref(self)  # its requires_grad_ freezes this module (model.requires_grad_(False))
        object.__setattr__(self, "_table_param", param)  # a plain reference, for the code paths below
        if self._registers_weight():
            # Straight into the dict: nn.Module.register_parameter would see the `weight` property as a clash.
            self._parameters["weight"] = param
        # Autograd only runs a Function's backward when an input needs a gradient: this empty tensor is that input.
        self._anchor = torch.zeros(0, requires_grad=True)
        self._prefetched: Optional[PrefetchedRows] = None  # the next forward's rows, read ahead (prefetch)
        self._taken: Optional[PrefetchedRows] = None  # the last forward's, when read ahead with their state
        self._written: Optional[torch.cuda.Event] = None  # after the module's last write of the table (on a GPU)
        self._side_stream = None
        self._rows_stream = None
        self._update_stream = None

    def _registers_weight(self) -> bool:
        """Whether the table is one of the module's parameters (DistributedHostEmbedding's is not: see there)."""
        return True

    def _parameter_data(self) -> torch.Tensor:
        """The tensor the table parameter wraps: the table itself, except with a row cache (placement="hybrid"),
        where a tensor kept over the host rows would make the cache stand aside for good (docs/persistence.md):
        there it is a placeholder of the table's shape and dtype on the meta device, and ``weight`` hands out the
        rows."""
        if self.placement == "hybrid":
            dtype = self.table.table().dtype  # a tensor dropped at once: the cache is not held back
            return torch.empty(self.num_embeddings, self.embedding_dim, dtype=dtype, device="meta")
        return self.table.table()

    def extra_repr(self) -> str:
        """The sizes and options printed in the module's repr."""
        optimizer = self.table.optimizer() if self.trains else None
        out = (f"{self.num_embeddings}, {self.embedding_dim}, mode={self.mode}, optimizer={optimizer}, "
               f"update={self.update}, device={self.device}, placement={self.placement}")
        for name in ("padding_idx", "max_norm"):
            if getattr(self, name) is not None:
                out += f", {name}={getattr(self, name)}"
        if self.include_last_offset:
            out += ", include_last_offset=True"
        if self.output_dtype != self._table_param.dtype:
            out += f", output_dtype={self.output_dtype}"
        return out

    # --- construction from pretrained rows --------------------------------------------------------------------------

    @classmethod
    def from_pretrained(cls, embeddings, freeze: bool = True, padding_idx: Optional[int] = None,
                        max_norm: Optional[float] = None, norm_type: float = 2.0, scale_grad_by_freq: bool = False,
                        sparse: bool = True, **kwargs) -> "HostEmbedding":
        """``nn.Embedding.from_pretrained`` (and ``nn.EmbeddingBag``'s, with ``mode=``): a table holding
        ``embeddings`` (a 2-D tensor or NumPy array, copied into pinned memory), frozen unless ``freeze=False``
        (then trained by ``optimizer``, Adam by default). ``kwargs`` are the constructor's (``mode``, ``device``,
        ``optimizer``, ``placement``, ...); the dtype is the rows' (float32 for other types)."""
        rows = torch.as_tensor(embeddings)
        if rows.dim() != 2:
            raise ValueError(f"HostEmbedding.from_pretrained: embeddings must be 2-D, got shape {tuple(rows.shape)}")
        dtype = kwargs.pop("dtype", rows.dtype if rows.dtype in (torch.float32, *_HALF_TYPES) else torch.float32)
        optimizer = kwargs.pop("optimizer", "adam")
        options = kwargs.pop("optimizer_options", None)
        beside = kwargs.pop("state_beside_rows", True)
        placement = kwargs.get("placement", "host")
        device = kwargs.get("device") or ("cuda" if torch.cuda.is_available() else "cpu")
        table = DeviceTable(*rows.shape, dtype, device) if placement == "gpu" else PinnedEmbedding(*rows.shape, dtype)
        if not freeze:
            table.set_optimizer(optimizer, _options(options, dtype), beside)
        table.copy_(rows)
        return cls(rows.shape[0], rows.shape[1], padding_idx, max_norm, norm_type, scale_grad_by_freq, sparse,
                   table=table, optimizer=None if freeze else _UNSET, **kwargs)

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
        # The table parameter is the table: nn.Module._apply would convert (copy) it. It stays out of the walk.
        param = self._parameters.pop("weight", None)
        try:
            out = super()._apply(fn, recurse)
        finally:
            if param is not None:
                self._parameters["weight"] = param
        if converted.device != self.device:  # the streams, events and rows read ahead belong to the old device
            self._sync_for_host_access()
            self._prefetched = self._taken = self._written = None
            self._side_stream = self._rows_stream = self._update_stream = None
        self.device = converted.device
        self.output_dtype = converted.dtype
        return out

    def requires_grad_(self, requires_grad: bool = True) -> "HostEmbedding":
        """Freezes (``False``) or unfreezes the table, as ``requires_grad_`` does an ``nn.Embedding``'s weight: while
        frozen (:attr:`trains` False) forward hands no gradient to it and no update reaches it.
        ``model.requires_grad_()`` reaches it too, through the table parameter (whose own flag stays False: the fused
        optimizer, not autograd, trains the table). A table without an optimizer stays frozen: nothing would train
        it."""
        self._set_trains(requires_grad)
        return super().requires_grad_(requires_grad)

    def _set_trains(self, requires_grad: bool) -> None:
        self.trains = bool(requires_grad) and bool(self.table.optimizer())

    # --- forward / backward -------------------------------------------------------------------------------------

    def forward(self, input: torch.Tensor, offsets: Optional[torch.Tensor] = None,
                per_sample_weights: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Rows for ``input`` (ids of any shape: ``input.shape + (embedding_dim,)`` on ``device``), or with ``mode``
        one pooled row per bag (``offsets`` / ``per_sample_weights`` as ``nn.EmbeddingBag``'s). While the module
        trains, backward leaves the rows' gradient in ``weight.grad`` for the next step."""
        if torch.jit.is_scripting():
            return self._lookup_scripted(input, offsets, per_sample_weights)
        else:
            return self._forward_python(input, offsets, per_sample_weights)

    @torch.jit.unused
    def _forward_python(self, input: torch.Tensor, offsets: Optional[torch.Tensor],
                        per_sample_weights: Optional[torch.Tensor]) -> torch.Tensor:
        if torch.compiler.is_compiling():
            if self._traceable():
                return self._lookup_traceable(input, offsets, per_sample_weights)
            if not self._rows_in_a_tensor():
                if _exporting():
                    raise RuntimeError(self._not_exportable())
                return _forward_untensored_outside_graph(self, input, offsets, per_sample_weights)
            return _forward_outside_graph(self, input, offsets, per_sample_weights)
        return self._forward_eager(input, offsets, per_sample_weights)

    @torch.jit.unused
    def _forward_eager(self, input, offsets, per_sample_weights) -> torch.Tensor:
        input = _as_ids(input, "ids")
        offsets, per_sample_weights = _as_tensor(offsets), _as_tensor(per_sample_weights)
        if self.mode is None and (offsets is not None or per_sample_weights is not None):
            raise ValueError("HostEmbedding: offsets and per_sample_weights need mode='sum', 'mean' or 'max'")
        unique, inverse, rows = self._lookup(input)
        if self.mode is None:
            if rows.device.type == "cpu" and not self.scale_grad_by_freq:
                # The same rows through speedtorch's gather, whose CPU backward sums them into the distinct rows on
                # the calling thread: embedding's walks every index with a TensorIterator per row, and index_select's
                # (index_add_) wakes every thread even for a small batch (bench/RESULTS.md, CPU runs).
                return torch.ops.speedtorch.gather(rows, inverse, None)
            return F.embedding(inverse, rows, scale_grad_by_freq=self.scale_grad_by_freq)
        return self._bags(unique, inverse, rows, offsets, per_sample_weights)

    def _lookup(self, input: torch.Tensor):
        """(distinct ids, where each id's row is, the distinct rows): renormalised (``max_norm``), handing their
        gradient to the module while it trains, in :attr:`output_dtype`. forward's part before pooling."""
        pending = self._prefetched
        unique, inverse, rows = self._rows_for(input)
        # Rows read ahead with their state: the step of these very rows may run where they are (_apply_gradients).
        taken = pending is not None and pending.key is input and pending.state is not None
        self._taken = pending if taken and self.max_norm is None else None
        if self.max_norm is not None:
            rows = self._renormed(unique, rows)
        with phase("gather"):  # the rows' handing on, and in backward their gradient's
            if self.trains and torch.is_grad_enabled():
                rows = _HostRows.apply(self._anchor, self, unique, rows)
            rows = rows.to(self.output_dtype)  # a no-op unless a conversion (model.half(), ...) chose another dtype
        return unique, inverse, rows

    def _bags(self, unique, inverse, rows, offsets, per_sample_weights):
        if offsets is not None:
            offsets = offsets.to(self.device)
        if per_sample_weights is not None:  # embedding_bag wants them in the rows' dtype
            per_sample_weights = per_sample_weights.to(self.device, rows.dtype)
        padding = None
        if self.padding_idx is not None:
            # Entries of padding_idx leave their bags: they point at an extra zero row that embedding_bag skips.
            padding = rows.shape[0]
            inverse = torch.where(unique[inverse] == self.padding_idx, padding, inverse)
            rows = torch.cat([rows, rows.new_zeros(1, rows.shape[1])])
        return F.embedding_bag(inverse, rows, offsets, scale_grad_by_freq=self.scale_grad_by_freq, mode=self.mode,
                               per_sample_weights=per_sample_weights, include_last_offset=self.include_last_offset,
                               padding_idx=padding)

    @torch.no_grad()
    def _renormed(self, unique: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        # nn.Embedding's max_norm: rows above it are scaled to it in the table itself, before the lookup.
        norms = torch.linalg.vector_norm(rows.float(), self.norm_type, dim=1, keepdim=True)
        scale = torch.where(norms > self.max_norm, self.max_norm / (norms + 1e-7), torch.ones_like(norms))
        if not bool((scale != 1).any()):
            return rows
        rows = (rows.float() * scale).to(rows.dtype)
        self._wait_for_writes()  # an update still running may write these rows
        self.table.scatter_(unique, rows)
        if self._prefetched is not None:
            self._prefetched.patch(unique, rows)
        self._note_write()
        return rows

    def _rows_for(self, input: torch.Tensor, read=None):
        # (unique, inverse, rows); `read(unique)` in place of the table's gather (the prefetch's rows and state).
        pending, self._prefetched = self._prefetched, None  # a prefetch is for the next forward only
        if pending is not None and pending.key is input:
            return pending.take()
        self._wait_for_writes()
        with phase("dedup"):
            ids = input.to(self.device, non_blocking=True)
            unique, inverse = unique_indices(ids)  # torch.unique(sorted=True, return_inverse=True); faster on the CPU
        try:
            with phase("gather"):
                return unique, inverse, (read or (lambda u: self.table.gather(u, self.device)))(unique)
        except IndexError:  # it names a position among the distinct ids: name the caller's instead
            named = _out_of_range_in(ids, self.num_embeddings, type(self).__name__)
            if named is None:
                raise
            raise named from None

    def _traceable(self) -> bool:
        # What torch.compile / torch.export can hold in a graph: a lookup that hands no gradient to the module, over
        # a table that is a tensor (host or gpu placement; hybrid rows may sit in the cache).
        no_gradient = _exporting() or not self.trains or not self.training or not torch.is_grad_enabled()
        return no_gradient and self._rows_in_a_tensor()

    def _rows_in_a_tensor(self) -> bool:
        return self.placement in ("host", "gpu") and self._registers_weight()

    def _not_exportable(self) -> str:
        if self._registers_weight():
            what, rows, copy_ = ("a HostEmbedding with placement='hybrid'", "the row cache's rows",
                                 "HostEmbedding.from_pretrained(module.weight, ...), or module.save(path) and "
                                 "HostEmbedding.load(path, placement='host')")
        else:
            what, rows, copy_ = (type(self).__name__, "its rows (shared memory of the process group)",
                                 "a HostEmbedding loaded from its torch.distributed.checkpoint, docs/distributed.md")
        return (f"torch.export of {what} is not supported: {rows} are in no tensor the exported program can hold. "
                f"Export a copy with placement='host' or 'gpu' instead ({copy_}), or keep this lookup out of the "
                f"exported module (docs/training.md, Compilers)")

    def _lookup_traceable(self, input, offsets, per_sample_weights):
        ids = input.to(self.device)
        # Detached: no dense (num_embeddings x dim) gradient, even if something set the parameter's requires_grad.
        rows = torch.ops.speedtorch.gather(self._parameters["weight"].detach(), ids, self.device)
        if self.max_norm is not None:
            # The rows come back renormalised, as eager's; the graph does not write them into the table (in place,
            # a graph can only do that by copying the whole table): the stored rows stay as they were.
            norms = torch.linalg.vector_norm(rows.float(), self.norm_type, dim=-1, keepdim=True)
            scale = torch.where(norms > self.max_norm, self.max_norm / (norms + 1e-7), torch.ones_like(norms))
            rows = (rows.float() * scale).to(rows.dtype)
        rows = rows.to(self.output_dtype)
        if self.mode is None:
            return rows
        flat = rows.reshape(-1, self.embedding_dim)
        positions = torch.arange(flat.shape[0], device=self.device).reshape(ids.shape)
        return self._bags(ids.reshape(-1), positions, flat, offsets, per_sample_weights)

    def _lookup_scripted(self, input: torch.Tensor, offsets: Optional[torch.Tensor],
                         per_sample_weights: Optional[torch.Tensor]) -> torch.Tensor:
        # The forward of torch.jit.script(module): the lookup of the eager forward (no gradient reaches the table;
        # a scripted training loop calls self.table.apply_gradients itself, docs/torchscript.md).
        ids = input.to(self.device)
        unique, inverse = torch.unique(ids, sorted=True, return_inverse=True)
        rows = self.table.gather(unique, self.device)
        max_norm = self.max_norm
        if max_norm is not None:
            norms = torch.linalg.vector_norm(rows.float(), self.norm_type, dim=1, keepdim=True)
            scale = torch.where(norms > max_norm, max_norm / (norms + 1e-7), torch.ones_like(norms))
            rows = (rows.float() * scale).to(rows.dtype)
            self.table.scatter_(unique, rows)
        rows = rows.to(self.output_dtype)
        mode = self.mode
        if mode is None:
            return F.embedding(inverse, rows)
        if offsets is not None:
            offsets = offsets.to(self.device)
        if per_sample_weights is not None:
            per_sample_weights = per_sample_weights.to(self.device, rows.dtype)
        padding: Optional[int] = None
        padding_idx = self.padding_idx
        if padding_idx is not None:
            padding = rows.shape[0]
            inverse = torch.where(unique[inverse] == padding_idx, rows.shape[0], inverse)
            rows = torch.cat([rows, torch.zeros(1, rows.shape[1], dtype=rows.dtype, device=rows.device)])
        return F.embedding_bag(inverse, rows, offsets, mode=mode, per_sample_weights=per_sample_weights,
                               include_last_offset=self.include_last_offset, padding_idx=padding)

    def __prepare_scriptable__(self):
        # torch.jit.script calls this first: only a PinnedEmbedding (host or hybrid placement) is a TorchScript class.
        if not isinstance(self.table, torch.ScriptObject) or not self._registers_weight():
            raise RuntimeError(f"torch.jit.script(HostEmbedding): the {type(self.table).__name__} of "
                               f"placement={self.placement!r} is a Python object TorchScript cannot hold; script a "
                               f"host or hybrid placement (a speedtorch.PinnedEmbedding), or use torch.compile / "
                               f"torch.export")
        return self

    def _receive_gradient(self, unique: torch.Tensor, grad_rows: torch.Tensor) -> None:
        if self.padding_idx is not None:
            keep = unique != self.padding_idx
            if not bool(keep.all()):  # the padding row gets no gradient, as in nn.Embedding
                unique, grad_rows = unique[keep], grad_rows[keep]
        if unique.numel() == 0:
            return  # an empty batch: no update, no step counted
        if self.update == "backward":
            with phase("update"):
                self._apply_gradients(unique, grad_rows, sorted_unique=True)
            return
        # Float32 (the update computes in float32 anyway): GradScaler unscales float32 gradients only, and several
        # backward passes add up without 16-bit rounding. Contiguous: GradScaler unscales the values in place.
        grad_rows = grad_rows.to(torch.float32).contiguous()
        param = self._table_param
        param.grad = add_rows_gradient(param.grad, rows_gradient(unique, grad_rows, param.grad_shape, coalesced=True))

    def _apply_gradients(self, unique: torch.Tensor, grad_rows: torch.Tensor, sorted_unique: bool = False) -> None:
        # sorted_unique: `unique` is one forward's torch.unique(sorted=True) output, so the op need not de-duplicate
        # it again (it still checks the claim). A pending prefetch is kept exact (speedtorch/nn/_prefetched_rows.py):
        # advanced in GPU memory when it holds the rows' state, so the host table's update may run on a stream of
        # its own beside the next forward; else given the rows the step writes, or reading them again.
        # With stream-ordered staging (no SM for transfers), the step of the rows the last forward took from a
        # prefetch with their state runs on them where they are, by the same kernel, and the host table is only
        # written (one copy down by the copy engine, CPU threads writing the records): no row is read twice.
        # When both run, the prefetch takes the stepped rows and their state from the rows the step ran on (a copy of
        # the rows both batches hold) instead of running the optimizer again over its own: the same bits, since both
        # held the same rows and state before the step.
        pending = self._prefetched
        taken, self._taken = self._taken, None
        here = taken is not None and sorted_unique and taken.holds(unique) and self._writes_rows_back()
        ahead = pending is not None and pending.state is not None and sorted_unique and not here
        step = self.table.step_count() + 1
        if ahead:
            with self._checked_on_the_gpu(unique, sorted_unique):
                pending.advance(unique, grad_rows, self.table.optimizer(), self.table.optimizer_options(), step)
        if here:
            with self._checked_on_the_gpu(unique, sorted_unique):  # its positions are in range by construction
                taken.step(grad_rows, self.table.optimizer(), self.table.optimizer_options(), step)
            if pending is not None:
                pending.patch(unique, taken.rows, taken.state)
        on_its_stream = ahead or here or self.async_update
        stream = self.update_stream() if self.device.type == "cuda" and on_its_stream else None
        if stream is not None:
            stream.wait_stream(torch.cuda.current_stream(self.device))  # the gradients
        else:
            self._wait_for_writes()  # an earlier update on the update stream writes rows this one reads
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext(), \
                self._checked_on_the_gpu(unique, sorted_unique):
            if here:
                self.table.scatter_with_state_(unique, taken.rows, taken.state, step)
            elif ahead or pending is None:
                self.table.apply_gradients(unique, grad_rows, sorted_unique)
            elif sorted_unique and self._hands_back_updated_rows():
                updated = torch.empty(unique.numel(), self.embedding_dim, dtype=pending.rows.dtype,
                                      device=grad_rows.device)
                self.table.apply_gradients(unique, grad_rows, sorted_unique, updated)
                pending.patch(unique, updated)
            else:
                self.table.apply_gradients(unique, grad_rows, sorted_unique)
                pending.refresh(self.table, unique, self.device)
            self._note_write()
        if stream is not None:
            for t in (unique, grad_rows, *(taken.tensors() if here else ())):
                t.record_stream(stream)

    def _checked_on_the_gpu(self, unique: torch.Tensor, sorted_unique: bool):
        """For a step on distinct ids this module made on a GPU (torch.unique's, or a coalesced gradient's) over a
        pinned host table or a table in GPU memory: deferred index checks, so the kernels check the ids (range,
        order; a failure is flagged for speedtorch.check_index_errors and its row left alone) instead of the host
        reading them back: the step never waits for the GPU (with ``placement="gpu"`` that wait was 3.7 ms of a
        DLRM step on an H200, the GPU idle meanwhile). Anything else: the usual checks."""
        on_the_gpu = self._hands_back_updated_rows() or isinstance(self.table, DeviceTable)
        if sorted_unique and unique.is_cuda and on_the_gpu:
            return deferred_index_checks()
        return contextlib.nullcontext()

    def update_stream(self) -> torch.cuda.Stream:
        """The CUDA stream the host table's updates run on when they need not be waited for (made at first use)."""
        if self._update_stream is None:
            self._update_stream = torch.cuda.Stream(self.device)
        return self._update_stream

    def _wait_for_writes(self) -> None:
        """The current stream waits for the module's last write of the table (an update on its own stream)."""
        if self._written is not None:
            torch.cuda.current_stream(self.device).wait_event(self._written)

    def _updates_ahead(self) -> bool:
        """Whether a prefetch should read the rows' optimizer state too, so updates advance its rows in GPU memory
        (PrefetchedRows.advance): a pinned host table of this module's (not a row cache, HybridTable or a process
        group's), on a GPU, with an optimizer whose update does not depend on the row's place in the table (stochastic
        rounding draws its bits from the row id)."""
        on_device = self.device.type == "cuda" or HostEmbedding._advance_on_cpu
        if not (on_device and self.trains and self._hands_back_updated_rows()):
            return False
        return not self.table.optimizer_options().get("stochastic_rounding", 0.0)

    def _hands_back_updated_rows(self) -> bool:
        # A PinnedEmbedding without a row cache: its fused step can also write the new rows where the step runs.
        return (self.placement == "host" and self._registers_weight()
                and not isinstance(self.table, (DeviceTable, HybridTable)))

    def _note_write(self) -> None:
        """Marks, on a GPU, the point of the current stream after which the table holds the module's last write: a
        prefetch's gather waits for it (not for the rest of that stream)."""
        if self.device.type == "cuda":
            self._written = torch.cuda.Event()
            self._written.record(torch.cuda.current_stream(self.device))

    def _take_gradient(self):
        """The pending gradient as (ids, rows, ids are sorted and distinct), dropped from the parameter; None when
        there is none or it is empty."""
        param = self._table_param
        grad = param.grad
        param.grad = None
        if grad is None or grad._nnz() == 0:
            return None
        return grad._indices()[0], grad._values(), grad.is_coalesced()

    # --- optimizer -------------------------------------------------------------------------------------------------

    @torch.no_grad()
    def step(self) -> None:
        """Applies the gradients of every backward since the last step in one fused update (a row reached by several
        backward passes gets the sum of their gradients). Nothing to do with ``update="backward"``, for a frozen
        table, or when no row got a gradient (an empty batch does not count as a step)."""
        with phase("update"):
            taken = self._take_gradient()
            if taken is None:
                return
            ids, rows, sorted_unique = taken
            self._apply_gradients(ids, rows, sorted_unique=sorted_unique)

    def zero_grad(self, set_to_none: bool = True) -> None:  # noqa: ARG002 (nn.Module's signature)
        """Drops gradients not yet applied (``model.zero_grad()`` does the same through the ``weight`` parameter)."""
        super().zero_grad(set_to_none)
        self._table_param.grad = None

    def set_optimizer_options(self, options: dict) -> None:
        """Changes the table's optimizer hyper-parameters in place (the options :meth:`__init__` takes, given whole;
        state and step count kept): what :class:`speedtorch.optim.HostEmbeddingOptimizer` calls when a scheduler
        changed a param group."""
        self.table.set_optimizer_options({k: float(v) for k, v in options.items()})

    @torch.no_grad()
    def set_optimizer(self, optimizer: str, optimizer_options: Optional[dict] = None,
                      state_beside_rows: Optional[bool] = None) -> None:
        """Changes the table's optimizer (or options that change its state's layout: SGD's momentum from or to 0,
        ``amsgrad``, RMSprop's ``centered``): ``optimizer`` and ``optimizer_options`` as :meth:`__init__` takes
        them; the optimizer state starts afresh (zero) and the step count at 0. ``state_beside_rows``: the layout
        (default: the table's present one). The module's table parameter (``weight`` in ``parameters()``: what
        torch.compile, torch.export and ``AveragedModel`` read) follows the rows into their new memory, and a
        :class:`speedtorch.optim.HostEmbeddingOptimizer` holding the table takes the new optimizer and options at
        its next step. A table that had no optimizer starts training. Call this, not ``module.table.set_optimizer``,
        which the module cannot see (its parameter keeps the old rows until ``weight`` is read or a
        HostEmbeddingOptimizer steps it)."""
        if not hasattr(self.table, "set_optimizer") or isinstance(self.table, HybridTable):
            raise RuntimeError(f"{type(self).__name__}.set_optimizer: a {type(self.table).__name__} keeps the "
                               f"optimizer it was built with; build the table anew with this one")
        if state_beside_rows is None:  # the present layout; without an optimizer, the constructor's default
            weight = self.table.table()
            state_beside_rows = weight.stride(0) != weight.shape[1] if self.table.optimizer() else \
                self.table.mapping() == ""
            del weight
        had_optimizer = bool(self.table.optimizer())
        self._sync_for_host_access()
        self.table.set_optimizer(optimizer, _options(optimizer_options, self._table_param.dtype),
                                 bool(state_beside_rows))
        self._sync_weight()
        self._optimizer_generation = getattr(self, "_optimizer_generation", 0) + 1
        if not had_optimizer:
            self.trains = True

    # --- prefetch -------------------------------------------------------------------------------------------------

    def prefetch(self, next_input: torch.Tensor) -> None:
        """Starts reading the distinct rows of the next batch (on a side stream on a GPU) while this step computes; pass
        the same ids object to the next forward, which takes them. A prefetch is for the next forward only: a forward
        with other ids drops it (:meth:`drop_prefetch` does too). Exact: the ids are read once the module's earlier
        writes of the table are done, and every update (or ``max_norm`` renormalisation) after the prefetch hands it
        the rows it changes (speedtorch/nn/_prefetched_rows.py), so the forward sees what the plain loop would.

        On a GPU the side stream waits for the current stream's work queued so far (what made ``next_input``) and for
        the module's last write, nothing else; the host waits only for the distinct ids to be counted there. With
        ``placement="gpu"`` nothing is read ahead: the rows are in GPU memory already."""
        self._prefetched = None
        if self.placement == "gpu":
            return
        if self.device.type != "cuda":
            unique, inverse, (rows, state) = self._rows_for(next_input, self._rows_ahead)
            self._prefetched = PrefetchedRows(next_input, unique, inverse, rows, None, state)
            return
        current = torch.cuda.current_stream(self.device)
        counting, side = self.side_stream(), self._gather_stream()
        counting.wait_stream(current)
        with torch.cuda.stream(counting), phase("dedup"):
            ids = next_input.to(self.device, non_blocking=True)
            unique, inverse = unique_indices(ids)  # the host waits here, for the counting stream's work only
            # The distinct ids' ends bound them all: one small check before waiting for the table's writes, then a
            # gather that need not wait for the host again. (A table of the process group checks in its gather, which
            # tells every rank.)
            checked = self.placement == "host" and self._registers_weight()
            if checked and unique.numel():
                try:
                    check_indices(unique[[0, -1]], self.num_embeddings, "speedtorch.gather", "indices")
                except IndexError:  # name the caller's position, as forward does
                    named = _out_of_range_in(ids, self.num_embeddings, type(self).__name__)
                    if named is None:
                        raise
                    raise named from None
        side.wait_stream(counting)
        if self._written is not None:
            side.wait_event(self._written)
        for t in (unique, inverse):
            t.record_stream(side)
        with torch.cuda.stream(side), transfers_without_the_host(), phase("gather"):
            with deferred_index_checks() if checked else contextlib.nullcontext():
                rows, state = self._rows_ahead(unique)
            ready = torch.cuda.Event()  # after everything the prefetch queued
            ready.record(side)
        pending = PrefetchedRows(next_input, unique, inverse, rows, ready, state)
        # The side stream may still be reading the table's device tensors (a hybrid table's hot rows) after this
        # returns, and may have made new ones there (_refresh_hot_rows) that the current stream then uses: whichever
        # stream frees them, the caching allocator must reuse their memory only once both streams are done.
        if hasattr(self.table, "record_stream"):
            self.table.record_stream(side)
            self.table.record_stream(current)
        self._prefetched = pending

    def _rows_ahead(self, unique: torch.Tensor) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """A prefetch's rows, and their optimizer state when updates will advance them (state beside the rows is
        read with them: one read a row)."""
        if self._updates_ahead():
            return self.table.gather_with_state(unique, self.device)
        return self.table.gather(unique, self.device), None

    def drop_prefetch(self) -> None:
        """Forgets a prefetch the next forward will not use."""
        self._prefetched = None

    def side_stream(self) -> torch.cuda.Stream:
        """The CUDA stream a prefetch starts on (made at first use): it counts the distinct ids, which the host waits
        for, so it has a high priority: its few small kernels run between the model's, not after them. The rows are
        then read on a stream of normal priority (bounded by the transfer option ``max_sms``)."""
        if self._side_stream is None:
            self._side_stream = torch.cuda.Stream(self.device, priority=-1)
        return self._side_stream

    def _gather_stream(self) -> torch.cuda.Stream:
        if self._rows_stream is None:
            self._rows_stream = torch.cuda.Stream(self.device)
        return self._rows_stream

    def distinct_rows(self, input: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(inverse, rows)``: the distinct rows ``input`` names (in id order, on :attr:`device`; the prefetched
        ones if :meth:`prefetch` was given this very tensor) and where each id's row is (``input == ids[inverse]``).
        The rows are forward's before pooling (renormalised by ``max_norm``, in :attr:`output_dtype`); while the
        module trains, backward through them yields one gradient per distinct row, applied as ``update`` says.
        :class:`speedtorch.HostEmbeddingBagCollection` pools them itself."""
        _, inverse, rows = self._lookup(input)
        return inverse, rows

    # --- placement ---------------------------------------------------------------------------------------------

    def update_hot_rows(self) -> None:
        """For a wrapped :class:`speedtorch.nn.placement.HybridTable` chosen by frequency: re-chooses its
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
        """The table's optimizer and options, the ``_extra_state`` entry of ``state_dict()``."""
        return table_extra_state(self.table)

    def set_extra_state(self, state) -> None:
        """Checks a checkpoint's optimizer against the table's and takes its options."""
        set_table_extra_state(self.table, state, type(self).__name__)

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        # `weight` is the table's entry, written below (for hybrid, the rows, not the placeholder parameter); it keeps
        # the parameter's place, first.
        param = self._parameters.pop("weight", None)
        if param is not None:
            destination[prefix + "weight"] = None
        try:
            super()._save_to_state_dict(destination, prefix, keep_vars)
        finally:
            if param is not None:
                self._parameters["weight"] = param
        self._sync_for_host_access()
        for name, value in self._table_tensors().items():
            destination[prefix + name] = value

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        """Loads this module's checkpoint: all or nothing, as nn.Module's: the extra state (optimizer options) and
        every entry are checked before anything changes; the options are adopted only then (they may re-lay the
        optimizer state out). A checkpoint holding ``weight`` and none of the other entries (``optimizer_state``,
        ``optimizer_step``, ``_extra_state``) is an ``nn.Embedding``'s: its rows are loaded (strict or not) and the
        table's optimizer state, step count and options stay as they are (a new module's: zero state, step 0), as
        loading an ``nn.Embedding``'s weight leaves its torch optimizer's state alone."""
        extra = prefix + "_extra_state"
        targets = self._table_tensors()
        ours = {prefix + name for name in targets} | {extra}
        rest = {k: v for k, v in state_dict.items() if k not in ours}
        # The table's entries (weight among them) are checked below: nn.Module's loader must not look for `weight`.
        param = self._parameters.pop("weight", None)
        try:
            super()._load_from_state_dict(rest, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                          error_msgs)  # strict: reports the extra state missing, as it is from `rest`
        finally:
            if param is not None:
                self._parameters["weight"] = param
        if prefix + "weight" in state_dict and not any(key in state_dict for key in ours - {prefix + "weight"}):
            self._load_weight_only(state_dict, prefix, targets, missing_keys, error_msgs)
            return
        options = None
        if extra in state_dict:
            if extra in missing_keys:
                missing_keys.remove(extra)
            options = checked_extra_state(self.table, state_dict[extra], type(self).__name__)
        found = load_table_entries(entry_shapes(targets, self.table, options), state_dict, prefix, missing_keys,
                                   error_msgs, type(self).__name__)
        if found is None or error_msgs or extra in missing_keys:
            return  # nothing is written unless every entry fits
        # Tensors of the table's present layout, which adopting the options may replace (an 'r+' table refuses a new
        # layout while its old state is held).
        del targets
        self._sync_for_host_access()
        adopt_options(self.table, options)
        self._sync_weight()  # a re-laid out optimizer state moves the rows too
        self._copy_table_tensors(found)
        self._table_param.grad = None
        self._prefetched = None

    def _copy_table_tensors(self, found: dict) -> None:
        copy_table_entries(self.table, found)

    @torch.no_grad()
    def _load_weight_only(self, state_dict, prefix, targets, missing_keys, error_msgs) -> None:
        # nn.Embedding's checkpoint: the rows alone; nothing else of the table is missing from it.
        if prefix + "_extra_state" in missing_keys:
            missing_keys.remove(prefix + "_extra_state")
        found = load_table_entries({"weight": tuple(targets["weight"].shape)}, state_dict, prefix, missing_keys,
                                   error_msgs, type(self).__name__)
        if found is None or error_msgs:
            return
        self._sync_for_host_access()
        self.table.copy_(found["weight"].detach())
        self._table_param.grad = None
        self._prefetched = None

    def _writes_rows_back(self) -> bool:
        """Whether a step of rows read ahead with their state runs on them and only writes the table: when the
        table's transfers use no SM (the transfer option ``stream_ordered_staging``, the process's, this thread's or
        the table's own). Over UVA the fused read-modify-write is faster: a UVA scatter of 528-byte records ran at
        19 GB/s on the H200 (bench/RESULTS.md, twelfth session)."""
        if not self._hands_back_updated_rows():
            return False
        own = self.table.transfer_options()
        if "stream_ordered_staging" in own:
            return bool(own["stream_ordered_staging"])
        return bool(torch.ops.speedtorch.get_transfer_option("stream_ordered_staging"))

    def _sync_for_host_access(self) -> None:
        # Updates still running on the GPU must land before the host rows are handed out or overwritten. The last
        # forward's rows may change through them: its step goes to the table's own update.
        self._taken = None
        if self.device.type == "cuda":
            if self._update_stream is not None:
                self._update_stream.synchronize()
            torch.cuda.current_stream(self.device).synchronize()

    def _sync_weight(self) -> HostTableParameter:
        """The table parameter over the table as it is now (a hybrid table's cached rows written back; a table whose
        optimizer was re-configured has new memory: the same parameter object then points there)."""
        param = self._table_param
        if param.is_meta:
            return param
        table = self.table.table()
        if table.data_ptr() != param.data_ptr() or table.stride() != param.stride():
            param.data = table
        return param

    @property
    def weight(self) -> torch.Tensor:
        """The table (num_embeddings x embedding_dim; shares memory), as the :class:`HostTableParameter` the module
        registers: pinned host memory for ``"host"`` and ``"hybrid"`` (the device-resident rows written back first;
        while it is held, the row cache stands aside, so it stays exact: docs/persistence.md), device memory for
        ``"gpu"``. Synchronize before reading it on the host while updates may be running."""
        if "_table_param" not in self.__dict__:
            raise AttributeError("weight")  # not built yet (nn.Module's attribute checks ask during __init__)
        if self._table_param.is_meta:  # placement="hybrid": the rows, handed out as the row cache allows
            return self.table.table()
        return self._sync_weight()

    def save(self, path: str) -> None:
        """Writes the rows, the optimizer state and its configuration to ``path`` (+ ``.state.npy`` and
        ``.meta.json``; docs/persistence.md), whatever the placement: files NumPy reads, written atomically.
        Gradients waiting for a step are not part of it. Ctrl-C (KeyboardInterrupt) stops a long save at its next
        64 MiB chunk and leaves the files at ``path`` as they were."""
        run_interruptible(self.table.save, str(path))

    @classmethod
    def load(cls, path: str, *, mmap_mode: Optional[str] = None, verify: bool = True, placement: str = "host",
             **kwargs) -> "HostEmbedding":
        """A HostEmbedding over the files of :meth:`save` (or :meth:`PinnedEmbedding.save`, or a plain 2-D .npy of
        rows), with their optimizer, options, state and step count; ``kwargs`` as the constructor's (mode, update,
        device, hot_rows, ...). Files without an optimizer (a plain .npy) give a frozen table unless ``optimizer=``
        names one. ``mmap_mode`` (``"r"``, ``"r+"``, ``"c"``; host placement) maps the files instead of reading them
        (:meth:`PinnedEmbedding.open`)."""
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

    # --- copy.deepcopy, pickle, torch.save(model) ----------------------------------------------------------------

    def __getstate__(self) -> dict:
        # The table travels as its tensors (no size limit: torch.save writes their bytes; a table with a sidecar
        # keeps its own pickling, which writes the sidecar files), never the pending gradient or runtime objects.
        self._sync_for_host_access()
        state = {k: v for k, v in self.__dict__.items() if k not in self._runtime_attributes}
        state["_parameters"] = {k: v for k, v in self._parameters.items() if k != "weight"}
        state["table"] = _PickledTable.of(self.table)
        return state

    def __setstate__(self, state: dict) -> None:
        table = state["table"]
        state = dict(state, table=table.restore(state["device"]) if isinstance(table, _PickledTable) else table)
        super().__setstate__(state)
        self._init_runtime_state()

    def __deepcopy__(self, memo):
        # Like pickling, but the new table is filled from this one's memory directly: one copy, not two.
        state = self.__getstate__()
        table = state.pop("table")
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        state = copy.deepcopy(state, memo)
        state["table"] = table.restore(state["device"]) if isinstance(table, _PickledTable) else \
            copy.deepcopy(table, memo)
        new.__setstate__(state)
        return new


class _RowCachePlaceholder(HostTableParameter):
    """The table parameter of ``placement="hybrid"``: the table's shape and dtype on the meta device (a tensor kept
    over the host rows would stand the row cache aside; ``HostEmbedding.weight`` hands out the rows). Code that reads
    or writes parameters' values through ``detach()``, as ``torch.optim.swa_utils.AveragedModel`` (EMA, SWA) does,
    would read and write nothing there: ``detach()`` raises instead."""

    def detach(self):
        raise RuntimeError(
            "HostEmbedding(placement='hybrid'): the table parameter in parameters() is a placeholder on the meta device "
            "(the rows live in pinned host memory and the row cache), so code that averages or copies parameter "
            "values through it (torch.optim.swa_utils.AveragedModel: EMA, SWA) would silently do nothing. Use "
            "placement='host' or 'gpu' for a model you average, or average the table through `weight`, which hands "
            "out its rows: ema_table.weight.lerp_(table.weight, 1 - decay) (docs/training.md)")


class _PickledTable:
    """A :class:`speedtorch.PinnedEmbedding` as plain tensors and settings (how a HostEmbedding pickles it): its
    rows, optimizer state (sharing one storage when they sit side by side, so torch.save writes it once), optimizer,
    options, step count, sidecar and row cache."""

    @classmethod
    def of(cls, table):
        if isinstance(table, DeviceTable):
            return table  # tensors in device memory: pickles as it is (copied; between processes: see below)
        if not isinstance(table, torch.ScriptObject):
            raise TypeError(f"HostEmbedding: a {type(table).__name__} table cannot be copied or pickled; save it with "
                            f"module.save(path) or state_dict()")
        if table.sidecar():
            return table  # its own pickling writes the sidecar files and keeps their path
        out = cls()
        out.rows = table.table()
        out.state = table.state() if table.optimizer() else None
        out.beside = out.state is not None and out.rows.stride(0) != out.rows.shape[1]
        out.optimizer = table.optimizer()
        out.options = dict(table.optimizer_options())
        out.step = table.step_count()
        out.cache_slots = table.cache_slots()
        return out

    def restore(self, device: torch.device):
        """A new table holding these rows and state (copied), with a row cache on ``device`` as the old one had."""
        table = PinnedEmbedding(self.rows.shape[0], self.rows.shape[1], self.rows.dtype)
        if self.optimizer:
            table.set_optimizer(self.optimizer, self.options, self.beside)
            table.state().copy_(self.state)
        table.copy_(self.rows)
        table.set_step_count(self.step)
        if self.cache_slots:
            table.enable_cache(self.cache_slots, device)
        return table


# How a table travels through multiprocessing (the arguments of a spawned process or DataLoader worker, a Queue): as a
# copy of its bytes, the per-process copy docs/training.md ("Worker processes") describes, whatever the placement.
# torch.multiprocessing would share the tensors instead: a host table's through a descriptor that closes with the
# temporary tensors pickling made (a spawned process failed to start: "bad value(s) in fds_to_keep"), a
# placement="gpu" table's device memory through CUDA IPC (its CPU tensors through shared memory), so the child's
# steps changed the parent's rows and optimizer state.

def _copied_to_another_process(pickled):
    """The reduction of a _PickledTable or a DeviceTable for multiprocessing: its attributes, tensors as bytes."""
    state = dict(vars(pickled))
    for name, value in state.items():
        if isinstance(value, torch.Tensor):
            state[name] = _TensorBytes(value)
    return _table_from_another_process, (type(pickled), state)


def _table_from_another_process(kind: type, state: dict):
    out = kind.__new__(kind)
    for name, value in state.items():
        setattr(out, name, value.tensor() if isinstance(value, _TensorBytes) else value)
    return out


class _TensorBytes:
    """A tensor as a copy of its bytes (NumPy's, which multiprocessing pickles as data), its dtype and device."""

    def __init__(self, tensor: torch.Tensor):
        self.dtype, self.device, self.shape = tensor.dtype, tensor.device, tuple(tensor.shape)
        self.data = tensor.detach().to("cpu").contiguous().view(torch.uint8).numpy()

    def tensor(self) -> torch.Tensor:
        return torch.from_numpy(self.data).view(self.dtype).reshape(self.shape).to(self.device)


ForkingPickler.register(_PickledTable, _copied_to_another_process)
ForkingPickler.register(DeviceTable, _copied_to_another_process)


def _options(options: Optional[dict], dtype: torch.dtype) -> dict:
    """Optimizer options as the table takes them (floats), with stochastic rounding for 16-bit tables unless the
    caller chose: rounding to nearest loses every update below half a step of the format (bfloat16: lr 1e-4 on 1.0)."""
    out = {k: float(v) for k, v in (options or {}).items()}
    if dtype in _HALF_TYPES:
        out.setdefault("stochastic_rounding", 1.0)
    return out


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

