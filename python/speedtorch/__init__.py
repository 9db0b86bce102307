"""speedtorch: embedding tables in pinned host RAM, moved row by row between host and GPU at PCIe speed.

The kernels live in a C++/CUDA library registered with PyTorch's dispatcher (``torch.ops.speedtorch``,
``torch.classes.speedtorch``); this package loads it and adds Python conveniences.

``speedtorch.PinnedEmbedding`` is that library's TorchScript custom class (a ``torch.ScriptClass``), which carries
no docstrings and whose documentation cannot be set from Python: ``help(speedtorch.PinnedEmbedding)`` shows
torch.ScriptClass. ``help(speedtorch.PinnedEmbeddingAPI)`` documents its methods, and ``repr(table)`` says what a
table is. docs/api.md lists every public name.
"""

from __future__ import annotations

import torch

from ._library import library_path, load_library

load_library()

from . import _fake  # noqa: E402,F401  (registers fake kernels for torch.compile)
from .contiguous import ContiguousParams  # noqa: E402
from .ops import (  # noqa: E402
    check_index_errors,
    gather,
    pinned_empty,
    deferred_index_checks,
    scatter_,
    set_deferred_index_checks,
    set_transfer_config,
    transfer_config,
    transfer_config_override,
    transfer_calibrations,
    clear_transfer_calibrations,
)
from .counters import reset_stats, set_stats_enabled, stats, stats_help  # noqa: E402

#: ``torch.classes.speedtorch.PinnedEmbedding``: a table in exact-size pinned host memory, usable from Python,
#: TorchScript (as a module attribute) and C++. A custom class has no docstrings:
#: ``help(speedtorch.PinnedEmbeddingAPI)`` documents its methods.
PinnedEmbedding = torch.classes.speedtorch.PinnedEmbedding

from .pinned_embedding_api import PinnedEmbeddingAPI  # noqa: E402

from .jit_save import jit_save  # noqa: E402
from . import data, nn, optim, placement  # noqa: E402  (.npy files; HostEmbedding; gpu / hybrid placement)
from . import ngram, ngram_lookup, quantized  # noqa: E402  (Engram: n-gram hash, serving, quantized rows)
from .ngram import ngram_hash  # noqa: E402
from .quantized import gather_dequant  # noqa: E402
from . import compat  # noqa: E402  (SpeedTorch 0.x's API over the ops; docs/migration.md)
from .sparse_features import SparseFeatures  # noqa: E402
from .embedding_collection import HostEmbeddingBagCollection, TableConfig  # noqa: E402
from .train_pipeline import TrainPipeline  # noqa: E402

__version__ = "0.1.0"


def build_info() -> str:
    """What the compiled library was built with (CUDA version and architectures, or CPU-only)."""
    return torch.ops.speedtorch.build_info()


__all__ = [
    "ContiguousParams",
    "HostEmbeddingBagCollection",
    "PinnedEmbedding",
    "PinnedEmbeddingAPI",
    "build_info",
    "check_index_errors",
    "compat",
    "data",
    "gather",
    "gather_dequant",
    "jit_save",
    "ngram",
    "ngram_hash",
    "ngram_lookup",
    "nn",
    "optim",
    "library_path",
    "pinned_empty",
    "placement",
    "quantized",
    "reset_stats",
    "scatter_",
    "set_deferred_index_checks",
    "SparseFeatures",
    "TableConfig",
    "TrainPipeline",
    "deferred_index_checks",
    "set_stats_enabled",
    "set_transfer_config",
    "stats",
    "stats_help",
    "transfer_config",
    "transfer_config_override",
    "transfer_calibrations",
    "clear_transfer_calibrations",
]
