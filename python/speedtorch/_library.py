"""Finds and loads the compiled operator library (libspeedtorch_ops.so) into torch.ops / torch.classes, on import:
the bottom layer of the package, where every module takes the library's table class from."""

from __future__ import annotations

import os
from pathlib import Path

import torch

_LIBRARY_NAME = "libspeedtorch_ops.so"
_loaded_path: str | None = None


def _candidates() -> list[Path]:
    here = Path(__file__).resolve().parent
    found = []
    env = os.environ.get("SPEEDTORCH_LIBRARY")
    if env:
        found.append(Path(env))
    found.append(here / _LIBRARY_NAME)  # installed wheel / editable install
    found.append(here.parent.parent / "build" / _LIBRARY_NAME)  # in-tree CMake build (make test)
    return found


def load_library() -> str:
    """Loads the operator library once; returns its path."""
    global _loaded_path
    if _loaded_path is not None:
        return _loaded_path
    tried = []
    for path in _candidates():
        tried.append(str(path))
        if path.is_file():
            torch.ops.load_library(str(path))
            _loaded_path = str(path)
            return _loaded_path
    raise ImportError(
        "speedtorch: the compiled library was not found (looked at: " + ", ".join(tried) + "). "
        "Install the package with `pip install --no-build-isolation .`, or build it with `make build` "
        "and point SPEEDTORCH_LIBRARY at build/libspeedtorch_ops.so."
    )


def library_path() -> str | None:
    """The path of the loaded operator library (libspeedtorch_ops.so), or None before it is loaded."""
    return _loaded_path


load_library()

#: ``torch.classes.speedtorch.PinnedEmbedding``: a table in exact-size pinned host memory, usable from Python,
#: TorchScript (as a module attribute) and C++. A custom class has no docstrings:
#: ``help(speedtorch.PinnedEmbeddingAPI)`` documents its methods.
PinnedEmbedding = torch.classes.speedtorch.PinnedEmbedding


def build_info() -> str:
    """What the compiled library was built with (CUDA version and architectures, or CPU-only)."""
    return torch.ops.speedtorch.build_info()
