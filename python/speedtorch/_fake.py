"""Fake (meta) kernels for torch.compile / torch.export.

The C++ Meta kernels (ops/register_meta.cpp) give shapes, but a fake tensor also needs its device, and a gather may
put its rows on another device than its inputs (pinned host table -> GPU). These fake kernels say so; they take
precedence over the Meta kernels under FakeTensorMode.
"""

from __future__ import annotations

import inspect

import torch

# torch < 2.6 has no allow_override; there the C++ Meta kernels alone serve (outputs follow the inputs' device).
_CAN_OVERRIDE = "allow_override" in inspect.signature(torch.library.register_fake).parameters


def _register_fake(name):
    if not _CAN_OVERRIDE:
        return lambda fn: fn
    return torch.library.register_fake(name, allow_override=True)


def _rows_shape(table: torch.Tensor, indices: torch.Tensor) -> list[int]:
    return [*indices.shape, table.shape[1]]


@_register_fake("speedtorch::gather")
def _gather_fake(table, indices, device=None):
    torch._check(table.dim() == 2, lambda: f"speedtorch.gather: table must be 2-D, got {table.dim()}-D")
    torch._check(
        indices.dtype in (torch.int32, torch.int64),
        lambda: f"speedtorch.gather: indices must be int64 or int32, got {indices.dtype}",
    )
    out_device = torch.device(device) if device is not None else indices.device
    return table.new_empty(_rows_shape(table, indices), device=out_device)


@_register_fake("speedtorch::scatter_rows_")
def _scatter_rows_fake(table, indices, src):
    torch._check(
        list(src.shape) == _rows_shape(table, indices),
        lambda: f"speedtorch.scatter_: src must have shape {_rows_shape(table, indices)}, got {list(src.shape)}",
    )
    return None


@_register_fake("speedtorch::ngram_hash")
def _ngram_hash_fake(tokens, multipliers, bucket_sizes, pad_id, document_starts=None):
    torch._check(tokens.dim() == 2, lambda: f"speedtorch.ngram_hash: tokens must be 2-D, got {tokens.dim()}-D")
    torch._check(multipliers.dim() == 2, lambda: "speedtorch.ngram_hash: multipliers must be 2-D (heads, max_order)")
    heads, max_order = multipliers.shape
    return tokens.new_empty((tokens.shape[0], tokens.shape[1], (max_order - 1) * heads), dtype=torch.int64)


@_register_fake("speedtorch::gather_dequant")
def _gather_dequant_fake(table, indices, format, dim, device=None):
    torch._check(table.dim() == 2, lambda: f"speedtorch.gather_dequant: table must be 2-D, got {table.dim()}-D")
    torch._check(
        indices.dtype in (torch.int32, torch.int64),
        lambda: f"speedtorch.gather_dequant: indices must be int64 or int32, got {indices.dtype}",
    )
    out_device = torch.device(device) if device is not None else indices.device
    return table.new_empty([*indices.shape, dim], dtype=torch.bfloat16, device=out_device)
