"""Row-wise sharding of one table over hosts, in three named stages (TorchRec's row-wise sharding, in one screen).

Layout (:class:`RowLayout`): the rows are cut into ``world_size`` blocks of ``ceil(N / world_size)`` rows, as
``torch.chunk`` and a ``Shard(0)`` DTensor cut them; a host holds the blocks of its ranks, one contiguous range, in
shared memory that all of its ranks map (host_shard.py). Within a host, row ``id`` is *owned* by local rank
``id % local_world_size``: the only process that ever writes it, so updates spread evenly over a host's ranks even
when a few ids are hot.

Stages of a lookup (:meth:`RowSharding.gather`) and of an update (:meth:`RowSharding.apply_gradients`):

1. **input dist** -- where ids go: ids of rows on other hosts are bucketed by owner and sent (``all_to_all``);
2. **lookup** -- where rows are read: every rank reads its own host's rows straight from the shared table (UVA from a
   GPU), its own ids' and those other hosts sent it;
3. **output dist** -- where rows go back: the rows read for other hosts return to the ranks that asked.

Gradients travel the other way: summed per distinct row on each rank, scaled for ``mean``, sent to the owner
(``all_to_all``), which applies the fused optimizer once per row (duplicates from several ranks summed by the op).
A fence across the host's ranks then ends the step, so no rank reads a row in step t+1 before its update of step t
is done. With one host, stages 1 and 3 carry nothing and are skipped: the same code with a shortcut.

Each exchange (a lookup's, a step's) opens with a header from every rank to every rank (exchange_headers.py): the row
counts, and what keeps the ranks' collectives paired; a rank that fails its checks, or is at another exchange (of this
table or of another), makes every rank raise instead of reading rows of another exchange.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .exchange_headers import HEADER_BYTES, LOOKUP, STEP, ExchangeHeaders
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


def _bucket(ids: torch.Tensor, dest: torch.Tensor, world: int):
    """Positions of ``ids`` ordered by destination rank, and how many go to each rank."""
    order = torch.sort(dest, stable=True).indices
    return order, torch.bincount(dest, minlength=world)


def _all_to_all(send: torch.Tensor, send_counts: list[int], recv_counts: list[int]) -> torch.Tensor:
    out = send.new_empty((sum(recv_counts), *send.shape[1:]))
    dist.all_to_all_single(out, send.contiguous(), recv_counts, send_counts)
    return out


class RowSharding:
    """Moves ids, rows and gradients between the ranks for one table; see the module docstring."""

    def __init__(self, layout: RowLayout, shard, host_group, comm_device: torch.device, reduction: str,
                 table_id: int, control_group):
        self.layout = layout
        self.shard = shard  # this host's rows (a PinnedEmbedding shared by the host's ranks)
        self.host_group = host_group
        self.comm_device = comm_device  # where collectives take tensors: cpu for Gloo, the GPU for NCCL
        self.reduction = reduction
        self.host_start = layout.host_range(layout.topology.host)[0]
        # table_id: the number every rank agreed on for this table (ShardedHostTable), carried by every header
        # control_group: Gloo, every rank; the headers travel there (exchange_headers.py says why)
        self.headers = ExchangeHeaders(layout.topology.world_size, control_group, table_id,
                                       f"table #{table_id} ({layout.num_rows} rows x {shard.dim()})")
        # What this rank's collectives cost since construction (bench/distributed.py reads them): bytes sent to
        # other ranks, and host seconds inside collective calls (with NCCL, the waits for split sizes and fences).
        self.bytes_sent = 0
        self.collective_seconds = 0.0

    def _timed(self, collective, *args):
        start = time.perf_counter()
        try:
            return collective(*args)
        finally:
            self.collective_seconds += time.perf_counter() - start

    def _to_owners(self, kind: int, ids: torch.Tensor, *payloads: torch.Tensor, bytes_per_row: int):
        """``ids`` (and rows of ``payloads``) bucketed by each id's owner and sent there (``all_to_all``), in an
        exchange of ``kind`` (its header first): what this rank received, in the same order, the order the sent rows
        took, the split sizes both ways, and how many rows all ranks sent (0: nothing followed the header)."""
        dest = self.layout.owner_of(ids).to(self.comm_device)
        order, counts = _bucket(ids, dest, self.layout.topology.world_size)
        send_counts, recv_counts, total = self._timed(self.headers.open, kind, counts)
        self._count_sent(send_counts, bytes_per_row)
        if total == 0:  # every rank knows it from the headers: no rank sends anything, none takes part
            received = [t.new_empty((0, *t.shape[1:]), device=self.comm_device) for t in (ids, *payloads)]
        else:
            received = [self._timed(_all_to_all, t.to(self.comm_device)[order], send_counts, recv_counts)
                        for t in (ids, *payloads)]
        return received, order, send_counts, recv_counts, total

    def refuse_lookup(self, bad_id: int) -> None:
        """This rank's ids for a lookup hold ``bad_id``, out of range: with several hosts it still takes part in the
        lookup's exchange, flagging it, so that every other rank raises too (the caller raises its own error)."""
        if self.layout.topology.num_hosts > 1:
            empty = torch.zeros(self.layout.topology.world_size, dtype=torch.int64)
            self._timed(self.headers.open, LOOKUP, empty, bad_id)

    # --- 1. input dist: where ids go -------------------------------------------------------------------------

    def _input_dist(self, ids: torch.Tensor):
        (asked,), order, send_counts, recv_counts, total = self._to_owners(LOOKUP, ids, bytes_per_row=8)
        return asked, order, send_counts, recv_counts, total

    # --- 2. lookup: where rows are read ------------------------------------------------------------------------

    def _lookup(self, ids: torch.Tensor, device: torch.device) -> torch.Tensor:
        return self.shard.gather(ids - self.host_start, device)

    # --- 3. output dist: where rows go back --------------------------------------------------------------------

    def _output_dist(self, served: torch.Tensor, send_counts: list[int], recv_counts: list[int],
                     total: int) -> torch.Tensor:
        self._count_sent(recv_counts, served.shape[1] * served.element_size(), header_sent=False)
        if total == 0:  # no rank asked for a row (every rank knows it from the input dist's headers)
            return served
        return self._timed(_all_to_all, served, recv_counts, send_counts)  # the reverse of the input dist

    def gather(self, ids: torch.Tensor, device: torch.device) -> torch.Tensor:
        """Rows for ``ids`` (1-D, in range) on ``device``."""
        if self.layout.topology.num_hosts == 1:
            return self._lookup(ids, device)  # every row is on this host: no row travels
        local = self.layout.host_of(ids) == self.layout.topology.host
        rows = torch.empty(ids.numel(), self.shard.dim(), dtype=self.shard.table().dtype, device=device)
        local_pos = local.nonzero().squeeze(1).to(device)
        remote_pos = (~local).nonzero().squeeze(1)
        rows[local_pos] = self._lookup(ids[local], device)
        asked, order, send_counts, recv_counts, total = self._input_dist(ids[remote_pos])
        served = self._lookup(asked, self.comm_device)
        answered = self._output_dist(served, send_counts, recv_counts, total)
        rows[remote_pos.to(device)[order.to(device)]] = answered.to(device)
        return rows

    # --- gradients: to the owner, applied once per row -----------------------------------------------------------

    def apply_gradients(self, ids: torch.Tensor, grad: torch.Tensor) -> None:
        """One optimizer step: ``grad`` (rows of ``ids``, summed per id on this rank) reaches each row's owner."""
        if self.reduction == "mean":
            grad = grad / self.layout.topology.world_size  # as DDP averages dense gradients over the ranks
        (owned_ids, owned_grad), _, _, _, total = self._to_owners(
            STEP, ids, grad, bytes_per_row=8 + grad.shape[1] * grad.element_size())
        if total == 0:
            return  # no rank had a gradient: no step, as in one process (the step count stays)
        self.shard.apply_gradients(owned_ids - self.host_start, owned_grad)
        self.fence()

    def _count_sent(self, counts: list[int], bytes_per_row: int, header_sent: bool = True) -> None:
        # What leaves this process: the headers, and the rows for every rank but itself.
        me = self.layout.topology.rank
        self.bytes_sent += HEADER_BYTES * len(counts) * header_sent + (sum(counts) - counts[me]) * bytes_per_row

    def fence(self) -> None:
        """Returns once every rank of this host has finished its writes to the shared rows."""
        if self.comm_device.type == "cuda":
            torch.cuda.current_stream(self.comm_device).synchronize()  # the owner's UVA kernels have landed
        self._timed(dist.barrier, self.host_group)
