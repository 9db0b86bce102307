"""``speedtorch.compat``: the API of the 2019 Python library SpeedTorch (``ModelFactory``, ``OptimizerFactory``,
``DataGadget``, ``GPUPytorchModelFactory``, ``GPUPytorchOptimizerFactory``) over speedtorch's own operators, so code
written for SpeedTorch runs after ``from speedtorch import compat as SpeedTorch``. There is no CuPy: a full
collection is a tensor in exact-size pinned host memory (``CPUPinn=True``) or in the model's device memory, its rows
move with :func:`speedtorch.gather` / :func:`speedtorch.scatter_`, and files are ``.npy`` through
:mod:`speedtorch.data`.

This module owns the swap protocol: before the forward pass the rows a batch names are copied, in place, from the
full collections into a batch-sized model variable and into its optimizer's per-parameter state; after the optimizer
step they are copied back. It also owns the fix for ids repeated within a batch, which SpeedTorch lost (the last
copy's write won, with the other copies' updates lost): while such a batch is swapped in, a gradient hook on the
model variable sums the gradients of an id's copies into its last copy, so the optimizer updates that copy exactly as
torch.optim updates one row with the summed gradient. Write-backs are plain scatter_ calls, whose rule for repeated
ids (the last occurrence wins) then writes that copy (row and optimizer state): one rule, the operator's own.

docs/migration.md maps every call here to the native API (:class:`speedtorch.nn.HostEmbedding`) and lists the
differences from SpeedTorch.
"""

from __future__ import annotations

import math
import os
import warnings
from typing import Callable, Optional

import numpy as np
import torch

from . import data as _data
from . import optim as _optim
from .ops import gather, pinned_empty, scatter_

__all__ = [
    "ModelFactory",
    "OptimizerFactory",
    "DataGadget",
    "GPUPytorchModelFactory",
    "GPUPytorchOptimizerFactory",
]

_DTYPE_NAMES = {
    "float32": torch.float32, "float": torch.float32, "float16": torch.float16, "half": torch.float16,
    "bfloat16": torch.bfloat16, "float64": torch.float64, "double": torch.float64,
}


# --- argument checks ---------------------------------------------------------------------------------------------


def _dtype_from(value, where: str, argument: str) -> torch.dtype:
    """A collection dtype from SpeedTorch's spellings: NumPy names ('float32'), torch dtypes, NumPy dtypes/types."""
    if isinstance(value, torch.dtype):
        if value in _DTYPE_NAMES.values():
            return value
    elif isinstance(value, str) and value.lower() in _DTYPE_NAMES:
        return _DTYPE_NAMES[value.lower()]
    elif isinstance(value, (np.dtype, type)):
        try:
            name = np.dtype(value).name
        except TypeError:
            name = None
        if name in _DTYPE_NAMES:
            return _DTYPE_NAMES[name]
    raise ValueError(f"{where}: {argument} must be one of 'float32', 'float16', 'bfloat16', 'float64' (or the torch or "
                     f"NumPy dtype), got {value!r}")


def _positive_int(value, where: str, argument: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{where}: {argument} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{where}: {argument} must be " + ("positive" if minimum == 1 else f">= {minimum}") +
                         f", got {value}")
    return int(value)


def _npy_path(file_name) -> str:
    """np.save's rule, which SpeedTorch's cupy.save followed: ``.npy`` is appended to a name without it."""
    path = os.fspath(file_name)
    return path if path.endswith(".npy") else path + ".npy"


def _index_tensor(indexes, where: str, argument: str) -> torch.Tensor:
    """``indexes`` (a tensor, NumPy array or sequence of ints, any shape) as our own flat int64 copy on its device
    (a copy: SpeedTorch users refill their index buffers between beforeForwardPass and afterOptimizerStep)."""
    if isinstance(indexes, np.ndarray):
        if indexes.dtype.kind not in "iu":
            raise TypeError(f"{where}: {argument} must hold integers, got a NumPy array of {indexes.dtype}")
        ids = torch.from_numpy(np.ascontiguousarray(indexes, dtype=np.int64))
    elif isinstance(indexes, torch.Tensor):
        if indexes.is_floating_point() or indexes.is_complex() or indexes.dtype == torch.bool:
            raise TypeError(f"{where}: {argument} must hold integers, got a tensor of {indexes.dtype}")
        ids = indexes.detach()
    else:
        try:
            ids = torch.as_tensor(indexes)
        except (TypeError, ValueError, RuntimeError) as error:
            raise TypeError(f"{where}: {argument} must be a tensor, NumPy array or sequence of ints, got "
                            f"{type(indexes).__name__}") from error
        if ids.is_floating_point() or ids.dtype == torch.bool:
            raise TypeError(f"{where}: {argument} must hold integers, got {ids.dtype} values")
    return ids.reshape(-1).to(torch.int64, copy=True)


