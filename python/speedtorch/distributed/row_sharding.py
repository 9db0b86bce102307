"""Row-wise sharding of one table over hosts: where each row lives (:class:`RowLayout`) and which rank owns it, and
the table's :class:`RowSharding`, whose lookups and updates run through row_exchange.py's three stages (input
dist, lookup, output dist; gradients to the owners), TorchRec's row-wise sharding in one screen each.

Layout (:class:`RowLayout`): the rows are cut into ``world_size`` blocks of ``ceil(N / world_size)`` rows, as
``torch.chunk`` and a ``Shard(0)`` DTensor cut them; a host holds the blocks of its ranks, one contiguous range, in
shared memory that all of its ranks map (host_shard.py). Within a host, row ``id`` is *owned* by local rank
``id % local_world_size``: the only process that ever writes it, so updates spread evenly over a host's ranks even
when a few ids are hot.

Each exchange (a lookup's, a step's) opens with a header from every rank to every rank (exchange_headers.py): the row
counts, and what keeps the ranks' collectives paired; a rank that fails its checks, or is at another exchange (of this
table or of another), makes every rank raise instead of reading rows of another exchange.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .row_exchange import RowExchange
from .topology import HostTopology

__all__ = ["RowLayout", "RowSharding"]


@dataclass(frozen=True)
class RowLayout:
    """Where each of ``num_rows`` rows lives under ``topology``: blocks of :attr:`block_rows` rows per rank, each host
    holding its ranks' blocks as one range (see the module docstring)."""

    num_rows: int
    topology: HostTopology

    @property
    def block_rows(self) -> int:
        """Rows per rank block (the last blocks may be shorter or empty)."""
        return max(1, math.ceil(self.num_rows / self.topology.world_size))

    def host_range(self, host: int) -> tuple[int, int]:
        """The rows ``[start, end)`` that ``host`` holds (empty past the last row)."""
        span = self.block_rows * self.topology.local_world_size
        return min(host * span, self.num_rows), min((host + 1) * span, self.num_rows)

    def rank_range(self, rank: int) -> tuple[int, int]:
        """The rows of ``rank``'s block: its part of a checkpoint."""
        return min(rank * self.block_rows, self.num_rows), min((rank + 1) * self.block_rows, self.num_rows)

    def host_of(self, ids: torch.Tensor) -> torch.Tensor:
        """The host holding each of ``ids`` (a tensor of row ids; same shape)."""
        return torch.div(ids, self.block_rows * self.topology.local_world_size, rounding_mode="floor")

    def owner_of(self, ids: torch.Tensor) -> torch.Tensor:
        """The rank that owns (alone writes) each of ``ids``: local rank ``id % local_world_size`` of the id's host, as
        a global rank."""
        local_world = self.topology.local_world_size
        return self.host_of(ids) * local_world + ids % local_world


class RowSharding:
    """One table's place in the process group: its layout, this host's shard of it (a PinnedEmbedding every local
    rank maps), the host's Gloo group (its fences) and where collectives take tensors; its lookups and updates go
    through :attr:`exchange`, a :class:`RowExchange` of this table alone (a collection's groups share one instead)."""

    def __init__(self, layout: RowLayout, shard, host_group, comm_device: torch.device, reduction: str,
                 table_id: int, control_group):
        self.layout = layout
        self.shard = shard  # this host's rows (a PinnedEmbedding shared by the host's ranks)
        self.host_group = host_group
        self.comm_device = comm_device  # where collectives take tensors: cpu for Gloo, the GPU for NCCL
        self.reduction = reduction
        self.host_start = layout.host_range(layout.topology.host)[0]
        # table_id: the number every rank agreed on for this table (ShardedHostTable), carried by every header;
        # control_group: Gloo, every rank; the headers travel there (exchange_headers.py says why)
        self.exchange = RowExchange([self], control_group, table_id,
                                    f"table #{table_id} ({layout.num_rows} rows x {shard.dim()})")

    @property
    def headers(self):
        """The table's exchange headers (how many exchanges it opened: ``headers.opened``)."""
        return self.exchange.headers

    @property
    def bytes_sent(self) -> int:
        """Bytes this rank sent to other ranks for this table since construction (bench/distributed.py)."""
        return self.exchange.bytes_sent

    @property
    def collective_seconds(self) -> float:
        """Host seconds this rank spent in this table's collective calls (with NCCL, the waits for counts and
        fences)."""
        return self.exchange.collective_seconds

    def refuse_lookup(self, bad_id: int) -> None:
        """This rank's ids for a lookup hold ``bad_id``, out of range: with several hosts it still takes part in the
        lookup's exchange, flagging it, so that every other rank raises too (the caller raises its own error)."""
        self.exchange.refuse_lookup(bad_id)

    def gather(self, ids: torch.Tensor, device: torch.device) -> torch.Tensor:
        """Rows for ``ids`` (1-D, in range) on ``device``."""
        return self.exchange.gather([ids], device)[0]

    def apply_gradients(self, ids: torch.Tensor, grad: torch.Tensor) -> None:
        """One optimizer step: ``grad`` (rows of ``ids``, summed per id on this rank) reaches each row's owner."""
        self.exchange.apply_gradients([ids], [grad])

    def fence(self) -> None:
        """Returns once every rank of this host has finished its writes to the shared rows."""
        self.exchange.fence()
