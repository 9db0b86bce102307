"""The row operators, as thin Python functions over ``torch.ops.speedtorch`` (the kernels are C++/CUDA)."""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

__all__ = [
    "gather",
    "scatter_",
    "pinned_empty",
    "transfer_config",
    "set_transfer_config",
    "transfer_config_override",
    "transfer_calibrations",
    "clear_transfer_calibrations",
    "set_deferred_index_checks",
    "deferred_index_checks",
    "check_index_errors",
    "check_indices",
    "unique_indices",
]

def gather(table: torch.Tensor, indices: torch.Tensor, device: torch.device | str | None = None) -> torch.Tensor:
    """Rows of ``table`` (2-D) for ``indices`` (int32/int64, any shape).

    Returns a tensor of shape ``indices.shape + (table.shape[1],)`` on ``device`` if given, else on the indices'
    device. A pinned host table whose rows go to a GPU is read by a CUDA kernel over UVA and by CPU threads through
    pinned staging, concurrently. The GPU work is queued on the current stream (asynchronous); the staged share is
    done before the call returns. Out-of-range indices raise ``IndexError``.
    """
    return torch.ops.speedtorch.gather(table, indices, None if device is None else torch.device(device))


def scatter_(table: torch.Tensor, indices: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """Writes ``src`` (shape ``indices.shape + (D,)``) into the rows of ``table`` named by ``indices``; returns it.

    With duplicate indices the last occurrence wins, as in a sequential loop, on every device. Writes from a GPU
    into a pinned host table are partly asynchronous: synchronize the stream before reading the table on the host.
    """
    return torch.ops.speedtorch.scatter_(table, indices, src)


def unique_indices(indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.unique(indices, sorted=True, return_inverse=True)`` for int32/int64 ids of any shape: the distinct values
    ascending and each element's place among them. CPU ids: speedtorch's kernel (one hash pass on the calling thread,
    a sort of the distinct values only: 4x faster than torch's for a few thousand ids), the same values; GPU ids:
    torch's unique."""
    return torch.ops.speedtorch.unique_indices(indices)


def check_indices(indices: torch.Tensor, num_rows: int, op: str = "speedtorch.check_indices",
                  arg: str = "indices") -> None:
    """Raises ``IndexError`` naming ``op``, ``arg``, the value and its flat position when an index (int32/int64, any
    shape, any device) is outside ``[0, num_rows)``: the rule and the words of every row operator, for code that
    checks ids before handing them on. CUDA indices are reduced on their GPU; this waits for its current stream."""
    torch.ops.speedtorch.check_indices(indices, int(num_rows), op, arg)


def _first_out_of_range(indices: torch.Tensor, num_rows: int) -> tuple[int, int] | None:
    """``(flat position, value)`` of the first index of ``indices`` outside ``[0, num_rows)``, or None: found by
    :func:`check_indices` alone (the shortest prefix it refuses, by bisection), for a caller that must hand the value
    on rather than raise (the distributed table flags it to every rank). For error paths: up to log2(n) checks."""
    flat = indices.reshape(-1)

    def refused(count: int) -> bool:
        try:
            check_indices(flat[:count], num_rows)
        except IndexError:
            return True
        return False

    if not refused(flat.numel()):
        return None
    accepted, rejected = 0, flat.numel()  # the prefix of `accepted` ids passes, that of `rejected` does not
    while rejected - accepted > 1:
        middle = (accepted + rejected) // 2
        if refused(middle):
            rejected = middle
        else:
            accepted = middle
    return rejected - 1, int(flat[rejected - 1])


def pinned_empty(*size: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A zero-filled host tensor in exact-size pinned memory (no power-of-two rounding)."""
    if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        size = tuple(size[0])
    return torch.ops.speedtorch.pinned_empty(list(size), dtype)


def transfer_config() -> dict[str, float]:
    """The transfer engine's settings in force on the calling thread: the process's, with this thread's
    :func:`transfer_config_override` blocks applied (csrc/transfer/transfer_policy.h lists the names)."""
    names = torch.ops.speedtorch.transfer_option_names()
    return {name: torch.ops.speedtorch.get_transfer_option(name) for name in names}


def set_transfer_config(**options: float) -> None:
    """Overrides transfer settings for the process, e.g. ``set_transfer_config(uva_fraction=0.4)``;
    ``uva_fraction=-1`` restores the automatic split. Every thread sees them, except where a
    :func:`transfer_config_override` block of its own sets the same name."""
    for name, value in options.items():
        torch.ops.speedtorch.set_transfer_option(name, float(value))


@contextlib.contextmanager
def transfer_config_override(**options: float) -> Iterator[dict[str, float]]:
    """Transfer settings for the calling thread, for the length of a ``with`` block::

        with speedtorch.transfer_config_override(uva_fraction=0.0):
            rows = speedtorch.gather(table, ids, "cuda")

    Yields the settings in force inside. The settings named apply over the process's (:func:`set_transfer_config`,
    also one made inside the block, for the names the block does not set) for the speedtorch calls this thread
    makes; other threads never see them, and they end with the block (also on an exception), whatever order the
    blocks of several threads end in. Blocks nest. A backward on a GPU runs in autograd's own thread: set what it
    needs for the process. For one table's own settings, in force in whichever thread uses it, see
    ``PinnedEmbedding.set_transfer_option``. TorchScript and C++: ``torch.ops.speedtorch.push_transfer_overrides(
    names, values)`` returns an id for ``pop_transfer_overrides(id)`` on the same thread."""
    names = list(options)
    entry = torch.ops.speedtorch.push_transfer_overrides(names, [float(options[name]) for name in names])
    try:
        yield transfer_config()
    finally:
        torch.ops.speedtorch.pop_transfer_overrides(entry)


@contextlib.contextmanager
def transfers_without_the_host() -> Iterator[None]:
    """Inside: the calling thread's gathers and scatters move every row on the GPU (``uva_fraction=1``), unless a
    split was set or the staging runs in stream order (``stream_ordered_staging``, which never holds the caller).

    A split transfer's staged share is copied by the calling thread before the call returns; work queued on a side
    stream (a prefetch's gathers) must hand the host back at once, as the host is what queues the model's next
    kernels (a pipelined DLRM step was host-bound by 3.5 ms of staging a step)."""
    if torch.ops.speedtorch.get_transfer_option("uva_fraction") >= 0 or \
            torch.ops.speedtorch.get_transfer_option("stream_ordered_staging"):
        yield
        return
    entry = torch.ops.speedtorch.push_transfer_overrides(["uva_fraction"], [1.0])
    try:
        yield
    finally:
        torch.ops.speedtorch.pop_transfer_overrides(entry)


def transfer_calibrations() -> list[dict]:
    """The UVA shares the transfer engine measured, one per kind of call (csrc/transfer/split_calibration.h).

    The first pinned<->GPU gather or scatter_ of each kind (GPU, direction, host or GPU indices, table span, row
    size, batch size, CPU threads, launch settings) times the candidate shares on its own rows and keeps the fastest
    for the process; ``uva_fraction`` >= 0 or ``calibrate_split=0`` (``set_transfer_config``) skip it. Later calls
    that stage a share are timed the same way, and a guard gives UVA rows back when their median is slower than UVA
    alone was (the next larger share; UVA alone at once past 1.5x its time). Each entry: the kind (``key``, a
    dict), the share in force (``uva_share``), each share tried with its best time (``tried``: share ->
    milliseconds), the share the measurement chose (``calibrated_share``: larger ``uva_share`` means the guard
    moved it) and the guard's window, the last calls' milliseconds at the share in force (``recent_ms``)."""
    keys, chosen, shares, times, calibrated, recent_ms = torch.ops.speedtorch.transfer_calibrations()
    out = []
    for key, share, tried, ms, first, recent in zip(keys, chosen, shares, times, calibrated, recent_ms):
        fields = dict(item.split("=", 1) for item in key.split())
        parsed = {name: (value if name == "direction" else int(value)) for name, value in fields.items()}
        out.append({"key": parsed, "uva_share": share, "tried": dict(zip(tried, ms)), "calibrated_share": first,
                    "recent_ms": list(recent)})
    return out


def clear_transfer_calibrations() -> None:
    """Forgets every measured split: the next transfer of each kind measures again (after the machine's load
    changed, say)."""
    torch.ops.speedtorch.clear_transfer_calibrations()


def set_deferred_index_checks(deferred: bool) -> None:
    """With CUDA indices, out-of-range values are found by the GPU. By default the op then waits for its stream and
    raises at once; deferred, it does not wait, and :func:`check_index_errors` raises later. Rows for bad indices
    are never read or written either way. Process-wide (every thread, except inside its own
    :func:`deferred_index_checks` block). CPU-only builds check every index on the host: nothing is ever deferred
    there."""
    torch.ops.speedtorch.set_deferred_index_checks(bool(deferred))


@contextlib.contextmanager
def deferred_index_checks(deferred: bool = True) -> Iterator[None]:
    """The mode of :func:`set_deferred_index_checks` for the calling thread, for the length of a ``with`` block:
    other threads never see it, and it ends with the block whatever order the blocks of several threads end in.
    The innermost block of the thread decides. A backward on a GPU runs in autograd's own thread, under the
    process's mode. TorchScript and C++: ``torch.ops.speedtorch.push_deferred_index_checks(deferred)`` returns an
    id for ``pop_deferred_index_checks(id)`` on the same thread."""
    entry = torch.ops.speedtorch.push_deferred_index_checks(bool(deferred))
    try:
        yield
    finally:
        torch.ops.speedtorch.pop_deferred_index_checks(entry)


def check_index_errors() -> None:
    """Synchronizes the GPUs and raises ``IndexError`` if a kernel met an out-of-range index since the last check."""
    torch.ops.speedtorch.check_index_errors()
