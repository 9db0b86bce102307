"""``speedtorch.nn.NgramHashEmbedding``: the memory of an Engram layer (DeepSeek, arXiv 2601.07372), trained.

Each position's n-grams (orders 2 .. max_order) are hashed by ``heads`` heads (:class:`speedtorch.ngram.NgramHash`,
the ``speedtorch::ngram_hash`` op) into rows of ONE table, a :class:`speedtorch.nn.HostEmbedding` (pinned host RAM by
default, or ``placement="gpu"`` / ``"hybrid"``): the batch's distinct rows of every head are read in one gather, and
forward returns ``(batch, seq, columns * embedding_dim)``, the rows of column ``(n - 2) * heads + h`` side by side.

Training is exact and sparse: duplicate n-grams' gradients are summed into one per distinct row, and the row-wise
optimizer (``"rowwise_adam"`` by default: Adam's first moment per element, its second one float per row; or
``"rowwise_adagrad"``, or any of HostEmbedding's) updates each touched row once, fused, where the row lives.

The ids depend on the tokens only, so :meth:`NgramHashEmbedding.prefetch` hashes the next batch's tokens and reads
its rows on a side stream while this step computes; the update then hands the prefetch the rows it changes
(speedtorch/nn/_prefetched_rows.py: nothing stale is used, nothing is read twice), so training is bit for bit the same
with and without prefetch. On a GPU the update itself runs on a stream of its own
(``async_update``): it overlaps the work queued after it (the rest of the backward with ``update="backward"``, the
dense optimizer and the next forward's first layers with ``"step"``), and every read of the table waits for it.
"""

from __future__ import annotations

import contextlib
from typing import Optional, Sequence, Union

import torch

from ..ngram import NgramHash
from ..ops import transfer_config_override
from .embedding import HostEmbedding

__all__ = ["NgramHashEmbedding"]