def _batch_ids(pos_indexes, neg_indexes, where: str) -> torch.Tensor:
    """SpeedTorch's retrieval order: the positive indexes flattened, then the negative ones."""
    ids = _index_tensor(pos_indexes, where, "retrievedPosIndexes")
    if neg_indexes is None:
        return ids
    neg = _index_tensor(neg_indexes, where, "retrievedNegIndexes")
    return torch.cat([ids, neg.to(ids.device)])


def _check_write_back(batch: Optional["_SwappedBatch"], where: str, pos_indexes, neg_indexes) -> None:
    """afterOptimizerStep's precondition: a batch is swapped in, and these are its indexes."""
    if batch is None:
        raise RuntimeError(f"{where}.afterOptimizerStep: no batch is swapped in; call beforeForwardPass first")
    batch.check_same_ids(_batch_ids(pos_indexes, neg_indexes, f"{where}.afterOptimizerStep"), where)


def _model_weight(model_variable, embed_dimension: int, where: str) -> torch.Tensor:
    """The batch-sized 2-D tensor a switcher fills: ``model_variable.weight`` (an nn.Embedding, as in SpeedTorch's
    examples) or the tensor itself."""
    if isinstance(model_variable, torch.nn.Module):
        weight = getattr(model_variable, "weight", None)
        if not isinstance(weight, torch.Tensor):
            raise TypeError(f"{where}: model_variable must be a tensor or a module with a .weight tensor "
                            f"(e.g. nn.Embedding), got {type(model_variable).__name__} without one")
    elif isinstance(model_variable, torch.Tensor):
        weight = model_variable
    else:
        raise TypeError(f"{where}: model_variable must be a tensor or a module with a .weight tensor (e.g. "
                        f"nn.Embedding), got {type(model_variable).__name__}")
    _check_rows_of(weight, embed_dimension, where, "model_variable")
    return weight


def _check_rows_of(weight: torch.Tensor, embed_dimension: int, where: str, argument: str) -> None:
    if weight.dim() != 2 or weight.shape[1] != embed_dimension:
        raise ValueError(f"{where}: {argument} must be 2-D with embed_dimension={embed_dimension} columns (one row per "
                         f"id of a batch), got shape {tuple(weight.shape)}")
    if not weight.is_floating_point():
        raise TypeError(f"{where}: {argument} must be a floating tensor, got {weight.dtype}")


# --- placement -----------------------------------------------------------------------------------------------------


def _default_compute_device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _allocate(shape: tuple, dtype: torch.dtype, pinned: bool, device: torch.device) -> torch.Tensor:
    """A zero-filled collection: exact-size pinned host memory (``pinned``; plain page-aligned memory in a build
    or on a machine without CUDA), else ``device`` memory."""
    if pinned:
        return pinned_empty(*shape, dtype=dtype)
    return torch.zeros(shape, dtype=dtype, device=device)


def _wait_for_stream(device: torch.device) -> None:
    # A scatter_ from a GPU into a host collection may still be writing when it returns: host-side reads and writes
    # of the collection wait for the current stream (that stream only, never the whole device).
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


# --- one swapped batch ---------------------------------------------------------------------------------------------


