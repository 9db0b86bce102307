"""``.npy`` files and NumPy views: thin Python functions over the C++ codec (csrc/io, ``torch.ops.speedtorch``), so a
C++ process reads and writes the same files. docs/persistence.md describes the formats and guarantees.

- :func:`save_npy` / :func:`load_npy` / :func:`load_npy_into_`: any tensor to and from a ``.npy`` file, streamed in
  chunks (never a second tensor-sized copy in RAM or on the GPU), straight into pinned memory, saves atomic.
- :func:`open_npy`: a tensor over the file itself (memory-mapped, page-locked), as ``numpy.load(mmap_mode=...)``.
- :func:`content_hash`: the hash :func:`save_npy` returns, of a tensor in memory (tells a file from another save).
- :func:`load_embedding` / :func:`open_embedding`: a :class:`speedtorch.PinnedEmbedding` from its saved files.
- :func:`numpy`: a zero-copy NumPy view of a host table.

A progress line appears on stderr for runs longer than a second (``SPEEDTORCH_PROGRESS=0`` silences it, ``=1``
shows it always).
"""

from __future__ import annotations

import os
from typing import Optional, Union

import torch

from ._library import PinnedEmbedding
from ._interrupt import run_interruptible

__all__ = ["save_npy", "load_npy", "load_npy_into_", "npy_info", "open_npy", "content_hash", "load_embedding",
           "open_embedding", "numpy"]

PathLike = Union[str, os.PathLike]

_DESCR_DTYPES = {
    "f2": torch.float16, "f4": torch.float32, "f8": torch.float64, "i1": torch.int8, "i2": torch.int16,
    "i4": torch.int32, "i8": torch.int64, "u1": torch.uint8, "u2": torch.uint16, "b1": torch.bool,
}


def save_npy(tensor: torch.Tensor, path: PathLike) -> str:
    """Writes ``tensor`` (any shape, device and strides) to ``path`` as a ``.npy`` file NumPy reads, in chunks,
    atomically (a crash mid-save leaves the old file; a replaced file keeps its permissions). bfloat16 is stored as
    its raw bits (``'<u2'``). Returns the data's content hash (16 hex digits). Onto a file that an ``open_npy(path,
    "r+")`` tensor maps: that tensor is written back in place; anything else is refused (docs/persistence.md).
    Ctrl-C stops a long save at its next 64 MiB chunk, leaving the old file."""
    return run_interruptible(torch.ops.speedtorch.save_npy, tensor, os.fspath(path))


def content_hash(tensor: torch.Tensor) -> str:
    """The content hash (16 hex digits) :func:`save_npy` returns for ``tensor``, computed without writing: its bytes
    in C order, so the tensor :func:`open_npy` maps from a file hashes as that file's save did. Host tensors only
    (2-D strided ones are hashed a chunk at a time, never copied whole). From TorchScript and C++:
    ``speedtorch::content_hash``."""
    return torch.ops.speedtorch.content_hash(tensor)


