"""The fake kernel of ``gather`` for torch.compile / torch.export: the one thing the C++ Meta kernels cannot say.

Every operator's checks and output shapes are its C++ Meta kernel's (ops/register_meta.cpp: the checks the CPU and
CUDA kernels run, sizes read as symbols), and FakeTensorMode uses those as they are, except for gather: its rows may
land on another device than its inputs (a pinned host table gathered to a GPU), which a meta tensor cannot express.
So gather has a fake kernel here (it replaces the Meta kernel), which runs the same C++ checks
(``speedtorch::check_gather_arguments``) and puts the rows on the device asked for.
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


@_register_fake("speedtorch::gather")
def _gather_fake(table, indices, device=None):
    torch.ops.speedtorch.check_gather_arguments(table, indices)
    out_device = torch.device(device) if device is not None else indices.device
    return table.new_empty([*indices.shape, table.shape[1]], device=out_device)


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