class _SwappedBatch:
    """The ids of one swap (flat, int64).

    Every copy is written back with one scatter_, so for a repeated id the last copy wins (scatter_'s rule);
    :meth:`gradient_merger` moves the gradients of all of an id's copies onto that last copy.
    """

    def __init__(self, ids: torch.Tensor, capacity: int, where: str):
        if ids.numel() > capacity:
            raise ValueError(f"{where}.beforeForwardPass: {ids.numel()} indexes (retrievedPosIndexes then "
                             f"retrievedNegIndexes) but the model variable holds {capacity} rows")
        self.ids = ids
        self.count = ids.numel()
        unique_ids, inverse = torch.unique(ids, sorted=True, return_inverse=True)
        self.has_duplicates = unique_ids.numel() < self.count
        if self.has_duplicates:
            positions = torch.arange(self.count, device=ids.device)
            last = torch.full((unique_ids.numel(),), -1, dtype=torch.int64, device=ids.device)
            last.scatter_reduce_(0, inverse, positions, reduce="amax")
            # For every row of the model variable, the row that receives its gradient: the last copy of its id, the
            # one scatter_ keeps (rows past the batch, when the batch is smaller than the variable, keep their own).
            self.gradient_target = torch.arange(capacity, device=ids.device)
            self.gradient_target[: self.count] = last[inverse]

    def check_same_ids(self, ids: torch.Tensor, where: str) -> None:
        if not torch.equal(ids.to(self.ids.device), self.ids):
            raise ValueError(f"{where}.afterOptimizerStep: the indexes differ from those of the last beforeForwardPass "
                             f"({ids.numel()} ids now, {self.count} then); pass the same retrievedPosIndexes and "
                             f"retrievedNegIndexes to both")

    def gradient_merger(self, device: torch.device) -> Callable[[torch.Tensor], torch.Tensor]:
        """A gradient hook for the model variable (on ``device``): each id's copies' gradients summed into its last
        copy, zero on the others."""
        target = self.gradient_target.to(device)

        def merge(grad: torch.Tensor) -> torch.Tensor:
            if grad.is_sparse:  # nn.Embedding(sparse=True), e.g. for SparseAdam
                grad = grad.coalesce()
                rows = target[grad.indices()[0]].unsqueeze(0)
                with warnings.catch_warnings():
                    # torch 2.11 warns that invariant checks are off even when asked to leave them off; the row
                    # indices are the variable's own, in range.
                    warnings.filterwarnings("ignore", message="Sparse invariant checks are implicitly disabled")
                    merged = torch.sparse_coo_tensor(rows, grad.values(), grad.shape, check_invariants=False)
                return merged.coalesce()
            # index_put_(accumulate=True) rather than index_add_: the same sums, without index_add_'s parallel CPU
            # path, whose start-up cost milliseconds per call on a busy 2-core machine.
            return torch.zeros_like(grad).index_put_((target,), grad, accumulate=True)

        return merge

    def gather_into_(self, collection: torch.Tensor, destination: torch.Tensor) -> None:
        rows = gather(collection, self.ids, destination.device)
        with torch.no_grad():
            destination[: self.count].copy_(rows)

    def write_back_(self, collection: torch.Tensor, source: torch.Tensor) -> None:
        # Repeated ids: scatter_ keeps the last copy, the one the gradient hook gave the summed gradient.
        scatter_(collection, self.ids, source.detach()[: self.count].to(collection.dtype))


# --- model switchers -----------------------------------------------------------------------------------------------


