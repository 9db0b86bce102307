"""The header every exchange of ids, rows or gradients opens with: it keeps the ranks' collectives paired, and makes a
failure on one rank an error on every rank.

``torch.distributed`` pairs collectives by position: the n-th ``all_to_all`` of one rank meets the n-th of every
other, whatever each rank meant by it. A rank that raised before an exchange (an id out of range that it caught) or
skipped one (a forward it did not run) would meet another stage's exchange and read its bytes as rows, without an
error. So each exchange starts with a fixed-size header from every rank to every rank, carrying the row counts the
exchange needs anyway and:

- the table the exchange belongs to, the exchange's number on the sending rank and its kind (a lookup, or
  ``step()``): every rank checks that all ranks are at the same exchange of the same table, so ranks that no longer
  pair up all raise ``RuntimeError``. The kind alone is not enough: with two tables, a rank that skips table A's
  forward and runs table B's would meet the others' lookup of A, lookup against lookup;
- the sending rank's status: a rank whose ids failed its own checks still takes part, flagging the failure, so the
  other ranks raise an ``IndexError`` naming it instead of waiting for, or reading, rows that will not come;
- how many rows the sending rank sends in all, so every rank knows whether any rank has anything to send.

Every rank receives the same headers (each rank sends the same fields to all, only the counts differ), so every rank
makes the same decision.

A table's identity is a number the ranks agree on when they build it (``ShardedHostTable``: the largest of the
ranks' next free numbers, so it is the same on every rank even if their counts of earlier tables differ, and no two
tables of one process share it). Not a hash of the table's arguments: two tables of the same shape and optimizer
(the common case: several feature tables) would hash alike. Construction is itself a collective, so tables built in
the same order on every rank get the same numbers.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

__all__ = ["ExchangeHeaders", "LOOKUP", "STEP", "header_bytes"]

LOOKUP, STEP = 0, 1  # the kinds of exchange
_KIND_NAMES = {LOOKUP: "a lookup (a forward or a prefetch)", STEP: "step()"}
_TABLE, _NUMBER, _KIND, _BAD_ID, _HAS_BAD_ID, _COUNT, _TOTAL = range(7)  # the fields of a header (int64 each)
_FIELDS = 7
HEADER_BYTES = 8 * _FIELDS


def header_bytes(tables: int = 1) -> int:
    """Bytes of header one rank sends another per exchange: the fixed header, and for an exchange of several tables
    at once (a collection's groups) each table's row count and total."""
    return HEADER_BYTES + (16 * tables if tables > 1 else 0)


# Table number -> how errors name it ("table #1 (1000 rows x 16)"). Every rank built the same tables under the same
# numbers, so a rank can name the table another rank's header points at.
_TABLE_NAMES: dict[int, str] = {}


def _table_name(table: int) -> str:
    return _TABLE_NAMES.get(table, f"table #{table}")


class ExchangeHeaders:
    """This rank's exchanges of table number ``table``, numbered from 0 (every rank counts the same ones); ``name`` is
    how errors name the table. The headers travel over ``group``, a Gloo group of every rank (the tables' control
    group), on the CPU, whatever backend moves the rows: a rank that died makes the others' next header exchange
    raise at once (its sockets close) or within the process group's timeout, as an error the caller can catch,
    where an NCCL collective with a dead peer would wait until NCCL's watchdog aborts the process."""

    def __init__(self, world_size: int, group, table: int, name: str):
        self.world_size, self.group, self.table = world_size, group, table
        _TABLE_NAMES[table] = name
        self.opened = 0

    def open(self, kind: int, send_counts: torch.Tensor, bad_id: Optional[int] = None):
        """Opens exchange number ``opened`` of ``kind``, sending ``send_counts[r]`` rows to rank r (``bad_id``: this
        rank's ids hold that id out of range, or True when the value is not known; it sends nothing, and raises its
        own error after this returns). ``send_counts`` of shape ``(world, tables)``: rows of several tables at once
        (a collection's groups), counted per table.

        Returns the send and receive counts (lists, per rank; per rank and table for several tables) and how many
        rows all ranks send in all (per table for several tables). Raises on every rank when the ranks are not all
        at this exchange, and on the other ranks when any flagged a bad id; raises RuntimeError when a rank cannot
        be reached (it died, or hangs past the process group's timeout)."""
        counts = send_counts.cpu().to(torch.int64)
        per_table = counts.dim() == 2
        header = torch.zeros(self.world_size, _FIELDS, dtype=torch.int64)
        header[:, _TABLE] = self.table
        header[:, _NUMBER] = self.opened
        header[:, _KIND] = kind
        if bad_id is not None:
            header[:, _HAS_BAD_ID] = 2 if bad_id is True else 1
            header[:, _BAD_ID] = -1 if bad_id is True else bad_id
        header[:, _COUNT] = counts.sum(1) if per_table else counts
        header[:, _TOTAL] = header[:, _COUNT].sum()
        number = self.opened
        headers = self._all_to_all(header, kind, number).tolist()  # headers[r]: what rank r sent this rank
        self.opened += 1
        self._check_paired(headers)
        flagged = [(r, h[_BAD_ID], h[_HAS_BAD_ID]) for r, h in enumerate(headers) if h[_HAS_BAD_ID]]
        if flagged and bad_id is None:
            first, value, known = flagged[0]
            more = f" ({len(flagged) - 1} more rank(s) hold ids out of range)" if len(flagged) > 1 else ""
            held = f"hold {value}, out of range" if known == 1 else "hold an id out of range"
            raise IndexError(f"speedtorch.distributed: rank {first}'s ids {held} for "
                             f"{_table_name(self.table)}{more}; every rank raises this error in this forward (rank "
                             f"{first}'s own error says where its input holds it)")
        if not per_table:
            return counts.tolist(), [h[_COUNT] for h in headers], sum(h[_TOTAL] for h in headers)
        if flagged:  # this rank flagged its own ids (the others raised above): nothing more is exchanged
            return counts.tolist(), [[0] * counts.shape[1]] * self.world_size, [0] * counts.shape[1]
        if counts.shape[1] == 1:  # one table: the header said it all
            return counts.tolist(), [[h[_COUNT]] for h in headers], [sum(h[_TOTAL] for h in headers)]
        # Every rank is at this exchange of this set of tables (checked above), so all send the same table count:
        # each table's rows to each rank, and this rank's total per table (the ranks' sum says whether a table steps).
        tables = counts.shape[1]
        detail = torch.cat([counts, counts.sum(0, keepdim=True).expand(self.world_size, tables)], 1)
        received = self._all_to_all(detail.contiguous(), kind, number)
        return counts.tolist(), received[:, :tables].tolist(), received[:, tables:].sum(0).tolist()

    def _all_to_all(self, send: torch.Tensor, kind: int, number: int) -> torch.Tensor:
        received = torch.empty_like(send)
        try:
            dist.all_to_all_single(received, send, group=self.group)
        except RuntimeError as error:  # Gloo's words only say which socket failed
            raise RuntimeError(
                f"speedtorch.distributed: rank {dist.get_rank()} could not reach every rank at {_KIND_NAMES[kind]} "
                f"of {_table_name(self.table)} (its exchange #{number} of that table): a rank died or stopped "
                f"answering within the process group's timeout. The ranks can no longer train together: restart "
                f"every rank from the last checkpoint (torchrun --max-restarts). Gloo said: {error}"
            ) from error
        return received

    def _check_paired(self, headers: list) -> None:
        def where(h: list) -> str:
            return f"{_KIND_NAMES[h[_KIND]]} of {_table_name(h[_TABLE])} (its exchange #{h[_NUMBER]} of that table)"

        first = headers[0]
        for r, h in enumerate(headers):
            if (h[_TABLE], h[_NUMBER], h[_KIND]) != (first[_TABLE], first[_NUMBER], first[_KIND]):
                raise RuntimeError(
                    f"speedtorch.distributed: the ranks' collectives no longer pair up: rank {r} is in {where(h)} "
                    f"where rank 0 is in {where(first)}. Every rank must call step() of every table once per step "
                    f"and, with several hosts, run every forward and prefetch of every table alike, in the same order "
                    f"(docs/distributed.md); a rank with no batch forwards an empty one")
