"""``speedtorch.jit_save``: ``torch.jit.save`` that never costs the file already there.

``torch.jit.save(model, path)`` truncates ``path`` before it serializes the model, so anything that fails while
serializing leaves neither the old model nor the new one: a sidecar that cannot be written, a full disk. That cannot
be changed from inside a custom class. ``jit_save`` writes the model to a temporary file beside ``path`` (its own for
each call, so threads and processes saving to one path never share one), flushes it to disk and renames it over
``path`` (and flushes the folder), as ``PinnedEmbedding.save`` writes its files: ``path`` then holds the old model or
the new one, never a broken one, with the permissions it had (a new file: the umask's). Sidecars are written
atomically either way. A sidecar that cannot be written makes ``jit_save`` raise (the old file stays); plain
``torch.jit.save`` cannot refuse at that point, so it keeps the table inline with a warning instead.
"""

from __future__ import annotations

import os

import torch

__all__ = ["jit_save"]


def jit_save(module: torch.jit.ScriptModule, path: str | os.PathLike, **kwargs) -> None:
    """``torch.jit.save(module, path, **kwargs)``, atomically: on any error ``path`` is as it was."""
    path = os.fspath(path)
    temporary = torch.ops.speedtorch.create_temporary_beside(path)
    # A sidecar that cannot be written raises here (plain torch.jit.save falls back to inline: it has already
    # truncated its target); the setting is this thread's, so other threads' saves are not affected.
    previous = torch.ops.speedtorch.set_sidecar_failures_raise(True)
    try:
        torch.jit.save(module, temporary, **kwargs)
        torch.ops.speedtorch.replace_file(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise
    finally:
        torch.ops.speedtorch.set_sidecar_failures_raise(previous)
