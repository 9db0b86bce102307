"""``speedtorch.jit_save``: ``torch.jit.save`` that never costs the file already there.

``torch.jit.save(model, path)`` truncates ``path`` before it serializes the model, so anything that fails while
serializing leaves neither the old model nor the new one: a table past ``SPEEDTORCH_INLINE_MAX_BYTES`` without a
sidecar (its pickling raises "Call set_sidecar(...)"), a sidecar that cannot be written, a full disk. That cannot be
changed from inside a custom class. ``jit_save`` writes the model to a temporary file beside ``path``, flushes it to
disk and renames it over ``path`` (and flushes the folder), as ``PinnedEmbedding.save`` writes its files: ``path``
then holds the old model or the new one, never a broken one. Sidecars are written atomically either way.
"""

from __future__ import annotations

import os

import torch

__all__ = ["jit_save"]


def _fsync(path: str, flags: int = os.O_RDONLY) -> None:
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def jit_save(module: torch.jit.ScriptModule, path: str | os.PathLike, **kwargs) -> None:
    """``torch.jit.save(module, path, **kwargs)``, atomically: on any error ``path`` is as it was."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    temporary = os.path.join(folder, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    try:
        torch.jit.save(module, temporary, **kwargs)
        _fsync(temporary)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise
    _fsync(folder, os.O_RDONLY | os.O_DIRECTORY)  # the rename itself survives a crash
