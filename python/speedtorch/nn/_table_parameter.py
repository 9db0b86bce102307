"""A host table as an ``nn.Parameter``: what ``named_parameters()``, optimizers, ``GradScaler``, ``zero_grad`` and DDP
see of a :class:`speedtorch.nn.HostEmbedding`.

:class:`HostTableParameter` is the table itself (it shares the table's memory: pinned host RAM for the host and hybrid
placements, device memory for ``placement="gpu"``), registered as the module's ``weight``. It never takes part in
autograd (``requires_grad`` is False: the table is trained by its fused optimizer, and DDP's reducer, which
allocates a gradient bucket per trainable parameter, leaves it alone). Its ``grad`` is the gradient the table's
rows received since the last update, waiting for the fused optimizer's step: a sparse COO tensor of the table's
shape, one row per distinct id, on the device that computed it (which may differ from the table's: a host table
trained on a GPU has its gradient on the GPU), exactly what ``nn.Embedding(sparse=True)`` puts in its weight's
``grad``. So the standard tools work on it as they do on a sparse embedding:

- ``model.zero_grad()`` / ``optimizer.zero_grad()`` drop it (``set_to_none=False`` empties it);
- ``torch.amp.GradScaler.unscale_`` divides its values by the scale in place and records non-finite values, and
  ``GradScaler.step`` skips the update when there were any;
- ``model.requires_grad_(False)`` freezes the table (its module stops handing it gradients), ``True`` unfreezes it;
  the parameter's own ``requires_grad`` stays False;
- ``torch.nn.utils.clip_grad_norm_`` raises on it, as it does on ``nn.Embedding(sparse=True)``'s gradient (torch
  has no norm of a sparse tensor): :func:`clip_grad_norm_` here takes the same arguments and handles both.

A dense torch optimizer must not hold it (it would update the table a second time): build it from
:func:`dense_parameters`; a step of a torch optimizer holding a table with a gradient raises, saying so
(speedtorch/optim.py). DDP broadcasts every registered parameter at construction and refuses a module whose
parameters are on two device types: :func:`ddp_ignore_host_tables` names the tables for DDP to leave alone
(docs/training.md).
"""

from __future__ import annotations

from typing import Iterable, Iterator, Optional

import torch

__all__ = ["HostTableParameter", "clip_grad_norm_", "ddp_ignore_host_tables", "dense_parameters",
           "host_table_parameters"]


class HostTableParameter(torch.nn.Parameter):
    """A :class:`speedtorch.nn.HostEmbedding`'s table as a parameter (shares its memory; ``requires_grad=False``),
    whose ``grad`` is the rows' gradient waiting for the fused optimizer (a sparse COO tensor, or None)."""

    def __new__(cls, data: torch.Tensor, requires_grad: bool = False):  # noqa: ARG003 (Parameter's signature)
        return torch.Tensor._make_subclass(cls, data, False)

    @property
    def grad_shape(self) -> tuple:
        """The shape of the gradient: the whole table's (a sharded table's parameter holds its host's rows only)."""
        return self.__dict__.get("_grad_shape", tuple(self.shape))

    @property
    def grad(self) -> Optional[torch.Tensor]:
        """The table's pending gradient: a sparse COO tensor of the rows touched since the last update (shape
        :attr:`grad_shape`), or None. Settable to such a tensor (or None), as ``nn.Embedding(sparse=True)``'s weight's
        is."""
        return self.__dict__.get("_pending_grad")

    @grad.setter
    def grad(self, value: Optional[torch.Tensor]) -> None:
        if value is not None:
            if not isinstance(value, torch.Tensor) or value.layout != torch.sparse_coo or value.sparse_dim() != 1:
                raise TypeError("HostTableParameter.grad: a host table's gradient is a sparse COO tensor of rows (as "
                                "nn.Embedding(sparse=True) gives), or None")
            if tuple(value.shape) != self.grad_shape:
                raise ValueError(f"HostTableParameter.grad: the gradient has shape {tuple(value.shape)}, the table "
                                 f"{self.grad_shape}")
        self.__dict__["_pending_grad"] = value

    @grad.deleter
    def grad(self) -> None:
        self.__dict__["_pending_grad"] = None

    def requires_grad_(self, requires_grad: bool = True) -> "HostTableParameter":
        """Freezes (``False``) or unfreezes the HostEmbedding that owns the table, as ``requires_grad_`` freezes an
        ``nn.Embedding``'s weight, so ``model.requires_grad_(False)`` freezes host tables too. The flag itself stays
        False: the fused optimizer, not autograd, trains the table."""
        owner = self.__dict__.get("_owner")
        module = owner() if owner is not None else None
        if module is not None:
            module._set_trains(requires_grad)
        return self

    def __deepcopy__(self, memo):
        # A copy of the tensor alone (no pending gradient); HostEmbedding copies its table itself.
        result = type(self)(self.data.clone())
        memo[id(self)] = result
        return result

    def __reduce_ex__(self, protocol):
        # Pickled as a plain parameter of the same values: the pending gradient is not part of a saved model.
        return torch.nn.Parameter(self.data, requires_grad=False).__reduce_ex__(protocol)

    def __repr__(self) -> str:
        return f"HostTableParameter(shape={tuple(self.shape)}, dtype={self.dtype}, device={self.device})"


