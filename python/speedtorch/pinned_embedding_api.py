"""The reference of :class:`speedtorch.PinnedEmbedding`'s methods, for ``help()``.

``speedtorch.PinnedEmbedding`` is ``torch.classes.speedtorch.PinnedEmbedding``, a TorchScript custom class
(csrc/embedding/pinned_embedding.h): the same object in Python, TorchScript and C++. Custom classes carry no
docstrings, so ``help(speedtorch.PinnedEmbedding)`` cannot say what its methods do:
``help(speedtorch.PinnedEmbeddingAPI)`` does. :class:`PinnedEmbeddingAPI` is documentation only (its methods are the
class's, with their signatures and defaults; calling them raises); tests/python/test_api_reference.py checks that it
lists exactly the class's methods.
``repr(table)`` says what a table is (shape, dtype, optimizer, step, pinned, mapping, sidecar, row cache).
"""

from __future__ import annotations

from typing import Optional

import torch

__all__ = ["PinnedEmbeddingAPI"]


class PinnedEmbeddingAPI:
    """``speedtorch.PinnedEmbedding(num_rows, dim, dtype=torch.float32)``: a ``num_rows x dim`` table in exact-size
    pinned host memory (zero-filled; rounded up to a page, never to a power of two), with an optional fused
    optimizer whose state sits beside each row.

    Threads: any number of threads may call one table's methods at once; readers (gather, save, accessors) share a
    lock, writers (scatter_, apply_gradients, initialisers, set_*) take it alone (docs/reliability.md). GPU work runs
    on the caller's current stream; synchronize before reading ``table()`` on the host after GPU writes.
    """

    def __init__(self, num_rows: int, dim: int, dtype: torch.dtype = torch.float32):
        """A new zero table; dtype float32, float16 or bfloat16."""
        raise _documentation_only()

    # --- rows ---------------------------------------------------------------------------------------------------

    def gather(self, indices: torch.Tensor, device: Optional[torch.device] = None) -> torch.Tensor:
        """Rows for ``indices`` (int32/int64, any shape, any device), shaped ``indices.shape + (dim,)``, on
        ``device`` (default: the indices' device). A GPU reads pinned rows directly over UVA; CPU threads may take a
        share (the transfer engine, README). Bad indices raise IndexError before anything is read."""
        raise _documentation_only()

    def gather_with_state(self, indices: torch.Tensor,
                          device: Optional[torch.device] = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(rows, state)`` for 1-D ``indices``: what ``gather(indices, device)`` and ``state()[indices]`` give. State
        kept beside the rows (``set_optimizer``'s default) is read with them, one record a row, so a GPU makes one
        read over PCIe a row, not a second one of a few bytes; both are then views of one tensor (strided rows).
        With a row cache, the rows come through it and its updated rows are written back first (as
        ``flush_cache()``), so that the state read is theirs."""
        raise _documentation_only()

    def scatter_with_state_(self, indices: torch.Tensor, rows: torch.Tensor, state: torch.Tensor, step: int) -> None:
        """The inverse of :meth:`gather_with_state`, for an optimizer step computed elsewhere (on rows read ahead to
        a GPU): writes ``rows`` and ``state`` into the rows of 1-D distinct ``indices`` and sets the step count to
        ``step``, under one lock. Rows and state that are views of one tensor of records (``gather_with_state``'s)
        are written as one record a row. A GPU write may still run after the call returns (stream order)."""
        raise _documentation_only()

    def scatter_(self, indices: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
        """Writes ``src`` (``indices.shape + (dim,)``, any device) into those rows; duplicates: the last occurrence
        wins. Returns the table tensor. A GPU write may still run after the call returns (stream order). A ``src``
        or ``indices`` sharing the table's memory (``table()[0:5]``) raises RuntimeError: pass a copy."""
        raise _documentation_only()

    def table(self) -> torch.Tensor:
        """The table itself (``num_rows x dim``, shares memory; rows may be strided when the optimizer state sits
        beside them). Writes through it bypass the lock. A row cache is written back (and emptied) first, and stands
        aside while the tensor (or a view of it) lives: :meth:`host_rows_in_use`."""
        raise _documentation_only()

    def host_rows_in_use(self) -> bool:
        """Whether a tensor that ``table()``, ``state()`` or ``scatter_()`` returned (or a view of one) is still alive:
        meanwhile a row cache stands aside (gathers and steps use the host rows), so reads and writes through the
        tensor stay exact; once it is dropped the cache fills again."""
        raise _documentation_only()

    def copy_(self, src: torch.Tensor) -> None:
        """Copies a ``(num_rows, dim)`` tensor of any device and floating dtype into the table."""
        raise _documentation_only()

    def zero_(self) -> None:
        """Sets every row to zero."""
        raise _documentation_only()

    def uniform_(self, low: float = -0.05, high: float = 0.05, seed: Optional[int] = None) -> None:
        """U(low, high) rows, in place, with no table-sized temporary; seeded values do not depend on threads."""
        raise _documentation_only()

    def normal_(self, mean: float = 0.0, std: float = 1.0, seed: Optional[int] = None) -> None:
        """N(mean, std^2) rows, in place, with no table-sized temporary; seeded values do not depend on threads."""
        raise _documentation_only()

    def num_rows(self) -> int:
        """Rows of the table."""
        raise _documentation_only()

    def dim(self) -> int:
        """Columns of a row."""
        raise _documentation_only()

    def nbytes(self) -> int:
        """Host bytes the table owns: rows and optimizer state."""
        raise _documentation_only()

    def is_pinned(self) -> bool:
        """Whether the rows are page-locked for the GPU (false without a GPU)."""
        raise _documentation_only()

    # --- optimizer -----------------------------------------------------------------------------------------------

    def set_optimizer(self, kind: str, options: dict, state_beside_rows: bool = True) -> None:
        """Configures the fused optimizer: ``kind`` sgd, adagrad, adam, adamw, adamax, rmsprop, adadelta, asgd, rprop,
        rowwise_adagrad (or sparse_adam); ``options`` torch.optim's hyper-parameters as floats (betas as
        beta1/beta2, flags as 0/1, per_row_step, stochastic_rounding). Allocates the state, zeroed, beside each row
        or in a table of its own; resets the state and the step count. A table opened ``"r+"`` whose old state is
        still in use (a tensor from ``state()``, another table over the same files) is refused, unchanged: the new
        state replaces the state file at the next ``flush()``. Through a HostEmbedding, call its ``set_optimizer``."""
        raise _documentation_only()

    def set_optimizer_options(self, options: dict) -> None:
        """Changes the optimizer's hyper-parameters in place (all options given; those not named take their
        defaults), keeping its state and step count: an LR schedule. Options that change the state's layout
        (momentum from or to 0, amsgrad, centered) raise: set_optimizer."""
        raise _documentation_only()

    @staticmethod
    def canonical_optimizer_name(kind: str) -> str:
        """The one name an optimizer is known by, whatever name it was given ("Adam": "adam", "SparseAdam":
        "sparse_adam")."""
        raise _documentation_only()

    @staticmethod
    def optimizer_defaults(kind: str) -> dict:
        """Every option the optimizer ``kind`` accepts, with its default value."""
        raise _documentation_only()

    def apply_gradients(self, indices: torch.Tensor, grad: torch.Tensor, sorted_unique: bool = False,
                        updated_rows: Optional[torch.Tensor] = None) -> None:
        """One optimizer step on the rows ``indices`` name: ``grad`` (``indices.shape + (dim,)``, any device) summed
        per distinct row, each row and its state updated once, in place (a GPU kernel over UVA and CPU threads). The
        step count advances by one (also for empty indices). ``sorted_unique``: the indices are strictly increasing
        (checked on the host; under deferred index checks, CUDA indices are checked by the kernels instead, which flag
        a row out of range or not above the one before it for ``speedtorch.check_index_errors()`` and leave it
        alone), so the summing pass is skipped. ``updated_rows`` (with ``sorted_unique``; not with a row cache): also
        receives each row's new weights, row i for indices[i], ``(M, dim)`` in the table's dtype on the device that
        does the work (the gradients' GPU for a host table). A ``grad`` or ``indices`` sharing the memory of the rows or
        the state raises RuntimeError: pass a copy."""
        raise _documentation_only()

    def optimizer(self) -> str:
        """The optimizer's name, "" when there is none."""
        raise _documentation_only()

    def optimizer_options(self) -> dict:
        """The options given to set_optimizer / set_optimizer_options (a copy)."""
        raise _documentation_only()

    def state(self) -> Optional[torch.Tensor]:
        """The optimizer state, ``num_rows x state_width`` float32 (shares memory; handed out as ``table()`` is), or
        None without an optimizer."""
        raise _documentation_only()

    def step_count(self) -> int:
        """The table-wide step count (bias correction)."""
        raise _documentation_only()

    def set_step_count(self, step: int) -> None:
        """Sets the table-wide step count (restoring a table trained elsewhere)."""
        raise _documentation_only()

    @staticmethod
    def state_width(kind: str, options: dict, dim: int) -> int:
        """Floats of optimizer state per row for ``kind`` with ``options`` and rows of ``dim``."""
        raise _documentation_only()

    # --- files --------------------------------------------------------------------------------------------------

    def save(self, path: str) -> None:
        """Saves rows, optimizer state and configuration to ``path`` (+ ``.state.npy``, ``.meta.json``), files NumPy
        reads, streamed in chunks, atomically (docs/persistence.md)."""
        raise _documentation_only()

    @staticmethod
    def load(path: str, verify: bool) -> "PinnedEmbeddingAPI":
        """A new table read from save()'s files (or a plain 2-D .npy: rows only), straight into pinned memory; with
        ``verify`` the content hashes are checked."""
        raise _documentation_only()

    @staticmethod
    def open(path: str, mode: str) -> "PinnedEmbeddingAPI":
        """A table over save()'s files, memory-mapped: mode "r" (read-only), "r+" (writes reach the files; flush())
        or "c" (copy-on-write). Nothing is copied."""
        raise _documentation_only()

    @staticmethod
    def create(path: str, num_rows: int, dim: int, dtype: torch.dtype, optimizer: str,
               options: dict) -> "PinnedEmbeddingAPI":
        """A zero table (and optimizer state) over new files at ``path``, mapped as open(path, "r+"); other processes
        may open() them to share the table (on /dev/shm their GPUs may write it too)."""
        raise _documentation_only()

    def flush(self) -> None:
        """For an "r+" table: writes its pages back and rewrites the meta file (step count, content hashes)."""
        raise _documentation_only()

    def mapping(self) -> str:
        """"r", "r+" or "c" for a table over files; "" for one in anonymous memory."""
        raise _documentation_only()

    def set_sidecar(self, path: str) -> None:
        """Where torch.jit.save writes this table instead of inside the model ("" keeps it inline)."""
        raise _documentation_only()

    def sidecar(self) -> str:
        """The sidecar path, "" when none."""
        raise _documentation_only()

    # --- row cache ----------------------------------------------------------------------------------------------

    def enable_cache(self, num_rows: int, device: torch.device) -> None:
        """Keeps the most recently used rows (at least ``num_rows``) and their state in ``device`` memory; gathers and
        steps use the copies (bit for bit the host path's results); whatever reads the host rows writes them back."""
        raise _documentation_only()

    def disable_cache(self) -> None:
        """Writes the row cache back and drops it."""
        raise _documentation_only()

    def cache_slots(self) -> int:
        """Rows the cache holds at most (0 without one)."""
        raise _documentation_only()

    def cached_rows(self) -> int:
        """Rows the cache holds now."""
        raise _documentation_only()

    def flush_cache(self) -> None:
        """Writes the cache's updated rows back to the table (they stay cached)."""
        raise _documentation_only()

    # --- transfer settings --------------------------------------------------------------------------------------

    def set_transfer_option(self, name: str, value: float) -> None:
        """This table's own transfer setting (names as ``speedtorch.transfer_config()``), over the process's."""
        raise _documentation_only()

    def transfer_options(self) -> dict:
        """The transfer settings set on this table."""
        raise _documentation_only()

    def clear_transfer_options(self) -> None:
        """Drops this table's own transfer settings."""
        raise _documentation_only()

    def tracing_mode(self) -> str:
        """"real": torch.export keeps a table found on a module as the real object (a constant of the exported
        program) rather than tracing it with fake tensors."""
        raise _documentation_only()


def _documentation_only() -> TypeError:
    return TypeError("speedtorch.PinnedEmbeddingAPI documents speedtorch.PinnedEmbedding's methods; call them on a "
                     "speedtorch.PinnedEmbedding")