class ModelFactory:
    """Switches rows between a full embedding collection (``total_classes x embed_dimension``) and a batch-sized
    model variable (an ``nn.Embedding`` of one row per id of a batch, or its weight tensor).

    ``CPUPinn=True`` keeps the collection in exact-size pinned host memory; ``False`` (SpeedTorch's default) in the
    memory of the model variable's device (GPU memory for a model on a GPU, ordinary host memory for one on the CPU).
    Call one of the ``*Init`` methods (or :meth:`loadCupy`) before the first swap.
    """

    _where = "ModelFactory"

    def __init__(self, model_variable, total_classes: int, embed_dimension: int, datatype="float32",
                 CPUPinn: bool = False):
        self.total_classes = _positive_int(total_classes, self._where, "total_classes")
        self.embed_dimension = _positive_int(embed_dimension, self._where, "embed_dimension")
        self.model_variable = model_variable
        self.weight = _model_weight(model_variable, self.embed_dimension, self._where)
        self.dtype = _dtype_from(datatype, self._where, "datatype")
        self.CPUPinn = bool(CPUPinn)
        self.collection: Optional[torch.Tensor] = None
        self._batch: Optional[_SwappedBatch] = None
        self._gradient_hook = None

    # --- the full collection -------------------------------------------------------------------------------------

    def _empty_collection(self) -> torch.Tensor:
        """The collection to fill: the existing one (filled in place) or a new zero-filled one."""
        if self.collection is None:
            self.collection = _allocate((self.total_classes, self.embed_dimension), self.dtype, self.CPUPinn,
                                        self.weight.device)
        else:
            _wait_for_stream(self.weight.device)
        return self.collection

    @torch.no_grad()
    def zerosInit(self) -> None:
        """The collection starts as zeros."""
        reused = self.collection is not None
        collection = self._empty_collection()
        if reused:  # a new one is zero-filled already
            collection.zero_()

    @torch.no_grad()
    def uniformDistributionInit(self, low: float, high: float) -> None:
        """The collection starts as U(low, high) (torch's generator of the collection's device)."""
        self._empty_collection().uniform_(low, high)

    @torch.no_grad()
    def normalDistributionInit(self, mean: float, stdDev: float) -> None:
        """The collection starts as N(mean, stdDev^2)."""
        self._empty_collection().normal_(mean, stdDev)

    @torch.no_grad()
    def customInit(self, initFunction: Callable, *args) -> None:
        """``initFunction(collection, *args)`` fills the collection in place, e.g. ``torch.nn.init.xavier_uniform_``."""
        if not callable(initFunction):
            raise TypeError(f"{self._where}.customInit: initFunction must be callable, got "
                            f"{type(initFunction).__name__}")
        initFunction(self._empty_collection(), *args)

    def _require_collection(self, what: str) -> torch.Tensor:
        if self.collection is None:
            raise RuntimeError(f"{self._where}.{what}: the collection is not initialised; call zerosInit, "
                               f"uniformDistributionInit, normalDistributionInit, customInit or loadCupy first")
        return self.collection

    # --- the swap ------------------------------------------------------------------------------------------------

    def variableTransformer(self, batchSize: int, posPerBatch: int, negPerBatch: Optional[int] = None):
        """The dummy inputs of the forward pass: ``(batchSize, posPerBatch)`` positions of the model variable's rows
        (and ``(batchSize, negPerBatch)`` more after them), as int64 tensors on the model variable's device."""
        where = f"{self._where}.variableTransformer"
        batch = _positive_int(batchSize, where, "batchSize")
        positives = batch * _positive_int(posPerBatch, where, "posPerBatch")
        # 0 negatives is an empty block, as in SpeedTorch (which tests negPerBatch against None).
        negatives = 0 if negPerBatch is None else batch * _positive_int(negPerBatch, where, "negPerBatch", 0)
        if positives + negatives > self.weight.shape[0]:
            raise ValueError(f"{where}: batchSize * (posPerBatch + negPerBatch) = {positives + negatives} rows, but "
                             f"the model variable holds {self.weight.shape[0]}")
        positions = torch.arange(positives + negatives, device=self.weight.device)
        pos = positions[:positives].view(batch, -1)
        if negPerBatch is None:
            return pos
        return pos, positions[positives:].view(batch, -1)

    def beforeForwardPass(self, retrievedPosIndexes, retrievedNegIndexes=None) -> None:
        """Copies the collection's rows for the indexes (positives, then negatives) into the model variable's first
        rows, in place. Out-of-range indexes raise ``IndexError`` before anything is written."""
        collection = self._require_collection("beforeForwardPass")
        ids = _batch_ids(retrievedPosIndexes, retrievedNegIndexes, f"{self._where}.beforeForwardPass")
        batch = _SwappedBatch(ids, self.weight.shape[0], self._where)
        batch.gather_into_(collection, self.weight)
        self._release_batch()
        self._batch = batch
        if batch.has_duplicates and self.weight.requires_grad:
            self._gradient_hook = self.weight.register_hook(batch.gradient_merger(self.weight.device))

    def afterOptimizerStep(self, retrievedPosIndexes, retrievedNegIndexes=None) -> None:
        """Writes the model variable's updated rows back to the collection (a repeated id from its last copy, as
        scatter_). The indexes must be those of the last :meth:`beforeForwardPass`."""
        collection = self._require_collection("afterOptimizerStep")
        _check_write_back(self._batch, self._where, retrievedPosIndexes, retrievedNegIndexes)
        self._batch.write_back_(collection, self.weight)
        self._release_batch()

    def _release_batch(self) -> None:
        if self._gradient_hook is not None:
            self._gradient_hook.remove()
            self._gradient_hook = None
        self._batch = None

    # --- files and views -----------------------------------------------------------------------------------------

    def saveCupy(self, saveFileName) -> None:
        """Writes the collection to a ``.npy`` file NumPy reads (streamed, atomic); ``.npy`` is appended to a name
        without it, as ``np.save`` does."""
        collection = self._require_collection("saveCupy")
        _wait_for_stream(self.weight.device)
        _data.save_npy(collection, _npy_path(saveFileName))

    def loadCupy(self, loadFileName) -> None:
        """Reads a ``.npy`` file of ``total_classes x embed_dimension`` into the collection (streamed; floating
        dtypes convert)."""
        _check_npy_shape(loadFileName, (self.total_classes, self.embed_dimension), f"{self._where}.loadCupy")
        _data.load_npy_into_(self._empty_collection(), loadFileName)

    def getNumpyVersion(self) -> np.ndarray:
        """The collection as a NumPy array: a zero-copy view of a host collection, a copy of a GPU one (bfloat16 as
        its uint16 bits)."""
        collection = self._require_collection("getNumpyVersion")
        _wait_for_stream(self.weight.device)
        return _data.numpy(collection)

    def getTorchVar(self) -> torch.Tensor:
        """The collection itself (``total_classes x embed_dimension``; shares memory)."""
        return self._require_collection("getTorchVar")