class _EngramRows(HostEmbedding):
    """A HostEmbedding whose fused updates run on a CUDA stream of their own (``async_update``; HostEmbedding's
    update stream): every later read of the table (forward's gather, a prefetch, host access) waits for the updates
    queued before it."""

    def __init__(self, *args, async_update: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        # The hybrid placement's row cache allocates device memory inside its steps: keep those on one stream.
        self.async_update = bool(async_update) and self.device.type == "cuda" and self.placement != "hybrid"

    def wait_for_updates(self) -> None:
        """Makes the current stream wait for the updates queued so far."""
        self._wait_for_writes()

    def save(self, path: str) -> None:
        self._sync_for_host_access()
        super().save(path)


class NgramHashEmbedding(torch.nn.Module):
    """Hashed n-gram embeddings in one table, trained by a fused row-wise optimizer.

    Args:
        vocab_size: token ids are below it. embedding_dim: the width of one head's row.
        heads, max_order, rows_per_head, pad_id, layer, seed, multipliers, bucket_sizes, taken: the hash
            (:class:`speedtorch.ngram.NgramHash`); the table has ``num_rows = bucket_sizes.sum()`` rows.
        optimizer, optimizer_options, update, placement, device, dtype, state_beside_rows, init_std, init_seed,
            table, and the hybrid placement's cache options (``cache_rows``, ``hot_fraction``): the table
            (:class:`speedtorch.nn.HostEmbedding`'s arguments; ``init_seed`` is its ``seed``). ``init_std``
            defaults to 0: Engram tables start at zero, so a new layer starts as the identity of the model around it.
        async_update: on a GPU, run the fused update on a stream of its own (see the module's docstring; not with
            ``placement="hybrid"``). The results are the same bits either way.

    ``forward(tokens, document_starts=None)``: tokens ``(batch, seq)`` int ids (any device; moved to the module's),
    ``seq >= max_order``; ``document_starts`` marks where packed documents begin (n-grams never span two). Returns
    ``(batch, seq, output_dim)`` with ``output_dim = (max_order - 1) * heads * embedding_dim``.
    """

    def __init__(self, vocab_size: int, embedding_dim: int, *, heads: int = 8, max_order: int = 3,
                 rows_per_head: Union[int, Sequence[int]] = 1 << 16, pad_id: int = 0, layer: int = 0, seed: int = 0,
                 multipliers: Optional[torch.Tensor] = None, bucket_sizes: Optional[torch.Tensor] = None,
                 taken: Optional[set] = None, optimizer: str = "rowwise_adam", optimizer_options: Optional[dict] = None,
                 update: str = "step", placement: str = "host", device: Optional[Union[torch.device, str]] = None,
                 dtype: torch.dtype = torch.float32, state_beside_rows: bool = True, init_std: float = 0.0,
                 init_seed: Optional[int] = None, table=None, async_update: bool = True, **cache_options):
        super().__init__()
        self.hash = NgramHash(vocab_size, rows_per_head, heads=heads, max_order=max_order, pad_id=pad_id, layer=layer,
                              seed=seed, multipliers=multipliers, bucket_sizes=bucket_sizes, taken=taken)
        self.rows = _EngramRows(self.hash.num_rows, embedding_dim, optimizer=optimizer,
                                optimizer_options=optimizer_options, update=update, device=device, dtype=dtype,
                                state_beside_rows=state_beside_rows, init_std=init_std, seed=init_seed,
                                placement=placement, table=table, async_update=async_update, **cache_options)
        self.hash.to(self.rows.device)
        self.embedding_dim = int(embedding_dim)
        self.output_dim = self.hash.columns * self.embedding_dim
        self._prefetched: Optional[tuple] = None  # (tokens, document_starts, ids, their event) of the last prefetch

    def __getstate__(self) -> dict:
        # A prefetch belongs to this process's next forward: copies and pickles start without one.
        return dict(self.__dict__, _prefetched=None)

    @property
    def device(self) -> torch.device:
        """Where the rows are gathered to and forward's output lives."""
        return self.rows.device

    @property
    def num_rows(self) -> int:
        """Rows of the table: the sum of the hash's bucket sizes."""
        return self.hash.num_rows

    def extra_repr(self) -> str:
        """The module's repr line: the output width."""
        return f"output_dim={self.output_dim}"

    def row_ids(self, tokens: torch.Tensor, document_starts: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The ``(batch, seq, columns)`` row ids of the tokens' n-grams, on the module's device."""
        tokens = tokens.to(self.device, non_blocking=True)
        if document_starts is not None:
            document_starts = document_starts.to(self.device, non_blocking=True)
        return self.hash(tokens, document_starts)

    def forward(self, tokens: torch.Tensor, document_starts: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The tokens' n-gram rows, ``(batch, seq, output_dim)`` (see the class); uses the rows of a :meth:`prefetch`
        made for these very tensors."""
        prefetched, self._prefetched = self._prefetched, None
        if prefetched is not None and prefetched[0] is tokens and prefetched[1] is document_starts:
            ids, hashed = prefetched[2], prefetched[3]  # the very tensor the rows were prefetched for
            if hashed is not None:  # hashed on the prefetch's stream, which need not be this one
                torch.cuda.current_stream(self.device).wait_event(hashed)
                ids.record_stream(torch.cuda.current_stream(self.device))
        else:
            if prefetched is not None:  # prefetched for other tokens: not used, and no longer worth tracking
                self.rows.drop_prefetch()
            ids = self.row_ids(tokens, document_starts)
        rows = self.rows(ids)  # (batch, seq, columns, embedding_dim)
        return rows.reshape(ids.shape[0], ids.shape[1], self.output_dim)

    def prefetch(self, next_tokens: torch.Tensor, next_document_starts: Optional[torch.Tensor] = None, *,
                 max_sms: Optional[int] = None) -> None:
        """Starts reading the rows of the next batch (on a side stream on a GPU) while this step computes. Pass the
        same tensor objects to the next forward. Rows this step's update changes are read again at that forward.
        Tokens on the GPU are hashed on the current stream, which must be ordered after what made them (on another
        thread, whose current stream is its own default one, set one that waited for the caller's: the Engram GPT's
        ``Trainer`` does); the table itself is not touched by a backward when it updates at ``step()``, so such a
        prefetch may run while the caller queues the backward.

        ``max_sms``: bound the prefetch's gather to this many SMs (the transfer option ``max_sms``; 0: every SM), so
        it leaves the rest to the model's kernels running beside it; ``None`` leaves the setting as it is. Applied as
        :class:`speedtorch.TrainPipeline` does, by :func:`speedtorch.transfer_config_override` around the gather
        only (the hash and the forward's re-read of updated rows run unbounded), and restored when it returns."""
        if max_sms is not None and int(max_sms) < 0:
            raise ValueError(f"max_sms must be >= 0 (0: every SM) or None, got {max_sms}")
        bound = transfer_config_override(max_sms=int(max_sms)) if max_sms is not None else contextlib.nullcontext()
        # Host tokens need nothing the current stream is doing: hash them on the prefetch's own stream, so neither
        # the hash nor the count of distinct ids waits for this step's forward (tokens on a GPU: the current stream
        # hashes them, after what made them).
        on_host = not any(t is not None and t.is_cuda for t in (next_tokens, next_document_starts))
        cuda = self.device.type == "cuda"
        stream = self.rows.side_stream() if on_host and cuda else None
        hashed = None
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            ids = self.row_ids(next_tokens, next_document_starts)
            if cuda:
                # The forward waits for the hash: its stream may be another one (the side stream, or the current
                # stream of a prefetch made on another thread), and with placement="gpu" nothing else orders them.
                hashed = torch.cuda.Event()
                hashed.record(torch.cuda.current_stream(self.device))
            with bound:
                self.rows.prefetch(ids)
        self._prefetched = (next_tokens, next_document_starts, ids, hashed)

    def drop_prefetch(self) -> None:
        """Forgets a prefetch the next forward will not use."""
        self._prefetched = None
        self.rows.drop_prefetch()

    @torch.no_grad()
    def step(self) -> None:
        """Applies the gradients of every backward since the last step (HostEmbedding.step)."""
        self.rows.step()

    def zero_grad(self, set_to_none: bool = True) -> None:  # noqa: ARG002 (nn.Module's signature)
        """Drops the gradients pending since the last :meth:`step` (HostEmbedding.zero_grad)."""
        self.rows.zero_grad()

    def quantized(self, format: str = "fp8_e4m3_ue8m0", **options):
        """A frozen copy for serving (:class:`speedtorch.serving.ngram_lookup.NgramHashLookup`): the same hash, the
        trained rows in ``format`` (:func:`speedtorch.serving.quantized.quantize_rows`; options as there)."""
        from ..serving.ngram_lookup import NgramHashLookup
        from ..serving.quantized import QuantizedRows

        self.rows._sync_for_host_access()
        return NgramHashLookup(self.hash, QuantizedRows.from_table(self.rows.weight, format, **options),
                               device=self.device)
