"""Serving an Engram table: :class:`NgramHashLookup` hashes tokens (``speedtorch::ngram_hash``) and reads their rows
from a bf16 / int8 / fp8 table dequantized inside the gather (``speedtorch::gather_dequant``), and
:meth:`NgramHashLookup.graphed` captures both into a CUDA graph for decode: persistent input and output buffers,
index checks deferred to :func:`speedtorch.check_index_errors`, one ``replay()`` per step.

The table may be pinned host memory (read over UVA: the usual case), GPU memory, shared memory that every process of
the host maps (:meth:`speedtorch.serving.quantized.QuantizedRows.open` on ``/dev/shm``), or a file larger than RAM
mapped without page-locking (read by CPU threads; not capturable). docs/engram.md says which to use when.
"""

from __future__ import annotations

from typing import Optional, Union

import torch

from ..ngram import NgramHash
from ..ops import deferred_index_checks
from .quantized import QuantizedRows

__all__ = ["NgramHashLookup", "GraphedLookup"]


class NgramHashLookup(torch.nn.Module):
    """``forward(tokens, document_starts=None)`` -> ``(batch, seq, columns * dim)`` bfloat16 rows of the tokens'
    n-grams. ``hash`` is the trained layer's :class:`speedtorch.ngram.NgramHash` (copied), ``rows`` its table as
    :class:`speedtorch.serving.quantized.QuantizedRows`; lookups run on ``device``."""

    def __init__(self, hash: NgramHash, rows: QuantizedRows, device: Optional[Union[torch.device, str]] = None):
        super().__init__()
        if rows.num_rows != hash.num_rows:
            raise ValueError(f"NgramHashLookup: the hash addresses {hash.num_rows} rows, the table has {rows.num_rows}")
        if device is None:
            device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        self.hash = NgramHash(hash.vocab_size, multipliers=hash.multipliers.cpu(), bucket_sizes=hash.bucket_sizes.cpu(),
                              pad_id=hash.pad_id).to(self.device)
        self.rows = rows
        self.output_dim = self.hash.columns * rows.dim

    def extra_repr(self) -> str:
        """The module's repr line: the quantized rows and the device."""
        return f"{self.rows!r}, device={self.device}"

    def forward(self, tokens: torch.Tensor, document_starts: Optional[torch.Tensor] = None,
                last_only: bool = False) -> torch.Tensor:
        """``last_only``: the rows of each sequence's last position only, ``(batch, 1, output_dim)``: a decode step,
        given each sequence's last ``max_order`` tokens (its n-grams need them)."""
        tokens = tokens.to(self.device, non_blocking=True)
        if document_starts is not None:
            document_starts = document_starts.to(self.device, non_blocking=True)
        ids = self.hash(tokens, document_starts)
        if last_only:
            ids = ids[:, -1:]
        out = self.rows.gather(ids, self.device)
        return out.reshape(ids.shape[0], ids.shape[1], self.output_dim)

    def graphed(self, batch: int, seq: int, *, document_starts: bool = False,
                last_only: bool = False) -> "GraphedLookup":
        """This lookup for ``(batch, seq)`` tokens captured into a CUDA graph (see :class:`GraphedLookup`)."""
        return GraphedLookup(self, batch, seq, document_starts, last_only)


class GraphedLookup:
    """A :class:`NgramHashLookup` for one input shape, captured into a CUDA graph.

    ``tokens`` (and ``document_starts`` when asked for) are persistent GPU buffers; ``__call__(tokens,
    document_starts=None)`` copies new values into them, replays the graph (hash, then gather and dequantize, all on
    the GPU; the table pinned host memory or GPU memory) and returns ``output``, a persistent buffer that the next
    call overwrites. Bad inputs (a token < 0, which makes its ids -1) are not raised by the replay: the kernels flag
    them and :func:`speedtorch.check_index_errors` raises them (call it where a sync is acceptable)."""

    def __init__(self, lookup: NgramHashLookup, batch: int, seq: int, document_starts: bool = False,
                 last_only: bool = False):
        if lookup.device.type != "cuda":
            raise RuntimeError("GraphedLookup: CUDA graphs need the lookup on a GPU")
        self.lookup = lookup
        self.tokens = torch.full((batch, seq), lookup.hash.pad_id, dtype=torch.int64, device=lookup.device)
        self.document_starts = (torch.zeros(batch, seq, dtype=torch.bool, device=lookup.device)
                                if document_starts else None)
        stream = torch.cuda.Stream(lookup.device)
        stream.wait_stream(torch.cuda.current_stream(lookup.device))
        with torch.cuda.stream(stream), deferred_index_checks():
            lookup(self.tokens, self.document_starts, last_only)  # warm-up: first uses allocate outside the graph
        torch.cuda.current_stream(lookup.device).wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.output = lookup(self.tokens, self.document_starts, last_only)

    def __call__(self, tokens: torch.Tensor, document_starts: Optional[torch.Tensor] = None) -> torch.Tensor:
        self.tokens.copy_(tokens, non_blocking=True)
        if self.document_starts is not None:
            if document_starts is None:
                self.document_starts.zero_()
            else:
                self.document_starts.copy_(document_starts, non_blocking=True)
        elif document_starts is not None:
            raise ValueError("GraphedLookup: captured without document_starts; capture with document_starts=True")
        self.graph.replay()
        return self.output