def _check_npy_shape(path, expected: tuple, where: str) -> None:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{where}: the file name must be a str or os.PathLike, got {type(path).__name__}")
    _, shape = _data.npy_info(path)
    if tuple(shape) != tuple(expected):
        raise ValueError(f"{where}: {os.fspath(path)} holds an array of shape {tuple(shape)}, expected {expected}")


class GPUPytorchModelFactory(ModelFactory):
    """SpeedTorch's torch-tensor switcher: :class:`ModelFactory` with the collection in the model variable's device
    memory (``CPUPinn=False``), plus ``saveTorch`` / ``loadTorch``."""

    _where = "GPUPytorchModelFactory"

    def __init__(self, model_variable, total_classes: int, embed_dimension: int, datatype=torch.float32):
        super().__init__(model_variable, total_classes, embed_dimension, datatype, CPUPinn=False)

    def saveTorch(self, saveFileName) -> None:
        """``torch.save`` of the collection."""
        torch.save(self._require_collection("saveTorch"), saveFileName)

    @torch.no_grad()
    def loadTorch(self, loadFileName) -> None:
        """Reads a tensor written by :meth:`saveTorch` into the collection."""
        loaded = torch.load(loadFileName, map_location=self.weight.device, weights_only=True)
        expected = (self.total_classes, self.embed_dimension)
        if not isinstance(loaded, torch.Tensor) or tuple(loaded.shape) != expected:
            given = tuple(loaded.shape) if isinstance(loaded, torch.Tensor) else type(loaded).__name__
            raise ValueError(f"{self._where}.loadTorch: {loadFileName} holds {given}, expected a tensor of shape "
                             f"{expected}")
        self._empty_collection().copy_(loaded)


# --- optimizer-state switchers -------------------------------------------------------------------------------------


def _adam_rows(group: dict) -> dict:
    rows = {"exp_avg": 0.0, "exp_avg_sq": 0.0}
    if group.get("amsgrad", False):
        rows["max_exp_avg_sq"] = 0.0
    return rows


def _rmsprop_rows(group: dict) -> dict:
    rows = {"square_avg": 0.0}
    if group["momentum"] > 0:
        rows["momentum_buffer"] = 0.0
    if group["centered"]:
        rows["grad_avg"] = 0.0
    return rows


# Per optimizer: (row-shaped state and the value a fresh row holds, per-parameter scalar state and its start).
# Scalars are given as Python numbers; the optimizer's own __setstate__ turns them into the tensors (dtype, device)
# this torch version expects, as it does when loading an old checkpoint.
_STATE_LAYOUTS: dict[type, Callable[[dict], tuple[dict, dict]]] = {
    torch.optim.Adam: lambda g: (_adam_rows(g), {"step": 0.0}),
    torch.optim.AdamW: lambda g: (_adam_rows(g), {"step": 0.0}),
    torch.optim.SparseAdam: lambda g: ({"exp_avg": 0.0, "exp_avg_sq": 0.0}, {"step": 0}),
    torch.optim.Adamax: lambda g: ({"exp_avg": 0.0, "exp_inf": 0.0}, {"step": 0.0}),
    torch.optim.Adagrad: lambda g: ({"sum": float(g["initial_accumulator_value"])}, {"step": 0.0}),
    torch.optim.Adadelta: lambda g: ({"square_avg": 0.0, "acc_delta": 0.0}, {"step": 0.0}),
    torch.optim.RMSprop: lambda g: (_rmsprop_rows(g), {"step": 0.0}),
    torch.optim.ASGD: lambda g: ({"ax": 0.0}, {"step": 0.0, "eta": float(g["lr"]), "mu": 1.0}),
    torch.optim.Rprop: lambda g: ({"prev": 0.0, "step_size": float(g["lr"])}, {"step": 0.0}),
    torch.optim.SGD: lambda g: ({"momentum_buffer": 0.0} if g["momentum"] != 0 else {}, {}),
    # Rows of rows x 4 float32 (step count bits, accumulator): created by the optimizer's own init_state.
    _optim.RowwiseAdagrad: lambda g: ({"state_rows": 0.0}, {}),
}


def _state_layout(optimizer: torch.optim.Optimizer, where: str) -> Callable[[dict], tuple[dict, dict]]:
    for cls in type(optimizer).__mro__:
        if cls in _STATE_LAYOUTS:
            return _STATE_LAYOUTS[cls]
    supported = ", ".join(sorted(cls.__name__ for cls in _STATE_LAYOUTS))
    raise TypeError(f"{where}: given_optimizer must be one of torch.optim's {supported}, got "
                    f"{type(optimizer).__name__}")


