"""Row-wise sharding of several tables exchanged together: the groups of a distributed collection (collection.py),
in row_sharding.py's three stages, with one header and one ``all_to_all`` each way for all the tables of a lookup,
and one for all the tables of a step, whatever their number.

Each table keeps its own :class:`RowSharding` (its layout over hosts, its host's shared shard, its owners); this class
only moves the rows of all of them at once. A rank's send buffer is bytes: for each destination rank, the rows of
table 0 it sends there, then those of table 1, and so on (ids as int64 for the input dist; rows in their table's dtype
for the output dist; for a step, each row's id and float32 gradient side by side). The headers
(exchange_headers.py) carry how many rows of each table go to each rank, so every rank cuts what it receives the
same way, and tables of different widths and dtypes share one exchange.

With one host, stages 1 and 3 carry nothing and are skipped (every rank reads every row of its host from shared
memory); the step's exchange still runs: each row's gradient reaches the one local rank that owns it.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .exchange_headers import LOOKUP, STEP, ExchangeHeaders, header_bytes
from .row_sharding import RowSharding, _bucket

__all__ = ["CollectionSharding"]


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    """The rows of 2-D ``t`` as bytes: ``(len(t), bytes per row)`` uint8, the same memory when ``t`` is contiguous."""
    return t.contiguous().view(torch.uint8)


def _from_bytes(b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The inverse of :func:`_as_bytes`: ``(len(b), width)`` of ``dtype``."""
    return b.contiguous().view(dtype)


class CollectionSharding:
    """Moves ids, rows and gradients of several tables (each with its :class:`RowSharding`) between the ranks in one
    exchange per lookup and one per step; see the module docstring. ``set_id`` is the number every rank agreed on
    for this set of tables (its headers' identity) and ``name`` how errors name it."""

    def __init__(self, shardings: list[RowSharding], control_group, set_id: int, name: str):
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
        dist.all_to_all_single(received, send, recv_bytes, send_bytes)
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
        buckets = [_bucket(d, d.to(self.comm_device), world) for d in dest]
        counts = torch.stack([c.cpu() for _, c in buckets], 1)  # (world, tables)
        send_counts, recv_counts, totals = self.headers.open(kind, counts)
        self._count("headers", [header_bytes(len(dest))] * world)
        if sum(totals) == 0:
            return [p[:0] for p in payload], [o for o, _ in buckets], send_counts, recv_counts, totals
        ordered = [p.to(self.comm_device)[o.to(self.comm_device)] for p, (o, _) in zip(payload, buckets)]
        received = self._all_to_all("gradients" if kind == STEP else "input_dist", ordered, send_counts, recv_counts)
        return received, [o for o, _ in buckets], send_counts, recv_counts, totals

    # --- 1. input dist: where ids go -----------------------------------------------------------------------------

    def _input_dist(self, ids: list[torch.Tensor]):
        """Ids of rows on other hosts, per table, to the rank that owns each (one exchange for all tables)."""
        dest = [s.layout.owner_of(i) for s, i in zip(self.shardings, ids)]
        payload = [_as_bytes(i.reshape(-1, 1)) for i in ids]
        received, order, send_counts, recv_counts, _ = self._to_owners(LOOKUP, dest, payload)
        asked = [_from_bytes(r, torch.int64).reshape(-1) for r in received]
        return asked, order, send_counts, recv_counts

    # --- 2. lookup: where rows are read --------------------------------------------------------------------------

    def _lookup(self, ids: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
        """Each table's rows for its ids (all on this host), straight from the host's shared table."""
        return [s._lookup(i, device) for s, i in zip(self.shardings, ids)]

    # --- 3. output dist: where rows go back ----------------------------------------------------------------------

    def _output_dist(self, served: list[torch.Tensor], send_counts: list, recv_counts: list) -> list[torch.Tensor]:
        """The rows read for other ranks, back to them (the input dist in reverse), per table in the order the
        input dist sent the ids."""
        if sum(sum(row) for row in recv_counts) + sum(sum(row) for row in send_counts) == 0:
            return [s[:0] for s in served]
        back = self._all_to_all("output_dist", [_as_bytes(s) for s in served], recv_counts, send_counts)
        return [_from_bytes(b, s.dtype) for b, s in zip(back, served)]

    def gather(self, ids: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
        """Rows for ``ids[t]`` (1-D, in range) of every table, on ``device``: the three stages, once for all."""
        if self.topology.num_hosts == 1:
            return self._lookup(ids, device)  # every row is on this host: no row travels
        rows, remote_pos, remote_ids = [], [], []
        for s, i in zip(self.shardings, ids):
            local = s.layout.host_of(i) == self.topology.host
            out = torch.empty(i.numel(), s.shard.dim(), dtype=s.shard.table().dtype, device=device)
            out[local.nonzero().squeeze(1).to(device)] = s._lookup(i[local], device)
            rows.append(out)
            remote_pos.append((~local).nonzero().squeeze(1))
            remote_ids.append(i[remote_pos[-1]])
        asked, order, send_counts, recv_counts = self._input_dist(remote_ids)
        answered = self._output_dist(self._lookup(asked, self.comm_device), send_counts, recv_counts)
        for out, pos, o, a in zip(rows, remote_pos, order, answered):
            out[pos.to(device)[o.to(device)]] = a.to(device)
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
            self.shardings[0].fence()  # every table of this host updated before any rank reads in the next step
