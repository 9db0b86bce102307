"""The fake kernels of ``gather`` and ``gather_dequant`` for torch.compile / torch.export: the one thing the C++
Meta kernels cannot say.

Every operator's checks and output shapes are its C++ Meta kernel's (ops/register_meta.cpp: the checks the CPU and
CUDA kernels run, sizes read as symbols), and FakeTensorMode uses those as they are, except for the two gathers:
their rows may land on another device than their inputs (a pinned host table gathered to a GPU), which a meta
tensor cannot express. So each has a fake kernel here (it replaces the Meta kernel), which runs the same C++ checks
(``speedtorch::check_gather_arguments`` / ``check_gather_dequant_arguments``) and puts the rows where asked.
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


@_register_fake("speedtorch::gather_dequant")
def _gather_dequant_fake(table, indices, format, dim, device=None):
    torch.ops.speedtorch.check_gather_dequant_arguments(table, indices, format, dim)
    out_device = torch.device(device) if device is not None else indices.device
    return table.new_empty([*indices.shape, dim], dtype=torch.bfloat16, device=out_device)