class OptimizerFactory:
    """Switches the optimizer state rows of one model variable (e.g. Adam's ``exp_avg`` and ``exp_avg_sq``) between
    full collections (``total_classes x embed_dimension`` each) and ``given_optimizer``'s per-parameter state.

    ``variable_name`` names the parameter in ``model`` (``"u_embeddings"`` for ``model.u_embeddings.weight``, or the
    full name). Row-shaped state is swapped; scalar state (``step``, ASGD's ``eta`` and ``mu``) stays per-parameter:
    it advances once per optimizer step, as one global count. ``CPUPinn`` as in :class:`ModelFactory`; ``dtype`` is
    the collections' dtype. Call :meth:`optInit` before the first swap.
    """

    _where = "OptimizerFactory"

    def __init__(self, given_optimizer, total_classes: int, embed_dimension: int, model, variable_name: str,
                 dtype="float32", CPUPinn: bool = False):
        where = self._where
        if not isinstance(given_optimizer, torch.optim.Optimizer):
            raise TypeError(f"{where}: given_optimizer must be a torch.optim.Optimizer, got "
                            f"{type(given_optimizer).__name__}")
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"{where}: model must be a torch.nn.Module, got {type(model).__name__}")
        if not isinstance(variable_name, str):
            raise TypeError(f"{where}: variable_name must be a str, got {type(variable_name).__name__}")
        self._layout = _state_layout(given_optimizer, where)
        self.given_optimizer = given_optimizer
        self.total_classes = _positive_int(total_classes, where, "total_classes")
        self.embed_dimension = _positive_int(embed_dimension, where, "embed_dimension")
        self.model = model
        self.variable_name = variable_name
        self.parameter = self._find_parameter(model, variable_name)
        _check_rows_of(self.parameter, self.embed_dimension, where, f"model.{variable_name}")
        self._group_of_parameter()  # fails early when the optimizer does not hold it
        self.dtype = _dtype_from(dtype, where, "dtype")
        self.CPUPinn = bool(CPUPinn)
        self.collections: dict[str, torch.Tensor] = {}
        self._initialised = False
        self._batch: Optional[_SwappedBatch] = None

    def _find_parameter(self, model: torch.nn.Module, name: str) -> torch.Tensor:
        parameters = dict(model.named_parameters())
        for candidate in (name, f"{name}.weight"):
            if candidate in parameters:
                return parameters[candidate]
        raise ValueError(f"{self._where}: model has no parameter named {name!r} (nor {name + '.weight'!r}); its "
                         f"parameters are {sorted(parameters)}")

    def _group_of_parameter(self) -> dict:
        for group in self.given_optimizer.param_groups:
            if any(p is self.parameter for p in group["params"]):
                return group
        raise ValueError(f"{self._where}: given_optimizer does not hold model.{self.variable_name}; create it with "
                         f"the model's parameters (e.g. model.parameters())")

    def optInit(self) -> None:
        """Creates the full state collections, each row holding what the optimizer gives a fresh parameter (zeros;
        Adagrad's initial_accumulator_value; Rprop's lr step sizes), and the optimizer's own state for the batch-sized
        parameter if it has none yet (so Rprop needs no step first, unlike in SpeedTorch). Every state tensor shaped
        like the parameter is swapped; the others (0-d: step, eta, mu) stay with the parameter."""
        group = self._group_of_parameter()
        row_fills, scalars = self._layout(group)
        state = self.given_optimizer.state[self.parameter]
        if not state and hasattr(self.given_optimizer, "init_state"):  # speedtorch.optim's own layouts
            state = self.given_optimizer.init_state(self.parameter)
        elif not state:
            for name in row_fills:
                state[name] = torch.zeros_like(self.parameter, memory_format=torch.preserve_format)
            state.update(scalars)
            self.given_optimizer.__setstate__(self.given_optimizer.__getstate__())
        # State with a row per parameter row: param-shaped (torch.optim's) or rows x k (row-wise Adagrad's).
        row_shaped = [name for name, value in state.items()
                      if isinstance(value, torch.Tensor) and value.dim() == 2
                      and value.shape[0] == self.parameter.shape[0]]
        missing = [name for name in row_fills if name not in row_shaped]
        if missing:
            raise ValueError(f"{self._where}.optInit: the optimizer's state for model.{self.variable_name} has no "
                             f"{missing} of shape {tuple(self.parameter.shape)} (were its options changed after its "
                             f"state was created?)")
        self.collections = {}
        for name in row_shaped:
            held = state[name]
            # Float32 state rows holding bit patterns (a step count) must not be converted to `dtype`.
            dtype = self.dtype if held.shape == self.parameter.shape else held.dtype
            collection = _allocate((self.total_classes, held.shape[1]), dtype, self.CPUPinn, self.parameter.device)
            fill = row_fills.get(name, 0.0)  # state a newer torch adds: assumed to start at zero
            if fill != 0.0:
                collection.fill_(fill)
            self.collections[name] = collection
        self._batch = None
        self._initialised = True

    def _require_init(self, what: str) -> dict:
        if not self._initialised:
            raise RuntimeError(f"{self._where}.{what}: call optInit first")
        return self.given_optimizer.state[self.parameter]

    def _state_tensor(self, state: dict, name: str, what: str) -> torch.Tensor:
        held = state.get(name)
        if not isinstance(held, torch.Tensor):
            raise RuntimeError(f"{self._where}.{what}: the optimizer's state for model.{self.variable_name} lost "
                               f"{name!r} (was its state cleared?); call optInit again")
        return held

    def beforeForwardPass(self, retrievedPosIndexes, retrievedNegIndexes=None) -> None:
        """Copies the state rows for the indexes into the optimizer's state tensors, in place."""
        state = self._require_init("beforeForwardPass")
        ids = _batch_ids(retrievedPosIndexes, retrievedNegIndexes, f"{self._where}.beforeForwardPass")
        batch = _SwappedBatch(ids, self.parameter.shape[0], self._where)
        for name, collection in self.collections.items():
            batch.gather_into_(collection, self._state_tensor(state, name, "beforeForwardPass"))
        self._batch = batch

    def afterOptimizerStep(self, retrievedPosIndexes, retrievedNegIndexes=None) -> None:
        """Writes the updated state rows back (a repeated id from its last copy, as scatter_: the copy the
        :class:`ModelFactory` of this variable gave the summed gradient)."""
        state = self._require_init("afterOptimizerStep")
        _check_write_back(self._batch, self._where, retrievedPosIndexes, retrievedNegIndexes)
        for name, collection in self.collections.items():
            self._batch.write_back_(collection, self._state_tensor(state, name, "afterOptimizerStep"))
        self._batch = None

    # --- files and views -----------------------------------------------------------------------------------------

    def _state_file(self, file_name, name: str) -> str:
        stem = os.fspath(file_name)
        if stem.endswith(".npy"):
            stem = stem[:-4]
        return f"{stem}.{name}.npy"

    def saveCupy(self, saveFileName) -> list[str]:
        """Writes each state collection to ``<saveFileName without .npy>.<state name>.npy``; returns those paths."""
        self._require_init("saveCupy")
        _wait_for_stream(self.parameter.device)
        paths = []
        for name, collection in self.collections.items():
            paths.append(self._state_file(saveFileName, name))
            _data.save_npy(collection, paths[-1])
        return paths

    def loadCupy(self, loadFileName) -> None:
        """Reads the files of :meth:`saveCupy` into the state collections."""
        self._require_init("loadCupy")
        _wait_for_stream(self.parameter.device)
        for name, collection in self.collections.items():
            path = self._state_file(loadFileName, name)
            _check_npy_shape(path, tuple(collection.shape), f"{self._where}.loadCupy")
            _data.load_npy_into_(collection, path)

    def getNumpyVersion(self) -> dict[str, np.ndarray]:
        """Each state collection as a NumPy array, by state name (views of host collections)."""
        self._require_init("getNumpyVersion")
        _wait_for_stream(self.parameter.device)
        return {name: _data.numpy(collection) for name, collection in self.collections.items()}

    def getTorchVar(self) -> dict[str, torch.Tensor]:
        """The state collections themselves, by state name."""
        self._require_init("getTorchVar")
        return self.collections


