"""The three stages of row-wise sharding (TorchRec's ``rw_sharding.py``), for one table or several moved together:

1. **input dist** (:meth:`RowExchange._input_dist`) -- where ids go: ids of rows on other hosts, bucketed by owner,
   ``all_to_all``;
2. **lookup** (:meth:`RowExchange._lookup`) -- where rows are read: every rank reads its own host's rows straight from
   the shared table (UVA from a GPU), its own ids' and those other hosts sent it;
3. **output dist** (:meth:`RowExchange._output_dist`) -- where rows go back: to the ranks that asked;

and **gradients** (:meth:`RowExchange.apply_gradients`) -- where gradients go: summed per distinct row on each rank,
scaled for ``mean``, sent to the row's owner, which applies the fused optimizer once per row; a fence across the
host's ranks then ends the step. With one host, stages 1 and 3 carry nothing and are skipped: the same code with a
shortcut, and no row travels for a read.

Each table keeps its own :class:`RowSharding` (row_sharding.py: its layout over hosts, its host's shared shard, its
owners); a ``RowExchange`` moves the rows of its tables -- one for a :class:`ShardedHostTable`, a collection's groups
for :class:`DistributedHostEmbeddingBagCollection` -- with one header exchange and one ``all_to_all`` each way per
lookup, and one per step, whatever their number. A rank's send buffer is bytes: for each destination rank, the rows of
table 0 it sends there, then those of table 1, and so on (ids as int64 for the input dist; rows in their table's
dtype for the output dist; for a step, each row's id and float32 gradient side by side). The headers
(exchange_headers.py) carry how many rows of each table go to each rank, so every rank cuts what it receives the
same way, and tables of different widths and dtypes share one exchange.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from .exchange_headers import LOOKUP, STEP, ExchangeHeaders, header_bytes

__all__ = ["RowExchange"]


def _bucket(dest: torch.Tensor, world: int):
    """Positions ordered by destination rank, and how many go to each rank."""
    return torch.sort(dest, stable=True).indices, torch.bincount(dest, minlength=world)


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    """The rows of 2-D ``t`` as bytes: ``(len(t), bytes per row)`` uint8, the same memory when ``t`` is contiguous."""
    return t.contiguous().view(torch.uint8)


def _from_bytes(b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The inverse of :func:`_as_bytes`: ``(len(b), width)`` of ``dtype``."""
    return b.contiguous().view(dtype)


