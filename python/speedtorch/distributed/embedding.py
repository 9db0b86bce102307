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

from ..nn._prefetched_rows import PrefetchedRows
from ..nn.embedding import HostEmbedding, _options
from .sharded_table import ShardedHostTable

__all__ = ["DistributedHostEmbedding"]


def _refuse_unshared(*, optimizer, max_norm, update, placement, hot_rows, hot_fraction, cache_rows, table) -> None:
    """HostEmbedding's arguments that cannot apply to a table shared by every rank: a clear error for each."""
    why = None
    if optimizer is None:
        why = ("optimizer=None: a frozen table needs no sharding; open the same files on every rank with "
               "speedtorch.PinnedEmbedding.open(path, 'r') and wrap it in a HostEmbedding(table=..., optimizer=None)")
    elif max_norm is not None:
        why = "max_norm: renormalising writes rows in the forward, while other ranks may read them"
    elif update != "step":
        why = "update='backward': the update is a collective every rank joins once a step, at step()"
    elif placement != "host":
        why = f"placement={placement!r}: the shared table lives in each host's shared memory ('host')"
    elif hot_rows is not None or hot_fraction is not None or cache_rows is not None:
        why = "hot_rows / hot_fraction / cache_rows: they size the row cache of placement='hybrid'"
    elif table is not None:
        why = "table=: the module builds its sharded table itself"
    if why is not None:
        raise ValueError(f"DistributedHostEmbedding: {why}")


class DistributedHostEmbedding(HostEmbedding):
    """A ``num_embeddings x embedding_dim`` table trained by every rank of the default process group.

    Args are :class:`speedtorch.nn.HostEmbedding`'s (``padding_idx``, ``scale_grad_by_freq``, ``mode``,
    ``include_last_offset``, ``optimizer``, ``optimizer_options``, ``device``, ``dtype``, ``init_std``, ``seed``;
    ``update`` and ``placement`` take their one distributed value, ``"step"`` and ``"host"``, and the few that
    cannot apply to a table shared by processes raise, saying why) and :class:`ShardedHostTable`'s (``reduction``,
    ``local_world_size``, ``shm_dir``). The update runs at :meth:`step` (or
    :class:`speedtorch.optim.HostEmbeddingOptimizer`'s, which calls it). ``seed`` gives values that depend on the
    seed and the row only, whatever the world size.

    Unlike HostEmbedding, the table is not one of the module's parameters (``weight`` is this host's rows): DDP
    would broadcast a parameter from rank 0 over the other hosts' shards. So a whole model wraps in DDP as usual.
    """

    # Its prefetch may exchange ids with other ranks: a TrainPipeline's prefetch="auto" trial keeps one way for all.
    _prefetch_is_collective = True

    # The rows are in /dev/shm already, shared by the host's ranks: model.share_memory() has nothing to do here.
    _rows_shared_between_processes = True

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: Optional[int] = None,
                 max_norm: Optional[float] = None, norm_type: float = 2.0, scale_grad_by_freq: bool = False,
                 sparse: bool = True, *, mode: Optional[str] = None, include_last_offset: bool = False,
                 optimizer: str = "adam", optimizer_options: Optional[dict] = None, update: str = "step",
                 device: Optional[torch.device | str] = None, dtype: torch.dtype = torch.float32,
                 state_beside_rows: bool = True, init_std: float = 1.0, seed: Optional[int] = None,
                 placement: str = "host", hot_rows=None, hot_fraction=None, cache_rows=None, table=None,
                 reduction: str = "mean", local_world_size: Optional[int] = None, shm_dir: str = "/dev/shm"):
        _refuse_unshared(optimizer=optimizer, max_norm=max_norm, update=update, placement=placement,
                         hot_rows=hot_rows, hot_fraction=hot_fraction, cache_rows=cache_rows, table=table)
        del state_beside_rows  # the shared table always keeps each row's state beside it
        table = ShardedHostTable(num_embeddings, embedding_dim, dtype, optimizer,
                                 _options(optimizer_options, dtype), reduction=reduction,
                                 local_world_size=local_world_size, shm_dir=shm_dir)
        table.normal_(0.0, init_std, seed)
        if padding_idx is not None:  # nn.Embedding's rule: the padding row starts at zero
            padding_idx %= num_embeddings
            start, end = table.layout.rank_range(table.layout.topology.rank)
            if start <= padding_idx < end:
                table.rank_rows(table.table())[padding_idx - start].zero_()
            table.sharding.fence()
        super().__init__(num_embeddings, embedding_dim, padding_idx, None, norm_type, scale_grad_by_freq, sparse,
                         mode=mode, include_last_offset=include_last_offset, optimizer=optimizer,
                         optimizer_options=optimizer_options, device=device, dtype=dtype, table=table)
        self._mesh = DeviceMesh.from_group(table.control_group, "cpu")
        self._awaiting_step = False  # a forward ran whose update step() has not applied yet
        self._queued_prefetch: Optional[torch.Tensor] = None

    def _registers_weight(self) -> bool:
        return False

    def __getstate__(self):
        raise TypeError("DistributedHostEmbedding cannot be copied or pickled: its table is shared memory of the "
                        "process group; checkpoint it with torch.distributed.checkpoint (docs/distributed.md)")

    def __deepcopy__(self, memo):
        self.__getstate__()

    def forward(self, input: torch.Tensor, offsets: Optional[torch.Tensor] = None,
                per_sample_weights: Optional[torch.Tensor] = None) -> torch.Tensor:
        """HostEmbedding's forward (rows of ``input``, or pooled bags with ``offsets`` / ``per_sample_weights``), the
        rows read from every host's shard; with gradients enabled, marks the step that :meth:`step` must then apply."""
        if torch.is_grad_enabled():
            self._awaiting_step = True
        return super().forward(input, offsets, per_sample_weights)

    @torch.no_grad()
    def step(self) -> None:
        """The synchronous update: every rank's gradients reach the rows' owners, which apply the fused optimizer
        once per row; returns when this host's rows are updated. Every rank calls it once per training step."""
        taken = self._take_gradient()
        if taken is not None:
            unique, grad, _ = taken
        else:  # this rank has no gradient this step: it still takes part in the exchange
            unique = torch.empty(0, dtype=torch.int64, device=self.device)
            grad = torch.empty(0, self.embedding_dim, dtype=torch.float32, device=self.device)
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

    def hand_rows(self, input: torch.Tensor, unique: torch.Tensor, inverse: torch.Tensor, rows: torch.Tensor) -> None:
        """Gives the next lookup of this very ``input`` tensor its rows, gathered by the caller: ``unique`` (its
        distinct ids), ``inverse`` (``input == unique[inverse]``) and ``rows`` (theirs, on :attr:`device`). The
        distributed collection gathers the rows of all its groups in one exchange and hands each group its own."""
        # Rows made on the current stream: ready for it (no event), kept exact by the updates until that lookup.
        self._prefetched = PrefetchedRows(input, unique, inverse, rows, None)

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
        """Raises: a sharded table is saved with ``torch.distributed.checkpoint`` (the error says how;
        docs/distributed.md)."""
        self.table.save(path)  # explains the DCP way

    @property
    def weight(self) -> torch.Tensor:
        """This host's rows (rows ``table.layout.host_range(host)`` of the table), in shared memory."""
        return self.table.table()
