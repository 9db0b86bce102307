"""The fake kernels of ``gather``, ``gather_dequant`` and ``unique_indices`` for torch.compile / torch.export: what the
C++ Meta kernels cannot say.

Every operator's checks and output shapes are its C++ Meta kernel's (ops/register_meta.cpp: the checks the CPU and
CUDA kernels run, sizes read as symbols), and FakeTensorMode uses those as they are, except for the two gathers:
their rows may land on another device than their inputs (a pinned host table gathered to a GPU), which a meta
tensor cannot express. So each has a fake kernel here (it replaces the Meta kernel), which runs the same C++ checks
(``speedtorch::check_gather_arguments`` / ``check_gather_dequant_arguments``) and puts the rows where asked.
``unique_indices`` has no Meta kernel at all: how many distinct values there are depends on the data, a size only
a fake kernel can ask for (``new_dynamic_size``).
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


@_register_fake("speedtorch::unique_indices")
def _unique_indices_fake(indices):
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():  # the operator's own checks, on an empty host tensor of the same dtype
        torch.ops.speedtorch.unique_indices(torch.empty(0, dtype=indices.dtype))
    distinct = torch.library.get_ctx().new_dynamic_size()
    return indices.new_empty(distinct), indices.new_empty(indices.shape, dtype=torch.int64)
