"""A small recommender workload (bench/BASELINES.md) trained several ways, shared by ``python -m speedtorch demo`` and
``bench/train.py``: a user table (the big one) and an item table, scored by a dot product, trained with binary
cross-entropy on Zipf-skewed user ids.

Ways (each a class with ``step(users, items, labels) -> loss``):

- ``speedtorch``: users in a :class:`speedtorch.nn.HostEmbedding` (table + Adam state in pinned host RAM).
- ``speedtorch_both_tables``: the same, and the item table a HostEmbedding too, on the compute device
  (``placement="gpu"`` there; on the CPU, host RAM) with the fused Adam instead of SparseAdam: every embedding table
  through speedtorch, as a user of it would train them.
- ``speedtorch_gpu``: the same module with ``placement="gpu"`` (table + state in GPU memory, when they fit).
- ``speedtorch_hybrid``: ``placement="hybrid"``: every row in pinned host RAM, a row cache of ``HOT_FRACTION`` of
  the table on the GPU (loaded first with the hottest Zipf ranks, then following the ids used).
- ``gpu_sparse_adam``: the whole user table on the GPU, ``nn.Embedding(sparse=True)`` + ``SparseAdam``.
- ``torch_staged``: user rows and their Adam state in pinned host tensors, swapped with torch ops each step (unique
  ids, ``index_select`` into staging, copies up; ``index_copy_`` back), Adam applied on the GPU to the swapped rows.
- ``cpu_sparse_adam``: the user table on the CPU, ``nn.Embedding(sparse=True)`` + ``SparseAdam`` (the forum's way).

The item table (small) is on the compute device with ``SparseAdam`` in every way but ``speedtorch_both_tables``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..nn import HostEmbedding

WAYS = ("speedtorch", "speedtorch_both_tables", "speedtorch_state_apart", "speedtorch_gpu", "speedtorch_hybrid",
        "gpu_sparse_adam", "torch_staged", "cpu_sparse_adam")
#: The share of users the hybrid way's row cache holds on the GPU.
HOT_FRACTION = 0.01

# zipf_batches spreads Zipf ranks over the table with this multiplicative hash.
_SPREAD = 2654435761


def hottest_users(num_rows: int, count: int) -> torch.Tensor:
    """The ids zipf_batches gives the `count` most frequent Zipf ranks (ranks 0 .. count-1)."""
    ranks = torch.arange(count, dtype=torch.int64)
    return torch.unique(ranks % num_rows * _SPREAD % num_rows)


def zipf_batches(num_rows: int, batch: int, count: int, exponent: float = 1.2, num_items: int = 100_000,
                 seed: int = 0):
    """`count` batches of (user ids, item ids, labels) on the CPU. User ranks follow Zipf(exponent) (numpy's
    sampler, folded into the table); a fixed multiplicative hash spreads ranks over the table, so hot rows are not
    neighbours."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        ranks = rng.zipf(exponent, batch).astype(np.int64) - 1
        users = (ranks % num_rows) * _SPREAD % num_rows
        items = rng.integers(0, num_items, batch)
        labels = rng.integers(0, 2, batch).astype(np.float32)
        out.append((torch.from_numpy(users), torch.from_numpy(items), torch.from_numpy(labels)))
    return out


class _ItemsMixin:
    def _init_items(self, num_items, dim, device, lr):
        self.items = torch.nn.Embedding(num_items, dim, sparse=True, device=device)
        with torch.no_grad():
            self.items.weight.normal_(0.0, 0.1)
        self.item_opt = torch.optim.SparseAdam(self.items.parameters(), lr=lr)
        self.device = torch.device(device)

    def _loss(self, user_rows, items, labels):
        scores = (user_rows * self.items(items)).sum(-1)
        return F.binary_cross_entropy_with_logits(scores, labels)


class SpeedtorchWay(_ItemsMixin):
    """The user table in a :class:`speedtorch.nn.HostEmbedding` (fused Adam) of ``placement``; the item table an
    ``nn.Embedding`` with SparseAdam, or (``items_in_speedtorch``) a HostEmbedding too."""

    def __init__(self, num_rows, dim, num_items, device, lr=1e-3, placement="host", state_beside_rows=True,
                 items_in_speedtorch=False):
        hot = hottest_users(num_rows, max(1, int(HOT_FRACTION * num_rows))) if placement == "hybrid" else None
        self.users = HostEmbedding(num_rows, dim, device=device, optimizer="adam", optimizer_options={"lr": lr},
                                   init_std=0.1, seed=0, placement=placement, hot_rows=hot,
                                   state_beside_rows=state_beside_rows)
        self._init_items(num_items, dim, device, lr)
        if items_in_speedtorch:
            self.items = HostEmbedding(num_items, dim, device=device, optimizer="adam", optimizer_options={"lr": lr},
                                       init_std=0.1, seed=1,
                                       placement="gpu" if torch.device(device).type == "cuda" else "host")
            self.item_opt = self.items  # its step() applies the fused update; zero_grad() drops pending gradients

    def step(self, users, items, labels):
        """One training step on a batch (user ids, item ids, 0/1 labels): forward, backward, the fused update of the
        user table and the item table's; returns the loss."""
        loss = self._loss(self.users(users), items.to(self.device), labels.to(self.device))
        self.item_opt.zero_grad()
        loss.backward()
        self.users.step()
        self.item_opt.step()
        return loss