def load_npy(path: PathLike, *, pinned: bool = True, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """A new host tensor holding a ``.npy`` file, read straight into exact-size pinned memory (``pinned=True``) or
    ordinary memory. The header is validated (dtype, shape, byte order, Fortran order, truncation).

    bfloat16 is stored as its raw bits (``'<u2'``): the rows of a table saved by ``PinnedEmbedding.save`` /
    ``HostEmbedding.save``, whose ``.meta.json`` says bfloat16, load as bfloat16; a plain ``'<u2'`` file loads as
    uint16 unless ``dtype=torch.bfloat16`` asks for its bits as bfloat16. Any other ``dtype`` must be the file's."""
    path = os.fspath(path)
    stored, _ = npy_info(path)
    if dtype is None and stored == torch.uint16 and _table_dtype(path) == "bfloat16":
        dtype = torch.bfloat16
    if dtype is not None and dtype != stored and not (dtype == torch.bfloat16 and stored == torch.uint16):
        raise ValueError(f"load_npy: {path} holds {str(stored).replace('torch.', '')}, not dtype={dtype}; only "
                         f"bfloat16 is read from another type (its uint16 bits). To convert, use "
                         f"load_npy_into_(torch.empty(shape, dtype=...), path)")
    tensor = torch.ops.speedtorch.load_npy(path, pinned)
    return tensor.view(torch.bfloat16) if dtype == torch.bfloat16 else tensor  # the same bits, no copy


def _table_dtype(path: str) -> Optional[str]:
    """The dtype the meta file of a saved table names, when ``path`` is such a table's rows file."""
    stem = path[:-4] if path.endswith(".npy") else path
    if not os.path.isfile(stem + ".meta.json"):
        return None
    return torch.ops.speedtorch.read_embedding_meta(path)[1]


def load_npy_into_(tensor: torch.Tensor, path: PathLike) -> torch.Tensor:
    """Reads a ``.npy`` file into ``tensor`` (its shape; any device or strides), chunk by chunk through one staging
    buffer; floating types convert (a float64 file into a float32 table). Returns ``tensor``."""
    with torch.no_grad():
        torch.ops.speedtorch.load_npy_into_(tensor, os.fspath(path))
    return tensor


def npy_info(path: PathLike) -> tuple[torch.dtype, tuple[int, ...]]:
    """The dtype and shape a ``.npy`` file holds (validated; reads only the header)."""
    descr, shape = torch.ops.speedtorch.npy_header(os.fspath(path))
    return _DESCR_DTYPES[descr[1:]], tuple(shape)


def open_npy(path: PathLike, mode: str = "r", *, pin: bool = True) -> torch.Tensor:
    """A tensor over the ``.npy`` file itself, memory-mapped with ``mode`` as numpy.load's ``mmap_mode``: ``"r"``
    (read-only: speedtorch's own writing ops refuse it with a RuntimeError; torch has no read-only tensors, so the
    pages are private, as ``torch.load(mmap=True)`` maps them: a plain torch write changes this process's copy only,
    never the file, and GPU reads may not see it; use ``"c"`` to modify a private copy), ``"r+"`` (writes reach the
    file; ``save_npy`` of this tensor onto its own file writes it back in place) or ``"c"`` (copy-on-write).
    Page-locked when ``pin`` and a GPU is present, so GPUs read it directly; that reads every page once. See
    docs/persistence.md for the limits."""
    return torch.ops.speedtorch.map_npy(os.fspath(path), mode, pin)


def load_embedding(path: PathLike, *, verify: bool = True) -> PinnedEmbedding:
    """A :class:`PinnedEmbedding` read from the files of ``PinnedEmbedding.save`` (rows, optimizer state and
    configuration), or from a plain 2-D ``.npy`` (rows only), checking content hashes when ``verify``."""
    return PinnedEmbedding.load(os.fspath(path), verify)


def open_embedding(path: PathLike, mode: str = "r") -> PinnedEmbedding:
    """A :class:`PinnedEmbedding` over those files, memory-mapped (``"r"``, ``"r+"`` or ``"c"``) instead of read:
    usable at once, whatever the table's size. ``"r+"`` tables write back at :meth:`PinnedEmbedding.flush`."""
    return PinnedEmbedding.open(os.fspath(path), mode)


def numpy(table):
    """A NumPy array sharing memory with a host table: a tensor, a :class:`PinnedEmbedding` or a
    :class:`speedtorch.nn.HostEmbedding` (its ``weight``). bfloat16 rows come as their uint16 bits; a table on a GPU
    is copied to the host. Synchronize before reading rows that GPU work may still be writing."""
    read_only = False
    if hasattr(table, "weight") and isinstance(table, torch.nn.Module):
        read_only = getattr(table.table, "mapping", lambda: "")() == "r"
        table = table.weight
    elif not isinstance(table, torch.Tensor):
        read_only = table.mapping() == "r"
        table = table.table()
    if table.device.type != "cpu":
        table = table.cpu()
    if table.dtype == torch.bfloat16:
        table = table.view(torch.uint16)
    array = table.detach().numpy()
    if read_only:  # a table opened with mode "r": NumPy raises on writes instead of the process faulting
        array.flags.writeable = False
    return array