class GPUPytorchOptimizerFactory(OptimizerFactory):
    """SpeedTorch's torch-tensor optimizer switcher: :class:`OptimizerFactory` with the collections in the
    parameter's device memory (``CPUPinn=False``), plus ``saveTorch`` / ``loadTorch`` (a dict by state name)."""

    _where = "GPUPytorchOptimizerFactory"

    def __init__(self, given_optimizer, total_classes: int, embed_dimension: int, model, variable_name: str,
                 dtype=torch.float32):
        super().__init__(given_optimizer, total_classes, embed_dimension, model, variable_name, dtype, CPUPinn=False)

    def saveTorch(self, saveFileName) -> None:
        """``torch.save`` of the state collections, a dict by state name (:meth:`getTorchVar`), to ``saveFileName``."""
        torch.save(self.getTorchVar(), saveFileName)

    @torch.no_grad()
    def loadTorch(self, loadFileName) -> None:
        """Reads a file written by :meth:`saveTorch` into the state collections, in place; raises ValueError when its
        state names or shapes differ from theirs."""
        collections = self.getTorchVar()
        loaded = torch.load(loadFileName, map_location=self.parameter.device, weights_only=True)
        if not isinstance(loaded, dict) or set(loaded) != set(collections):
            given = sorted(loaded) if isinstance(loaded, dict) else type(loaded).__name__
            raise ValueError(f"{self._where}.loadTorch: {loadFileName} holds {given}, expected the state "
                             f"collections {sorted(collections)}")
        for name, collection in collections.items():
            if loaded[name].shape != collection.shape:
                raise ValueError(f"{self._where}.loadTorch: {name!r} in {loadFileName} has shape "
                                 f"{tuple(loaded[name].shape)}, expected {tuple(collection.shape)}")
            collection.copy_(loaded[name])


