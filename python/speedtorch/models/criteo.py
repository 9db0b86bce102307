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

__all__ = ["CRITEO_1TB_ROWS", "CriteoBatch", "criteo_rows", "synthetic_batches", "DENSE_FEATURES"]

#: Rows of the 26 categorical features' tables in the Criteo 1TB click logs, as TorchRec's and MLPerf's DLRM
#: examples give them (177,944,275 in all); MLPerf caps each at 40M (``criteo_rows()``).
CRITEO_1TB_ROWS = (45833188, 36746, 17245, 7413, 20243, 3, 7114, 1441, 62, 29275261, 1572176, 345138, 10, 2209, 11267,
                   128, 4, 974, 14, 48937457, 11316796, 40094537, 452104, 12606, 104, 35)
DENSE_FEATURES = 13
_SPREAD = 2654435761  # a prime: ranks * _SPREAD mod n is a bijection of [0, n) for any n below it


def criteo_rows(cap: int = 40_000_000) -> list[int]:
    """The Criteo 1TB table sizes, each capped at ``cap`` rows (40M: MLPerf's, 163,079,093 rows in all, 83.5 GB at
    dim 128 float32; smaller caps give the scaled-down sizes)."""
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
        return CriteoBatch(self.dense.to(device, non_blocking=non_blocking),
                           self.sparse.to(device, non_blocking=non_blocking),
                           self.labels.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> "CriteoBatch":
        return CriteoBatch(self.dense.pin_memory(), self.sparse.pin_memory(), self.labels.pin_memory())

    def record_stream(self, stream) -> None:
        for t in (self.dense, self.sparse, self.labels):
            t.record_stream(stream)

    @property
    def batch_size(self) -> int:
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
