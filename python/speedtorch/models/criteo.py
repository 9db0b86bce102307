"""Synthetic batches shaped like Criteo's click logs (13 dense features, 26 categorical ones, a click label), with
ids that follow a power law per table, and the Criteo 1TB table sizes.

Ids: for a table of ``n`` rows, the popularity rank ``r`` of an id has probability ~ ``(r + 1) ** -exponent`` (drawn by
inverting the continuous power law's distribution), and a fixed multiplicative hash (a bijection of [0, n)) spreads
the ranks over the table, so hot rows are not neighbours. ``exponent`` sets the skew: larger is more skewed (fewer
distinct rows per batch); 0 is uniform.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence, Union

import torch

from ..sparse_features import SparseFeatures

__all__ = ["CRITEO_1TB_ROWS", "MLPERF_POOLING_FACTORS", "CriteoBatch", "criteo_rows", "synthetic_batches",
           "DENSE_FEATURES"]

#: Rows of the 26 categorical features' tables of the Criteo 1TB click logs as MLPerf Training's DLRM-DCNv2
#: reference preprocesses them, each capped at 40M ids: 204,184,588 rows, 104.5 GB (97.4 GiB) at dim 128 float32.
CRITEO_1TB_ROWS = (40000000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 40000000, 3067956, 405282, 10, 2209, 11938,
                   155, 4, 976, 14, 40000000, 40000000, 40000000, 590152, 12973, 108, 36)
#: Ids per sample of each feature in MLPerf's multi-hot Criteo (DLRM-DCNv2): 214 a sample in all.
MLPERF_POOLING_FACTORS = (3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1)
DENSE_FEATURES = 13
_SPREAD = 2654435761  # a prime: ranks * _SPREAD mod n is a bijection of [0, n) for any n below it


def criteo_rows(cap: int = 40_000_000) -> list[int]:
    """The Criteo 1TB table sizes (MLPerf's, :data:`CRITEO_1TB_ROWS`), each capped at ``cap`` rows: 40M gives them
    as they are; smaller caps give the scaled-down sizes (5M: 29.2M rows; 1M: 7.1M rows)."""
    if cap < 1:
        raise ValueError(f"criteo_rows: cap must be >= 1, got {cap}")
    return [min(n, cap) for n in CRITEO_1TB_ROWS]


@dataclass
class CriteoBatch:
    """One batch: ``dense`` (batch, 13) float32, ``sparse`` (batch, tables) ids or :class:`SparseFeatures` (multi-hot),
    ``labels`` (batch,) float32 in {0, 1}."""

    dense: torch.Tensor
    sparse: Union[torch.Tensor, SparseFeatures]
    labels: torch.Tensor

    def to(self, device, non_blocking: bool = False) -> "CriteoBatch":
        """The batch with its tensors moved to ``device`` (``Tensor.to``; ``non_blocking`` as there)."""
        return CriteoBatch(self.dense.to(device, non_blocking=non_blocking),
                           self.sparse.to(device, non_blocking=non_blocking),
                           self.labels.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> "CriteoBatch":
        """The batch with its tensors in pinned host memory (a DataLoader's ``pin_memory=True`` calls this)."""
        return CriteoBatch(self.dense.pin_memory(), self.sparse.pin_memory(), self.labels.pin_memory())

    def record_stream(self, stream) -> None:
        """Marks the batch's tensors (a batch on a GPU) as used on ``stream`` (``Tensor.record_stream``), for a
        batch moved on a side stream."""
        for t in (self.dense, self.sparse, self.labels):
            t.record_stream(stream)

    @property
    def batch_size(self) -> int:
        """Samples in the batch."""
        return self.dense.shape[0]


def power_law_ids(num_rows: int, size: int, exponent: float, generator: torch.Generator) -> torch.Tensor:
    """``size`` ids of a ``num_rows`` table: power-law ranks (exponent ``exponent``) spread by the hash."""
    u = torch.rand(size, dtype=torch.float64, generator=generator)
    if exponent == 0:
        ranks = (u * num_rows).floor()
    elif abs(exponent - 1.0) < 1e-9:
        ranks = torch.exp(u * math.log(num_rows + 1)).floor() - 1
    else:
        s = 1.0 - exponent
        ranks = ((((num_rows + 1) ** s - 1) * u + 1) ** (1 / s)).floor() - 1
    ranks = ranks.clamp_(0, num_rows - 1).to(torch.int64)
    return ranks * _SPREAD % num_rows


def synthetic_batches(rows: Sequence[int], batch_size: int, count: int, *, exponent: float = 1.1,
                      pooling_factors: Optional[Sequence[int]] = None, seed: int = 0,
                      pin_memory: bool = False) -> list[CriteoBatch]:
    """``count`` Criteo-shaped batches on the CPU for tables of ``rows`` rows.

    ``pooling_factors``: None for one id per table and sample (a (batch, tables) tensor); else ids per bag for each
    table (multi-hot :class:`SparseFeatures`, keys ``t0``, ``t1``, ...; MLPerf's DLRM-DCNv2 uses 1 to 100). Labels
    depend on the dense features and the hottest ids, so a model can learn them. ``pin_memory`` pins the batches (for
    copies to a GPU that overlap compute)."""
    if batch_size < 1 or count < 1:
        raise ValueError(f"synthetic_batches: batch_size and count must be >= 1, got {batch_size}, {count}")
    if pooling_factors is not None and len(pooling_factors) != len(rows):
        raise ValueError(f"synthetic_batches: {len(pooling_factors)} pooling factors for {len(rows)} tables")
    generator = torch.Generator().manual_seed(seed)
    weights = torch.randn(DENSE_FEATURES, generator=generator) / math.sqrt(DENSE_FEATURES)
    keys = tuple(f"t{t}" for t in range(len(rows)))
    out = []
    for _ in range(count):
        dense = torch.log1p(torch.empty(batch_size, DENSE_FEATURES).exponential_(generator=generator))
        per_table = [power_law_ids(n, batch_size * (1 if pooling_factors is None else pooling_factors[t]), exponent,
                                   generator) for t, n in enumerate(rows)]
        # The label leans on the dense features and on whether the first table's id is a popular one.
        popular = (per_table[0][:batch_size] % 2 == 0).float() if pooling_factors is None else 0.0
        logits = (dense - dense.mean(0)) @ weights + popular - 0.5
        labels = torch.bernoulli(torch.sigmoid(logits), generator=generator)
        if pooling_factors is None:
            sparse = torch.stack(per_table, dim=1)
        else:
            lengths = torch.cat([torch.full((batch_size,), p, dtype=torch.int64) for p in pooling_factors])
            sparse = SparseFeatures(keys, torch.cat(per_table), lengths)
        batch = CriteoBatch(dense, sparse, labels)
        out.append(batch.pin_memory() if pin_memory else batch)
    return out
