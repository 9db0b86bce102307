"""speedtorch: embedding tables in pinned host RAM, moved row by row between host and GPU at PCIe speed.

The kernels live in a C++/CUDA library registered with PyTorch's dispatcher (``torch.ops.speedtorch``,
``torch.classes.speedtorch``); this package loads it and adds Python conveniences.

``speedtorch.PinnedEmbedding`` is that library's TorchScript custom class (a ``torch.ScriptClass``), which carries
no docstrings and whose documentation cannot be set from Python: ``help(speedtorch.PinnedEmbedding)`` shows
torch.ScriptClass. ``help(speedtorch.PinnedEmbeddingAPI)`` documents its methods, and ``repr(table)`` says what a
table is. docs/api.md lists every public name.
"""

from __future__ import annotations

from ._library import PinnedEmbedding, build_info, library_path  # loads the compiled library: first
from . import _fake  # noqa: F401  (registers fake kernels for torch.compile)
from ._moved import old_module as __getattr__  # noqa: F401  (the old module paths: speedtorch.quantized, ...)
from .contiguous import ContiguousParams
from .ops import (check_index_errors, clear_transfer_calibrations, deferred_index_checks, gather, pinned_empty,
                  scatter_, set_deferred_index_checks, set_transfer_config, transfer_calibrations, transfer_config,
                  transfer_config_override)
from .counters import reset_stats, set_stats_enabled, stats, stats_help
from .pinned_embedding_api import PinnedEmbeddingAPI
from .jit_save import jit_save
from . import data, ngram, serving  # .npy files; the n-gram hash; quantized rows, the n-gram lookup
from . import nn, optim, pipeline, compat  # HostEmbedding; its optimizer; TrainPipeline; SpeedTorch 0.x's API
from .ngram import ngram_hash
from .serving import gather_dequant
from .sparse_features import SparseFeatures
from .nn import HostEmbeddingBagCollection, TableConfig
from .pipeline import TrainPipeline

__version__ = "0.1.0"

__all__ = ["ContiguousParams", "HostEmbeddingBagCollection", "PinnedEmbedding", "PinnedEmbeddingAPI", "SparseFeatures",
           "TableConfig", "TrainPipeline", "build_info", "check_index_errors", "clear_transfer_calibrations", "compat",
           "data", "deferred_index_checks", "gather", "gather_dequant", "jit_save", "library_path", "ngram",
           "ngram_hash", "nn", "optim", "pinned_empty", "pipeline", "reset_stats", "scatter_", "serving",
           "set_deferred_index_checks", "set_stats_enabled", "set_transfer_config", "stats", "stats_help",
           "transfer_calibrations", "transfer_config", "transfer_config_override"]