class SparseAdamWay(_ItemsMixin):
    """nn.Embedding(sparse=True) + SparseAdam with the user table on `table_device`."""

    def __init__(self, num_rows, dim, num_items, device, table_device, lr=1e-3):
        self.users = torch.nn.Embedding(num_rows, dim, sparse=True, device=table_device)
        with torch.no_grad():
            self.users.weight.normal_(0.0, 0.1)
        self.user_opt = torch.optim.SparseAdam(self.users.parameters(), lr=lr)
        self.table_device = torch.device(table_device)
        self._init_items(num_items, dim, device, lr)

    def step(self, users, items, labels):
        """One training step on a batch (user ids, item ids, 0/1 labels) with SparseAdam on both tables; returns the
        loss."""
        rows = self.users(users.to(self.table_device)).to(self.device)
        loss = self._loss(rows, items.to(self.device), labels.to(self.device))
        self.user_opt.zero_grad()
        self.item_opt.zero_grad()
        loss.backward()
        self.user_opt.step()
        self.item_opt.step()
        return loss


class TorchStagedWay(_ItemsMixin):
    """The swap done with plain torch ops: rows and Adam state through pinned staging, Adam on the GPU."""

    def __init__(self, num_rows, dim, num_items, device, lr=1e-3):
        pin = torch.device(device).type == "cuda"
        self.table = torch.empty(num_rows, dim, pin_memory=pin).normal_(0.0, 0.1)
        self.exp_avg = torch.zeros(num_rows, dim, pin_memory=pin)
        self.exp_avg_sq = torch.zeros(num_rows, dim, pin_memory=pin)
        self.lr, self.t = lr, 0
        self._init_items(num_items, dim, device, lr)

    def _fetch(self, host, idx):
        return host.index_select(0, idx).to(self.device, non_blocking=True)

    def step(self, users, items, labels):
        """One training step on a batch (user ids, item ids, 0/1 labels): the batch's user rows and Adam state fetched
        from pinned host tensors, Adam applied on the compute device, written back; returns the loss."""
        unique, inverse = torch.unique(users, return_inverse=True)
        unique = unique.cpu()  # the host tables are indexed on the host
        rows = self._fetch(self.table, unique).requires_grad_()
        m, v = self._fetch(self.exp_avg, unique), self._fetch(self.exp_avg_sq, unique)
        loss = self._loss(rows[inverse.to(self.device)], items.to(self.device), labels.to(self.device))
        self.item_opt.zero_grad()
        loss.backward()
        self.t += 1
        with torch.no_grad():
            g = rows.grad
            m.mul_(0.9).add_(g, alpha=0.1)
            v.mul_(0.999).addcmul_(g, g, value=0.001)
            denom = (v.sqrt() / math.sqrt(1 - 0.999**self.t)).add_(1e-8)
            rows.addcdiv_(m, denom, value=-self.lr / (1 - 0.9**self.t))
            for host, value in ((self.table, rows), (self.exp_avg, m), (self.exp_avg_sq, v)):
                host.index_copy_(0, unique, value.cpu())
        self.item_opt.step()
        return loss


def make_way(way: str, num_rows: int, dim: int, num_items: int, device, lr: float = 1e-3):
    """The way named ``way`` (one of ``WAYS``, see the module docstring) for a ``num_rows x dim`` user table and
    ``num_items`` items, computing on ``device`` with learning rate ``lr``."""
    if way == "speedtorch":
        return SpeedtorchWay(num_rows, dim, num_items, device, lr)
    if way == "speedtorch_both_tables":
        return SpeedtorchWay(num_rows, dim, num_items, device, lr, items_in_speedtorch=True)
    if way == "speedtorch_state_apart":  # the Adam state in a table of its own instead of beside each row
        return SpeedtorchWay(num_rows, dim, num_items, device, lr, state_beside_rows=False)
    if way == "speedtorch_gpu":
        return SpeedtorchWay(num_rows, dim, num_items, device, lr, placement="gpu")
    if way == "speedtorch_hybrid":
        return SpeedtorchWay(num_rows, dim, num_items, device, lr, placement="hybrid")
    if way == "gpu_sparse_adam":
        return SparseAdamWay(num_rows, dim, num_items, device, device, lr)
    if way == "cpu_sparse_adam":
        return SparseAdamWay(num_rows, dim, num_items, device, "cpu", lr)
    if way == "torch_staged":
        return TorchStagedWay(num_rows, dim, num_items, device, lr)
    raise ValueError(f"unknown way {way!r}; one of {WAYS}")
