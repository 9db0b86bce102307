"""``DistributedHostEmbedding``: :class:`speedtorch.nn.HostEmbedding` over a :class:`ShardedHostTable`, for training
scripts run by ``torchrun`` on one host or many.

Every rank builds the module with the same arguments, feeds it its own batch, and calls :meth:`step` once per
training step (a collective: all ranks call it, with or without gradients). After each step the table and its
optimizer state equal single-process training on the concatenation of all ranks' batches, with the ranks' gradients
averaged (``reduction="mean"``, as DDP does for the dense part) or summed. The module has no ``nn.Parameter``: wrap
the model in ``DistributedDataParallel`` as usual, DDP leaves the table alone.

``state_dict()`` holds ``Shard(0)`` DTensors over the shared memory, so ``torch.distributed.checkpoint`` saves each
rank's block of rows from where it lives (no copy in RAM) and loads a checkpoint written at any world size, or by a
single-process ``HostEmbedding``, in place.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard

from ..nn import HostEmbedding
from .sharded_table import ShardedHostTable

__all__ = ["DistributedHostEmbedding"]


class DistributedHostEmbedding(HostEmbedding):
    """A ``num_embeddings x embedding_dim`` table trained by every rank of the default process group.

    Args are :class:`speedtorch.nn.HostEmbedding`'s (``mode``, ``optimizer``, ``optimizer_options``, ``device``,
    ``dtype``, ``init_std``, ``seed``) and :class:`ShardedHostTable`'s (``reduction``, ``local_world_size``,
    ``shm_dir``). The update runs at :meth:`step`. ``seed`` gives values that depend on the seed and the row only,
    whatever the world size.
    """

    # The rows are in /dev/shm already, shared by the host's ranks: model.share_memory() has nothing to do here.
    _rows_shared_between_processes = True

    def __init__(self, num_embeddings: int, embedding_dim: int, *, mode: Optional[str] = None,
                 optimizer: str = "adam", optimizer_options: Optional[dict] = None,
                 device: Optional[torch.device | str] = None, dtype: torch.dtype = torch.float32,
                 init_std: float = 1.0, seed: Optional[int] = None, reduction: str = "mean",
                 local_world_size: Optional[int] = None, shm_dir: str = "/dev/shm"):
        table = ShardedHostTable(num_embeddings, embedding_dim, dtype, optimizer, optimizer_options,
                                 reduction=reduction, local_world_size=local_world_size, shm_dir=shm_dir)
        table.normal_(0.0, init_std, seed)
        super().__init__(num_embeddings, embedding_dim, mode=mode, optimizer=optimizer,
                         optimizer_options=optimizer_options, device=device, dtype=dtype, table=table)
        self._mesh = DeviceMesh.from_group(table.control_group, "cpu")
        self._awaiting_step = False  # a forward ran whose update step() has not applied yet
        self._queued_prefetch: Optional[torch.Tensor] = None

    def forward(self, input: torch.Tensor, offsets: Optional[torch.Tensor] = None,
                per_sample_weights: Optional[torch.Tensor] = None) -> torch.Tensor:
        if torch.is_grad_enabled():
            self._awaiting_step = True
        return super().forward(input, offsets, per_sample_weights)

    @torch.no_grad()
    def step(self) -> None:
        """The synchronous update: every rank's gradients reach the rows' owners, which apply the fused optimizer
        once per row; returns when this host's rows are updated. Every rank calls it once per training step."""
        if self._pending:
            unique = torch.cat([u for u, _ in self._pending])
            grad = torch.cat([g for _, g in self._pending])
        else:  # this rank has no gradient this step: it still takes part in the exchange
            unique = torch.empty(0, dtype=torch.int64, device=self.device)
            grad = torch.empty(0, self.embedding_dim, dtype=self.table.table().dtype, device=self.device)
        self._pending.clear()
        self.table.apply_gradients(unique, grad)
        self._awaiting_step = False
        if self._queued_prefetch is not None:
            queued, self._queued_prefetch = self._queued_prefetch, None
            super().prefetch(queued)

    def prefetch(self, next_input: torch.Tensor) -> None:
        """Gathers the next batch's rows on a side stream. Other ranks' updates of this step may touch any row, so a
        prefetch asked for before :meth:`step` starts as soon as the step's updates are done (overlapping the rest of
        the step: the dense optimizer, the data loader); asked for after it, at once. With several hosts it is a
        collective: every rank calls it alike."""
        if self._awaiting_step:
            self._queued_prefetch = next_input
        else:
            super().prefetch(next_input)

    # --- state_dict: DTensors over each rank's block of the shared rows -------------------------------------------

    def _table_tensors(self) -> dict:
        out = {}
        for name, tensor in (("weight", self.table.table()), ("optimizer_state", self.table.state())):
            shape = (self.num_embeddings, tensor.shape[1])
            out[name] = DTensor.from_local(self.table.rank_rows(tensor), self._mesh, [Shard(0)], run_check=False,
                                           shape=shape, stride=(shape[1], 1))
        out["optimizer_step"] = torch.tensor(self.table.step_count(), dtype=torch.int64)
        return out

    def _copy_table_tensors(self, found: dict) -> None:
        start, end = self.table.layout.rank_range(self.table.layout.topology.rank)
        ours = self._table_tensors()
        for name in ("weight", "optimizer_state"):
            target = ours[name].to_local()
            value = found[name]
            if isinstance(value, DTensor):
                if value.placements != (Shard(0),) or tuple(value.to_local().shape) != tuple(target.shape):
                    value = value.full_tensor()[start:end]  # another layout: each rank takes its block
                else:
                    value = value.to_local()
            else:
                value = value[start:end]
            if value.data_ptr() != target.data_ptr():  # dcp.load already wrote our own tensors in place
                target.copy_(value)
        self.table.set_step_count(int(found["optimizer_step"]))
        self.table.sharding.fence()

    def save(self, path: str) -> None:
        self.table.save(path)  # explains the DCP way

    @property
    def weight(self) -> torch.Tensor:
        """This host's rows (rows ``table.layout.host_range(host)`` of the table), in shared memory."""
        return self.table.table()
