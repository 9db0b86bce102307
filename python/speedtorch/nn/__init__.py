"""speedtorch.nn: the modules a model is built from, their tables in pinned host RAM (docs/training.md).

- embedding.py: :class:`HostEmbedding`, ``nn.Embedding`` / ``nn.EmbeddingBag`` with the table and its optimizer
  state in host RAM (or ``placement="gpu"`` / ``"hybrid"``: placement.py);
- collection.py: :class:`HostEmbeddingBagCollection`, many tables stacked per group (docs/dlrm.md);
- ngram_embedding.py: :class:`NgramHashEmbedding`, hashed n-gram (Engram) embeddings (docs/engram.md);
- dynamic_embedding.py: the table that grows, over raw ids (docs/dynamic_tables.md);
- _table_parameter.py, _table_state.py, _prefetched_rows.py: the table as a parameter, in ``state_dict``, and its
  rows read ahead.
"""

from . import placement  # noqa: F401  (speedtorch.nn.placement)
from ._table_parameter import HostTableParameter, clip_grad_norm_, ddp_ignore_host_tables, dense_parameters
from ._table_state import track_table_state
from .collection import HostEmbeddingBagCollection, TableConfig
from .embedding import HostEmbedding
from .embedding import _PickledTable, _TensorBytes, _table_from_another_process  # noqa: F401  (named by old pickles)
from .ngram_embedding import NgramHashEmbedding

__all__ = ["HostEmbedding", "HostEmbeddingBagCollection", "HostTableParameter", "NgramHashEmbedding", "TableConfig",
           "clip_grad_norm_", "ddp_ignore_host_tables", "dense_parameters", "track_table_state"]
