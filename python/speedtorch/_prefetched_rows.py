"""Rows of the next batch read ahead of its forward (``HostEmbedding.prefetch``), kept exact while the table changes.

One mechanism for every module that prefetches (HostEmbedding, the groups of HostEmbeddingBagCollection,
NgramHashEmbedding's rows): a prefetch reads the batch's distinct rows on a side stream; each update of the table
that follows it *patches* the rows it holds with the update's own new rows, which the fused step leaves on the GPU
(``PinnedEmbedding.apply_gradients(..., updated_rows=)``). So the next forward takes rows that are exactly those the
plain loop would read, without a second trip over PCIe and without waiting on the host: the patch is a
``searchsorted`` and an ``index_copy_`` on the GPU, whatever the number of rows in common.

Tables that cannot hand back their updated rows (a GPU row cache, a frequency-chosen HybridTable, unsorted ids)
re-read the rows in common from the table instead (:meth:`PrefetchedRows.refresh`).
"""

from __future__ import annotations

from typing import Optional

import torch


class PrefetchedRows:
    """The distinct rows of one batch: ``key`` (the very ids object the next forward will pass), ``unique`` (sorted
    distinct ids), ``inverse`` (each id's place among them) and ``rows``; ``ready``, on a GPU, the event after which
    they may be read (the gather, then each patch)."""

    def __init__(self, key, unique: torch.Tensor, inverse: torch.Tensor, rows: torch.Tensor,
                 ready: Optional[torch.cuda.Event]):
        self.key = key
        self.unique, self.inverse = unique, inverse
        # One spare row at the end: where a patch sends the updated rows this batch does not hold.
        self._rows = torch.cat([rows, rows[:1] if rows.shape[0] else rows.new_zeros(1, rows.shape[1])])
        self.rows = self._rows[:-1]
        self.ready = ready

    def tensors(self) -> tuple:
        return self.unique, self.inverse, self._rows

    def _wait_here(self) -> Optional[torch.cuda.Stream]:
        """On a GPU: the current stream waits until the rows may be read (and keeps them alive); returns it."""
        if self.ready is None:
            return None
        current = torch.cuda.current_stream(self._rows.device)
        current.wait_event(self.ready)
        for t in self.tensors():
            t.record_stream(current)
        return current

    def _done_here(self, stream: Optional[torch.cuda.Stream]) -> None:
        if stream is not None:
            self.ready = torch.cuda.Event()
            self.ready.record(stream)

    def patch(self, ids: torch.Tensor, new_rows: torch.Tensor) -> None:
        """``ids`` (sorted, distinct) now hold ``new_rows``: the rows among them this batch holds take those values.
        No host wait: the rows not held go to the spare row."""
        n = self.unique.numel()
        if n == 0 or ids.numel() == 0:
            return
        stream = self._wait_here()
        ids = ids.to(self.unique.device, torch.int64)
        pos = torch.searchsorted(self.unique, ids).clamp_(max=n - 1)
        target = torch.where(self.unique[pos] == ids, pos, n)
        self._rows.index_copy_(0, target, new_rows.to(self._rows.device, self._rows.dtype))
        self._done_here(stream)

    def refresh(self, table, ids: torch.Tensor, device: torch.device) -> None:
        """``ids`` were updated in ``table`` without their new rows at hand: the rows among them this batch holds are
        read again from the table (after the update, in stream order)."""
        if self.unique.numel() == 0 or ids.numel() == 0:
            return
        stream = self._wait_here()
        held = torch.isin(self.unique, ids.to(self.unique.device)).nonzero().squeeze(1)
        if held.numel():
            self._rows[held] = table.gather(self.unique[held], device).to(self._rows.dtype)
        self._done_here(stream)

    def take(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(unique, inverse, rows)`` for the forward, on the current stream."""
        stream = self._wait_here()
        if stream is not None and isinstance(self.key, torch.Tensor) and self.key.is_cuda:
            self.key.record_stream(stream)  # made on the side stream, used by the forward from here
        return self.unique, self.inverse, self.rows
