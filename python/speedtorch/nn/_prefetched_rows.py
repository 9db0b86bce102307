"""Rows of the next batch read ahead of its forward (``HostEmbedding.prefetch``), kept exact while the table changes.

One mechanism for every module that prefetches (HostEmbedding, the groups of HostEmbeddingBagCollection,
NgramHashEmbedding's rows): a prefetch reads the batch's distinct rows on a side stream, and keeps them exact
through every update of the table that follows it, without a second trip over PCIe and without waiting on the host,
in one of three ways:

- :meth:`PrefetchedRows.advance` (a pinned host table on a GPU, the usual case): the prefetch read each row's
  optimizer state too, so the update is applied to the rows it holds right there in GPU memory, by the same fused
  kernel and step count as the host table's update (``speedtorch::row_optimizer_step_`` on device tensors): the
  same bits. The host table's own update then need not be waited for: it runs on a stream of its own, beside the
  next forward and backward.
  When the update is of the very rows a forward took from a prefetch with their state, and the table's transfers
  use no SM (``stream_ordered_staging``), :meth:`PrefetchedRows.step` runs it on them in GPU memory and the table is
  only written (``PinnedEmbedding.scatter_with_state_``): no row is read from host memory twice. The next batch's
  rows read ahead then take the stepped rows and state they share with it by :meth:`PrefetchedRows.patch` (a copy in
  GPU memory) rather than by :meth:`PrefetchedRows.advance` (the optimizer run again over both batches' rows).
- :meth:`PrefetchedRows.patch`: the update's own new rows, which the fused step leaves on the GPU
  (``PinnedEmbedding.apply_gradients(..., updated_rows=)``; a CPU table, stochastic rounding, renormalised rows):
  a ``searchsorted`` and an ``index_copy_``.
- :meth:`PrefetchedRows.refresh`: tables that cannot hand rows back (a GPU row cache, a frequency-chosen HybridTable,
  unsorted ids) read the rows in common again from the table.
"""

from __future__ import annotations

from typing import Optional

import torch


class PrefetchedRows:
    """The distinct rows of one batch: ``key`` (the very ids object the next forward will pass), ``unique`` (sorted
    distinct ids), ``inverse`` (each id's place among them) and ``rows``; ``ready``, on a GPU, the event after which
    they may be read (the gather, then each patch)."""

    def __init__(self, key, unique: torch.Tensor, inverse: torch.Tensor, rows: torch.Tensor,
                 ready: Optional[torch.cuda.Event], state: Optional[torch.Tensor] = None):
        self.key = key
        self.unique, self.inverse, self.rows = unique, inverse, rows
        self.state = state  # the rows' optimizer state (advance), or None
        self.ready = ready

    def tensors(self) -> tuple:
        return tuple(t for t in (self.unique, self.inverse, self.rows, self.state) if t is not None)

    def _wait_here(self) -> Optional[torch.cuda.Stream]:
        """On a GPU: the current stream waits until the rows may be read (and keeps them alive); returns it."""
        if self.ready is None:
            return None
        current = torch.cuda.current_stream(self.rows.device)
        current.wait_event(self.ready)
        for t in self.tensors():
            t.record_stream(current)
        return current

    def _done_here(self, stream: Optional[torch.cuda.Stream]) -> None:
        if stream is not None:
            self.ready = torch.cuda.Event()
            self.ready.record(stream)

    def patch(self, ids: torch.Tensor, new_rows: torch.Tensor, new_state: Optional[torch.Tensor] = None) -> None:
        """``ids`` (sorted, distinct) now hold ``new_rows`` (and ``new_state``, their optimizer state, when the step
        changed it; a renormalisation does not): the rows among them this batch holds take those values. No host
        wait: the rows not held go to a spare row past the end, dropped."""
        n = self.unique.numel()
        if n == 0 or ids.numel() == 0:
            return
        stream = self._wait_here()
        ids = ids.to(self.unique.device, torch.int64)
        pos = torch.searchsorted(self.unique, ids).clamp_(max=n - 1)
        target = torch.where(self.unique[pos] == ids, pos, n)

        def copied(held: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
            out = torch.cat([held, held.new_empty(1, held.shape[1])])
            out.index_copy_(0, target, new.to(out.device, out.dtype))
            return out[:n]

        self.rows = copied(self.rows, new_rows)
        if self.state is not None and new_state is not None:
            self.state = copied(self.state, new_state)
        self._done_here(stream)

    def advance(self, ids: torch.Tensor, grads: torch.Tensor, optimizer: str, options: dict, step: int) -> None:
        """Applies the table's update of ``ids`` (sorted, distinct; ``grads`` their summed float32 gradients; ``step``
        the table's step count after it) to the rows and state this batch holds. The ids it does not hold go to rows
        of their own past the end, which are dropped: every row the kernel writes is distinct, as the fused step
        requires, and the host waits only for that step's own check of the ids."""
        n, k = self.unique.numel(), ids.numel()
        if n == 0 or k == 0:
            return
        stream = self._wait_here()
        device = self.rows.device
        pos = torch.searchsorted(self.unique, ids).clamp_(max=n - 1)
        target = torch.where(self.unique[pos] == ids, pos, n + torch.arange(k, device=device))
        target, order = torch.sort(target)
        rows = torch.cat([self.rows, self.rows.new_zeros(k, self.rows.shape[1])])
        state = torch.cat([self.state, self.state.new_zeros(k, self.state.shape[1])])
        torch.ops.speedtorch.row_optimizer_step_(rows, state, target, grads.index_select(0, order), optimizer,
                                                 options, int(step), True)
        self.rows, self.state = rows[:n], state[:n]
        self._done_here(stream)

    def holds(self, ids: torch.Tensor) -> bool:
        """Whether ``ids`` is the very tensor of distinct ids these rows are of."""
        return ids.numel() == self.unique.numel() and ids.device == self.unique.device and \
            ids.data_ptr() == self.unique.data_ptr()

    def step(self, grads: torch.Tensor, optimizer: str, options: dict, step: int) -> None:
        """Applies the table's update of every row this batch holds (``grads``: their summed float32 gradients, in
        ``unique``'s order; ``step`` the table's step count after it) to the rows and state, in place, where they are:
        what the table's own update would write for them (``PinnedEmbedding.scatter_with_state_`` then writes it)."""
        n = self.unique.numel()
        if n == 0:
            return
        stream = self._wait_here()
        positions = torch.arange(n, device=self.rows.device)
        torch.ops.speedtorch.row_optimizer_step_(self.rows, self.state, positions, grads, optimizer, options,
                                                 int(step), True)
        self._done_here(stream)

    def refresh(self, table, ids: torch.Tensor, device: torch.device) -> None:
        """``ids`` were updated in ``table`` without their new rows at hand: the rows among them this batch holds are
        read again from the table (after the update, in stream order). Their optimizer state is not read again, so
        the state held is dropped: a later update must not advance the rows with it."""
        if ids.numel():
            self.state = None
        if self.unique.numel() == 0 or ids.numel() == 0:
            return
        stream = self._wait_here()
        held = torch.isin(self.unique, ids.to(self.unique.device)).nonzero().squeeze(1)
        if held.numel():
            self.rows[held] = table.gather(self.unique[held], device).to(self.rows.dtype)
        self._done_here(stream)

    def take(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(unique, inverse, rows)`` for the forward, on the current stream."""
        stream = self._wait_here()
        if stream is not None and isinstance(self.key, torch.Tensor) and self.key.is_cuda:
            self.key.record_stream(stream)  # made on the side stream, used by the forward from here
        return self.unique, self.inverse, self.rows