# --- data ----------------------------------------------------------------------------------------------------------


class DataGadget:
    """An array from a ``.npy`` file whose rows go to the compute device on demand (and come back).

    ``CPUPinn=True`` reads the file straight into exact-size pinned host memory; ``False`` into GPU memory when
    there is a GPU (streamed, no host copy), else into ordinary host memory. Rows are the first dimension; any
    further dimensions come along. Call :meth:`gadgetInit` first.
    """

    _where = "DataGadget"

    def __init__(self, fileName, CPUPinn: bool = False):
        if not isinstance(fileName, (str, os.PathLike)):
            raise TypeError(f"{self._where}: fileName must be a str or os.PathLike, got {type(fileName).__name__}")
        self.fileName = os.fspath(fileName)
        self.CPUPinn = bool(CPUPinn)
        self.device = _default_compute_device()
        self.data: Optional[torch.Tensor] = None

    def _read(self, path) -> torch.Tensor:
        if self.CPUPinn:
            array = _data.load_npy(path, pinned=True)
        elif self.device.type == "cuda":
            dtype, shape = _data.npy_info(path)
            array = _data.load_npy_into_(torch.empty(shape, dtype=dtype, device=self.device), path)
        else:
            array = _data.load_npy(path, pinned=False)
        if array.dim() == 0:
            raise ValueError(f"{self._where}: {os.fspath(path)} holds a 0-d array; rows need at least 1 dimension")
        return array

    def gadgetInit(self) -> None:
        """Reads ``fileName``."""
        self.data = self._read(self.fileName)

    def _rows(self, what: str) -> torch.Tensor:
        if self.data is None:
            raise RuntimeError(f"{self._where}.{what}: call gadgetInit (or loadCupy) first")
        # The ops move rows of a 2-D table: further dimensions are flattened into the row.
        return self.data.reshape(self.data.shape[0], math.prod(self.data.shape[1:]))

    def getData(self, retrievedPosIndexes, retrievedNegIndexes=None) -> torch.Tensor:
        """The rows for the indexes (positives, then negatives), shape ``(n,) + data.shape[1:]``, on the compute
        device (the current GPU, else the CPU)."""
        rows = self._rows("getData")
        ids = _batch_ids(retrievedPosIndexes, retrievedNegIndexes, f"{self._where}.getData")
        return gather(rows, ids, self.device).reshape((ids.numel(),) + tuple(self.data.shape[1:]))

    def insertData(self, dataObject, indexes) -> None:
        """Writes ``dataObject`` (one row of ``data.shape[1:]`` per index, any device, converted to the data's dtype)
        into the rows named by ``indexes``; for a repeated index the last row wins."""
        rows = self._rows("insertData")
        ids = _index_tensor(indexes, f"{self._where}.insertData", "indexes")
        if not isinstance(dataObject, torch.Tensor):
            dataObject = torch.as_tensor(np.asarray(dataObject))
        row_shape = tuple(self.data.shape[1:])
        given = tuple(dataObject.shape)
        if dataObject.numel() != ids.numel() * rows.shape[1] or given[len(given) - len(row_shape):] != row_shape:
            raise ValueError(f"{self._where}.insertData: dataObject must hold {ids.numel()} rows of shape {row_shape} "
                             f"(one per index), got shape {given}")
        scatter_(rows, ids, dataObject.detach().reshape(ids.numel(), rows.shape[1]).to(rows.dtype))

    def saveCupy(self, saveFileName) -> None:
        """Writes the data to a ``.npy`` file (streamed, atomic); ``.npy`` is appended to a name without it, as
        ``np.save`` does."""
        self._rows("saveCupy")
        _wait_for_stream(self.device)
        _data.save_npy(self.data, _npy_path(saveFileName))

    def loadCupy(self, loadFileName) -> None:
        """Replaces the data with a ``.npy`` file's (any shape)."""
        self.data = self._read(loadFileName)

    def getNumpyVersion(self) -> np.ndarray:
        """The data as a NumPy array (a zero-copy view of host data)."""
        self._rows("getNumpyVersion")
        _wait_for_stream(self.device)
        return _data.numpy(self.data)