class RowExchange:
    """Moves ids, rows and gradients of one or several tables (each with its :class:`RowSharding`) between the ranks
    in one exchange per lookup and one per step; see the module docstring. ``set_id`` is the number every rank agreed
    on for the table or set of tables (its headers' identity), ``name`` how errors name it, ``control_group`` the
    Gloo group of every rank the headers travel over."""

    def __init__(self, shardings: list, control_group, set_id: int, name: str):
        self.shardings = shardings
        self.topology = shardings[0].layout.topology
        self.comm_device = shardings[0].comm_device
        self.reduction = shardings[0].reduction
        self.headers = ExchangeHeaders(self.topology.world_size, control_group, set_id, name)
        # What this rank sent to other ranks since construction (bench/dlrm_distributed.py reads it): in all, per
        # stage, and to ranks of other hosts (what crosses the network).
        self.bytes_sent = 0
        self.bytes_by_stage = {"headers": 0, "input_dist": 0, "output_dist": 0, "gradients": 0}
        self.bytes_to_other_hosts = 0
        self.collective_seconds = 0.0  # host seconds inside collective calls (with NCCL, the waits for counts, fences)

    def _timed(self, collective, *args):
        start = time.perf_counter()
        try:
            return collective(*args)
        finally:
            self.collective_seconds += time.perf_counter() - start

    # --- the one exchange every stage uses --------------------------------------------------------------------------

    def _all_to_all(self, stage: str, rows: list[torch.Tensor], send_counts: list,
                    recv_counts: list) -> list[torch.Tensor]:
        """Rows of every table (``rows[t]``: bytes, grouped by destination rank in rank order, ``send_counts[r][t]``
        for rank r) in one ``all_to_all``; what arrives, per table, grouped by source rank in rank order."""
        world, tables = self.topology.world_size, len(rows)
        width = [r.shape[1] for r in rows]
        pieces = [r.split([send_counts[d][t] for d in range(world)]) for t, r in enumerate(rows)]
        send = torch.cat([pieces[t][d].reshape(-1) for d in range(world) for t in range(tables)]
                         + [torch.empty(0, dtype=torch.uint8, device=self.comm_device)])
        send_bytes = [sum(send_counts[d][t] * width[t] for t in range(tables)) for d in range(world)]
        recv_bytes = [sum(recv_counts[s][t] * width[t] for t in range(tables)) for s in range(world)]
        self._count(stage, send_bytes)
        received = send.new_empty(sum(recv_bytes))
        self._timed(dist.all_to_all_single, received, send, recv_bytes, send_bytes)
        cut = received.split([recv_counts[s][t] * width[t] for s in range(world) for t in range(tables)])
        return [torch.cat([cut[s * tables + t].view(-1, width[t]) for s in range(world)]) for t in range(tables)]

    def _count(self, stage: str, send_bytes: list[int]) -> None:
        me, local = self.topology.rank, self.topology.host_ranks(self.topology.host)
        self.bytes_sent += sum(send_bytes) - send_bytes[me]
        self.bytes_by_stage[stage] += sum(send_bytes) - send_bytes[me]
        self.bytes_to_other_hosts += sum(b for r, b in enumerate(send_bytes) if r not in local)

    def _to_owners(self, kind: int, dest: list[torch.Tensor], payload: list[torch.Tensor]):
        """Opens an exchange of ``kind`` (headers first) sending row i of ``payload[t]`` (bytes) to rank
        ``dest[t][i]``: what arrived per table, the order each table's rows took, the counts both ways, and each
        table's row count over all ranks (0 for every table: nothing followed the headers)."""
        world = self.topology.world_size
        buckets = [_bucket(d.to(self.comm_device), world) for d in dest]
        counts = torch.stack([c.cpu() for _, c in buckets], 1)  # (world, tables)
        send_counts, recv_counts, totals = self._timed(self.headers.open, kind, counts)
        self._count("headers", [header_bytes(len(dest))] * world)
        if sum(totals) == 0:
            return [p[:0] for p in payload], [o for o, _ in buckets], send_counts, recv_counts, totals
        ordered = [p.to(self.comm_device)[o.to(self.comm_device)] for p, (o, _) in zip(payload, buckets)]
        received = self._all_to_all("gradients" if kind == STEP else "input_dist", ordered, send_counts, recv_counts)
        return received, [o for o, _ in buckets], send_counts, recv_counts, totals

    def refuse_lookup(self, bad_id) -> None:
        """This rank's ids for a lookup hold ``bad_id``, out of range (True: a value not known here): with several
        hosts it still takes part in the lookup's exchange, flagging it, so that every other rank raises too (the
        caller raises its own error)."""
        if self.topology.num_hosts > 1:
            empty = torch.zeros(self.topology.world_size, len(self.shardings), dtype=torch.int64)
            self._timed(self.headers.open, LOOKUP, empty, bad_id)

    # --- 1. input dist: where ids go -----------------------------------------------------------------------------

    def _input_dist(self, ids: list[torch.Tensor]):
        """Ids of rows on other hosts, per table, to the rank that owns each (one exchange for all tables)."""
        dest = [s.layout.owner_of(i) for s, i in zip(self.shardings, ids)]
        payload = [_as_bytes(i.reshape(-1, 1)) for i in ids]
        received, order, send_counts, recv_counts, totals = self._to_owners(LOOKUP, dest, payload)
        asked = [_from_bytes(r, torch.int64).reshape(-1) for r in received]
        return asked, order, send_counts, recv_counts, sum(totals)

    # --- 2. lookup: where rows are read --------------------------------------------------------------------------

    def _lookup(self, ids: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
        """Each table's rows for its ids (all on this host), straight from the host's shared table, on ``device``."""
        return [s.shard.gather(i - s.host_start, device) for s, i in zip(self.shardings, ids)]

    # --- 3. output dist: where rows go back ----------------------------------------------------------------------

    def _output_dist(self, served: list[torch.Tensor], send_counts: list, recv_counts: list,
                     total: int) -> list[torch.Tensor]:
        """The rows read for other ranks, back to them (the input dist in reverse), per table in the order the
        input dist sent the ids; ``total``: the rows all ranks asked for (0: no rank takes part, as every rank knows
        from the input dist's headers)."""
        if total == 0:
            return served
        back = self._all_to_all("output_dist", [_as_bytes(s) for s in served], recv_counts, send_counts)
        return [_from_bytes(b, s.dtype) for b, s in zip(back, served)]

    def gather(self, ids: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
        """Rows for ``ids[t]`` (1-D, in range) of every table, on ``device``: the three stages, once for all."""
        if self.topology.num_hosts == 1:
            return self._lookup(ids, device)  # every row is on this host: no row travels
        here = [s.layout.host_of(i) == self.topology.host for s, i in zip(self.shardings, ids)]
        mine = self._lookup([i[h] for i, h in zip(ids, here)], device)
        away = [(~h).nonzero().squeeze(1) for h in here]
        asked, order, send_counts, recv_counts, total = self._input_dist([i[a] for i, a in zip(ids, away)])
        answered = self._output_dist(self._lookup(asked, self.comm_device), send_counts, recv_counts, total)
        rows = []
        for i, h, m, a, o, r in zip(ids, here, mine, away, order, answered):
            out = m.new_empty(i.numel(), m.shape[1])
            out[h.nonzero().squeeze(1).to(device)] = m
            out[a.to(device)[o.to(device)]] = r.to(device)
            rows.append(out)
        return rows

    # --- gradients: to the owners, applied once per row ----------------------------------------------------------

    def apply_gradients(self, ids: list[torch.Tensor], grads: list[torch.Tensor]) -> None:
        """One optimizer step of every table: ``grads[t]`` (float32 rows of ``ids[t]``, summed per id on this rank,
        possibly none) reach each row's owner in one exchange; each owner applies each table's fused optimizer once
        to the rows it received. A table no rank had a gradient for takes no step (its step count stays)."""
        world = self.topology.world_size
        dest, payload = [], []
        for s, i, g in zip(self.shardings, ids, grads):
            g = g.to(torch.float32)
            if self.reduction == "mean":
                g = g / world  # as DDP averages dense gradients over the ranks
            dest.append(s.layout.owner_of(i))
            payload.append(torch.cat([_as_bytes(i.to(torch.int64).reshape(-1, 1)), _as_bytes(g.to(i.device))], 1))
        received, _, _, _, totals = self._to_owners(STEP, dest, payload)
        for s, r, total in zip(self.shardings, received, totals):
            if total:  # some rank had a gradient for this table: every rank of its host steps it
                owned_ids = _from_bytes(r[:, :8], torch.int64).reshape(-1)
                owned_grad = _from_bytes(r[:, 8:], torch.float32)
                s.shard.apply_gradients(owned_ids - s.host_start, owned_grad)
        if any(totals):
            self.fence()  # every table of this host updated before any rank reads in the next step

    def fence(self) -> None:
        """Returns once every rank of this host has finished its writes to the shared rows (of every table here)."""
        if self.comm_device.type == "cuda":
            torch.cuda.current_stream(self.comm_device).synchronize()  # the owners' UVA kernels have landed
        self._timed(dist.barrier, self.shardings[0].host_group)
