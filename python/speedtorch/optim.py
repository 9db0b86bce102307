"""``speedtorch.optim``: torch.optim optimizers over speedtorch's fused row update, for ordinary parameters.

:class:`RowwiseAdagrad` is row-wise Adagrad (FBGEMM's EXACT_ROWWISE_ADAGRAD) for 2-D parameters (embedding
weights, dense or with sparse gradients), which torch.optim lacks: each row keeps one float, the sum over steps of
the mean over the row of its squared gradient. It runs ``speedtorch::row_optimizer_step_`` (the same kernels as
``HostEmbedding(optimizer="rowwise_adagrad")``) on the parameter's rows, so :mod:`speedtorch.compat` can swap its
state rows like any torch.optim optimizer's.
"""

from __future__ import annotations

import torch

__all__ = ["RowwiseAdagrad"]

_STATE_HEADER_FLOATS = 4  # a row's step count (int32 bits), its accumulator, two spare (csrc/optim)


class RowwiseAdagrad(torch.optim.Optimizer):
    """Row-wise Adagrad over 2-D float parameters: ``sum[row] += mean(g[row] ** 2)``, then
    ``w[row] -= lr * g[row] / (sqrt(sum[row]) + eps)``, with ``g = grad + weight_decay * w``. Rows a sparse gradient
    does not name do not move. Its state per parameter is ``state_rows``: ``rows x 4`` float32 (the step count, the
    accumulator and two spare floats per row)."""

    def __init__(self, params, lr: float = 1e-2, eps: float = 1e-8, weight_decay: float = 0.0,
                 initial_accumulator_value: float = 0.0):
        for name, value in (("lr", lr), ("eps", eps), ("weight_decay", weight_decay)):
            if value < 0:
                raise ValueError(f"RowwiseAdagrad: {name} must be >= 0, got {value}")
        super().__init__(params, dict(lr=lr, eps=eps, weight_decay=weight_decay,
                                      initial_accumulator_value=initial_accumulator_value))

    def init_state(self, p: torch.Tensor) -> dict:
        """The state of a fresh parameter (created at its first step; speedtorch.compat creates it up front)."""
        if p.dim() != 2:
            raise ValueError(f"RowwiseAdagrad: parameters must be 2-D (rows x dim), got shape {tuple(p.shape)}")
        state = self.state[p]
        if "state_rows" not in state:
            state["step"] = 0
            state["state_rows"] = torch.zeros(p.shape[0], _STATE_HEADER_FLOATS, dtype=torch.float32, device=p.device)
        return state

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            options = {k: float(group[k]) for k in ("lr", "eps", "weight_decay", "initial_accumulator_value")}
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.init_state(p)
                state["step"] += 1
                grad = p.grad
                if grad.is_sparse and grad.sparse_dim() != 1:  # not rows of an embedding's gradient
                    grad = grad.to_dense()
                if grad.is_sparse:
                    grad = grad.coalesce()
                    rows, values = grad.indices()[0], grad.values()
                else:
                    rows, values = torch.arange(p.shape[0], device=p.device), grad
                torch.ops.speedtorch.row_optimizer_step_(p, state["state_rows"], rows, values, "rowwise_adagrad",
                                                         options, state["step"])
        return loss
