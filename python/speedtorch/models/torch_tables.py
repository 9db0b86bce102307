"""``TorchEmbeddingBags``: the plain-PyTorch way to hold a recommender's tables, for comparisons: one
``nn.EmbeddingBag`` per table (``sparse=True`` by default, for torch's sparse Adagrad / SparseAdam / SGD), with the
inputs and output of :class:`speedtorch.HostEmbeddingBagCollection`."""

from __future__ import annotations

from typing import Sequence, Union

import torch
from torch import nn

from ..nn import TableConfig
from ..sparse_features import SparseFeatures

__all__ = ["TorchEmbeddingBags"]


class TorchEmbeddingBags(nn.Module):
    """One ``nn.EmbeddingBag`` per table (one feature each), on ``device``; forward as the collection's. A table
    starts as ``nn.EmbeddingBag``'s (N(0, 1)), or U(-init_range, +init_range) where its TableConfig has one."""

    def __init__(self, tables: Sequence[TableConfig], *, sparse: bool = True, device=None,
                 dtype: torch.dtype = torch.float32):
        super().__init__()
        for config in tables:
            if config.feature_names not in ((), (config.name,)):
                raise ValueError("TorchEmbeddingBags: one feature per table, named as the table")
        self.feature_names = [config.name for config in tables]
        self.bags = nn.ModuleList(nn.EmbeddingBag(config.num_embeddings, config.embedding_dim, mode=config.pooling,
                                                  sparse=sparse, device=device, dtype=dtype) for config in tables)
        with torch.no_grad():  # a table's init_range as the collection's: U(-init_range, +init_range)
            for config, bag in zip(tables, self.bags):
                if config.init_range is not None:
                    bag.weight.uniform_(-config.init_range, config.init_range)

    def forward(self, features: Union[torch.Tensor, SparseFeatures]) -> torch.Tensor:
        """``(batch, sum of the tables' dims)``: each table's pooled bags, concatenated in table order. ``features`` is
        a :class:`speedtorch.SparseFeatures` (one feature per table, in order) or a ``(batch, tables)`` tensor of one id
        per sample and table."""
        if isinstance(features, SparseFeatures):
            offsets = features.offsets()
            batch = features.batch_size
            bounds = offsets[::batch].tolist()  # where each feature's values start (and the end)
            out = []
            for f, bag in enumerate(self.bags):
                weights = None if features.weights is None else features.weights[bounds[f]:bounds[f + 1]]
                out.append(bag(features.values[bounds[f]:bounds[f + 1]],
                               offsets[f * batch:(f + 1) * batch] - bounds[f], per_sample_weights=weights))
            return torch.cat(out, dim=1)
        batch = features.shape[0]
        one_each = torch.arange(batch, device=features.device)
        return torch.cat([bag(features[:, f].contiguous(), one_each) for f, bag in enumerate(self.bags)], dim=1)