def rows_gradient(ids: torch.Tensor, rows: torch.Tensor, shape, coalesced: bool) -> torch.Tensor:
    """The sparse COO gradient of a table of ``shape`` whose rows ``ids`` (1-D int64) received ``rows``. With
    ``coalesced`` the ids are strictly increasing (torch.unique's output), which the update then need not sort."""
    return _sparse_rows(ids.reshape(1, -1), rows, shape, coalesced)


def _sparse_rows(indices: torch.Tensor, values: torch.Tensor, shape, coalesced: bool) -> torch.Tensor:
    # The unchecked constructor nn.Embedding(sparse=True)'s backward uses: the ids are in range by construction, and
    # torch.sparse_coo_tensor would warn once per process about the invariant checks it skips.
    return torch.ops.aten._sparse_coo_tensor_unsafe(indices, values, list(shape), is_coalesced=coalesced)


def add_rows_gradient(current: Optional[torch.Tensor], new: torch.Tensor) -> torch.Tensor:
    """``current + new`` without summing duplicates yet (the update sums them): a second backward before a step."""
    if current is None:
        return new
    ids = torch.cat([current._indices(), new._indices().to(current.device)], dim=1)
    values = torch.cat([current._values(), new._values().to(current.device, current.dtype)])
    return _sparse_rows(ids, values, current.shape, False)


def host_table_parameters(module: torch.nn.Module) -> Iterator[torch.Tensor]:
    """The host tables among ``module.parameters()``."""
    return (p for p in module.parameters() if isinstance(p, HostTableParameter))


def dense_parameters(module: torch.nn.Module) -> Iterator[torch.Tensor]:
    """``module.parameters()`` without the host tables: what a torch optimizer for the rest of the model takes
    (``torch.optim.Adam(speedtorch.nn.dense_parameters(model))``)."""
    return (p for p in module.parameters() if not isinstance(p, HostTableParameter))


def ddp_ignore_host_tables(module: torch.nn.Module) -> torch.nn.Module:
    """Tells ``DistributedDataParallel`` to leave ``module``'s host tables alone: no broadcast of a table at
    construction (DDP copies every registered parameter from rank 0, and refuses a module whose parameters lie on
    the CPU and a GPU at once), no gradient bucket for it. Call it on the module you then wrap, before wrapping it;
    the names add to any already set. Returns ``module``."""
    names = [name for name, p in module.named_parameters() if isinstance(p, HostTableParameter)]
    existing = list(getattr(module, "_ddp_params_and_buffers_to_ignore", []))
    torch.nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
        module, existing + [n for n in names if n not in existing])
    return module


@torch.no_grad()
def clip_grad_norm_(parameters: Iterable[torch.Tensor] | torch.Tensor, max_norm: float, norm_type: float = 2.0,
                    error_if_nonfinite: bool = False) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_`` for parameters whose gradients may be sparse (host tables,
    ``nn.Embedding(sparse=True)``): the total norm counts each row of a sparse gradient once, its duplicates summed,
    and clipping scales the sparse values in place as it scales the dense gradients. Returns the total norm."""
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return torch.tensor(0.0)
    norm_type = float(norm_type)
    norms = [torch.linalg.vector_norm((g.coalesce()._values() if g.is_sparse else g).float(), norm_type)
             for g in grads]
    device = norms[0].device
    total = torch.linalg.vector_norm(torch.stack([n.to(device) for n in norms]), norm_type)
    if error_if_nonfinite and not bool(torch.isfinite(total)):
        raise RuntimeError(f"clip_grad_norm_: the total norm of order {norm_type} of the gradients is non-finite, so "
                           "it cannot be clipped (error_if_nonfinite=False scales them by it anyway)")
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g in grads:
        # Scaling the uncoalesced values scales their per-row sums alike.
        values = g._values() if g.is_sparse else g
        values.mul_(coef.to(values.device, values.dtype))
    return total
