"""Torch's own way to move a batch of rows of a pinned host table to the GPU and back, the baseline that
bench/transfer.py and bench/sweep.py measure speedtorch against: ``index_select`` into pinned staging, then one
contiguous copy (and the reverse, with ``index_copy_``)."""

from __future__ import annotations

from typing import Callable

import torch


def torch_staged_calls(table: torch.Tensor, idx_cpu: torch.Tensor, out: torch.Tensor, src: torch.Tensor,
                       staging: torch.Tensor) -> tuple[Callable[[], None], Callable[[], None]]:
    """(gather, scatter): gather fills GPU `out` with ``table[idx_cpu]``; scatter writes GPU `src` to those rows.
    `staging` is a pinned host tensor of `out`'s shape."""

    def gather() -> None:
        torch.index_select(table, 0, idx_cpu, out=staging)
        out.copy_(staging, non_blocking=True)

    def scatter() -> None:
        staging.copy_(src)
        table.index_copy_(0, idx_cpu, staging)

    return gather, scatter
