"""Shared test helpers: random data (never zeros), sequential references, and the benchmark scripts as modules."""

from __future__ import annotations

import ctypes
import importlib.util
import math
import sys
from pathlib import Path

import numpy
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


def rows_at(table: torch.Tensor, count: int, device: str = "cpu") -> torch.Tensor:
    """The first ``count`` rows of a contiguous float32 host ``table`` as a tensor of their own over the same memory,
    holding no reference to ``table`` (a PinnedEmbedding's row cache stands aside only while a tensor from table()
    is alive). ``device="cuda"``: a CUDA tensor at the same address, the pinned rows as a GPU reads them over UVA."""
    shape = (count, table.shape[1])
    if device == "cpu":
        pointer = ctypes.cast(table.data_ptr(), ctypes.POINTER(ctypes.c_float))
        return torch.from_numpy(numpy.ctypeslib.as_array(pointer, shape=shape))

    class Rows:  # torch.as_tensor takes CUDA memory it does not own through this interface (Numba's)
        __cuda_array_interface__ = {"shape": shape, "typestr": "<f4", "data": (table.data_ptr(), False),
                                    "version": 3, "strides": None}

    return torch.as_tensor(Rows(), device=device)


def last_wins_reference(table: torch.Tensor, indices: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """table[indices] = src written by a sequential loop: the semantics scatter_ promises for duplicates."""
    out = table.clone()
    flat = indices.reshape(-1).tolist()
    rows = src.reshape(len(flat), src.shape[-1])
    for position, row in enumerate(flat):
        out[row] = rows[position]
    return out


class RowwiseAdagrad(torch.optim.Optimizer):
    """FBGEMM's EXACT_ROWWISE_ADAGRAD in plain torch, for 2-D parameters (rows x dim): each row keeps one float, the
    sum over steps of the mean over the row of its squared gradient (weight decay added to the gradient first), and
    moves by lr * g / (sqrt(sum) + eps). The reference speedtorch's "rowwise_adagrad" is tested against."""

    def __init__(self, params, lr=1e-2, eps=1e-8, weight_decay=0.0, initial_accumulator_value=0.0):
        super().__init__(params, dict(lr=lr, eps=eps, weight_decay=weight_decay,
                                      initial_accumulator_value=initial_accumulator_value))

    @torch.no_grad()
    def step(self, closure=None):  # noqa: ARG002
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad + group["weight_decay"] * p
                state = self.state[p]
                if "sum" not in state:
                    state["sum"] = torch.full((p.shape[0],), float(group["initial_accumulator_value"]))
                state["sum"] += g.pow(2).mean(1)
                p -= group["lr"] * g / (state["sum"].sqrt() + group["eps"]).unsqueeze(1)


class RowwiseAdam(torch.optim.Optimizer):
    """FBGEMM's PARTIAL_ROWWISE_ADAM in plain torch, for 2-D parameters (rows x dim): Adam's first moment per element,
    its second moment one float per row (the beta2-weighted mean of the row's mean squared gradient; weight decay
    added to the gradient first), bias-corrected with the optimizer's step. The reference speedtorch's "rowwise_adam"
    is tested against."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):  # noqa: ARG002
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad + group["weight_decay"] * p
                state = self.state[p]
                if not state:
                    state.update(step=0, m=torch.zeros_like(p), v=torch.zeros(p.shape[0]))
                state["step"] += 1
                k = state["step"]
                state["m"].mul_(beta1).add_((1 - beta1) * g)
                state["v"].mul_(beta2).add_((1 - beta2) * g.pow(2).mean(1))
                denom = state["v"].sqrt() / math.sqrt(1 - beta2**k) + group["eps"]
                p -= (group["lr"] / (1 - beta1**k)) * (state["m"] / denom.unsqueeze(1))


BENCH = Path(__file__).resolve().parents[2] / "bench"


def bench_module(name: str):
    """bench/<name>.py imported as a module (the scripts import their siblings: bench/ is on the path meanwhile)."""
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCH))
