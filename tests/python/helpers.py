"""Shared test helpers: random data (never zeros) and sequential references."""

from __future__ import annotations

import torch

import speedtorch


def random_table(num_rows: int, dim: int, dtype=torch.float32, pinned: bool = False, generator=None):
    """A random table (never zeros: zeros hide unwritten rows)."""
    values = torch.randn(num_rows, dim, generator=generator).to(dtype)
    if not pinned:
        return values
    table = speedtorch.pinned_empty(num_rows, dim, dtype=dtype)
    table.copy_(values)
    return table


def last_wins_reference(table: torch.Tensor, indices: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """table[indices] = src written by a sequential loop: the semantics scatter_ promises for duplicates."""
    out = table.clone()
    flat = indices.reshape(-1).tolist()
    rows = src.reshape(len(flat), src.shape[-1])
    for position, row in enumerate(flat):
        out[row] = rows[position]
    return out
