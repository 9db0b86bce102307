"""A small GPT with Engram layers, trained on text every machine with Python has: the standard library's own source
files, as bytes. Shared by ``python -m speedtorch engram-demo`` (the example), ``bench/engram.py`` (the GPU figures)
and ``tests/python/test_engram_gpt.py`` (the loss falls, on the CPU, in seconds).

- :func:`stdlib_corpus`: the bytes of the standard library's ``*.py`` files, one document each, and where each
  document starts (n-grams never span two files).
- :class:`EngramGPT`: token embedding, pre-norm causal attention + MLP blocks, and at ``engram_layers`` an Engram
  block: a :class:`speedtorch.nn.NgramHashEmbedding` (hashed 2..N-grams of the input bytes, every head's rows from
  one table in pinned host RAM or, ``placement="gpu"``, in GPU memory), projected to a value and gated by its
  agreement with the hidden state (the paper's context-aware gate: ``sigmoid(rms(h) . rms(W_k e) / sqrt(d))``), added
  to the residual stream.
- :class:`Trainer`: one step = forward, backward, the fused row-wise update of each table and AdamW on the dense
  weights; the next batch's Engram rows are prefetched beside the backward (their gather on a side stream, its host
  work on a thread of its own while this thread queues the backward: the model is launch-bound).
"""

from __future__ import annotations

import contextlib
import glob
import math
import os
import sysconfig
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn.functional as F

from .._prefetch_thread import PrefetchThread
from ..nn import NgramHashEmbedding
from ..pipeline import row_transfers

__all__ = ["stdlib_corpus", "batches", "EngramConfig", "EngramGPT", "Trainer"]

#: Byte values, and one id for padding (hashed before a sequence or document).
VOCAB = 257
PAD = 256


def stdlib_corpus(max_bytes: Optional[int] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(tokens, document_starts)``: the bytes of the standard library's top-level ``*.py`` files in name order (up
    to ``max_bytes``), int64, and a bool tensor set at each file's first byte."""
    folder = sysconfig.get_paths()["stdlib"]
    chunks, starts, total = [], [], 0
    for path in sorted(glob.glob(os.path.join(folder, "*.py"))):
        with open(path, "rb") as f:
            data = f.read()
        if max_bytes is not None:
            data = data[:max_bytes - total]
        if not data:
            break
        starts.append(total)
        chunks.append(torch.frombuffer(bytearray(data), dtype=torch.uint8))
        total += len(data)
    if not chunks:
        raise RuntimeError(f"stdlib_corpus: no Python source files under {folder}")
    tokens = torch.cat(chunks).to(torch.int64)
    document_starts = torch.zeros(tokens.numel(), dtype=torch.bool)
    document_starts[torch.tensor(starts)] = True
    return tokens, document_starts


def batches(tokens: torch.Tensor, document_starts: torch.Tensor, batch: int, seq: int, count: int, seed: int = 0):
    """``count`` batches of ``(inputs, targets, document_starts)``, each ``(batch, seq)``, from random windows."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        begin = torch.randint(0, tokens.numel() - seq - 1, (batch,), generator=g)
        window = begin.unsqueeze(1) + torch.arange(seq + 1)
        out.append((tokens[window[:, :-1]], tokens[window[:, 1:]], document_starts[window[:, :-1]]))
    return out


@dataclass
class EngramConfig:
    """The model's sizes: ``layers`` blocks of ``width`` with ``heads`` attention heads, Engram blocks at
    ``engram_layers``; the Engram hash and table (``hash_heads``, ``max_order``, ``rows_per_head``, ``engram_dim``) and
    how the tables live and train (``placement``, ``optimizer``, ``optimizer_options``, ``dtype``)."""

    layers: int = 4
    width: int = 256
    heads: int = 4
    engram_layers: tuple = (1,)
    #: Engram hash: heads per order, n-gram orders 2 .. max_order, rows per (order, head) column, row width.
    hash_heads: int = 4
    max_order: int = 3
    rows_per_head: int = 1 << 16
    engram_dim: int = 32
    placement: str = "host"
    optimizer: str = "rowwise_adam"
    optimizer_options: dict = field(default_factory=lambda: {"lr": 1e-2})
    dtype: torch.dtype = torch.float32


class _Block(torch.nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = torch.nn.RMSNorm(width), torch.nn.RMSNorm(width)
        self.qkv = torch.nn.Linear(width, 3 * width, bias=False)
        self.proj = torch.nn.Linear(width, width, bias=False)
        self.up = torch.nn.Linear(width, 4 * width, bias=False)
        self.down = torch.nn.Linear(4 * width, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(attended)
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class _EngramBlock(torch.nn.Module):
    """The Engram memory of one layer: hashed n-gram rows -> value, gated by the hidden state, added to it."""

    def __init__(self, config: EngramConfig, layer: int, device: torch.device, taken: set):
        super().__init__()
        self.memory = NgramHashEmbedding(VOCAB, config.engram_dim, heads=config.hash_heads,
                                         max_order=config.max_order, rows_per_head=config.rows_per_head, pad_id=PAD,
                                         layer=layer, taken=taken, optimizer=config.optimizer,
                                         optimizer_options=config.optimizer_options, placement=config.placement,
                                         device=device, dtype=config.dtype)
        self.key = torch.nn.Linear(self.memory.output_dim, config.width, bias=False)
        self.value = torch.nn.Linear(self.memory.output_dim, config.width, bias=False)
        self.key_norm, self.query_norm = torch.nn.RMSNorm(config.width), torch.nn.RMSNorm(config.width)

    def forward(self, x: torch.Tensor, tokens: torch.Tensor, document_starts: Optional[torch.Tensor]) -> torch.Tensor:
        e = self.memory(tokens, document_starts).to(x.dtype)
        score = (self.query_norm(x) * self.key_norm(self.key(e))).sum(-1, keepdim=True) / math.sqrt(x.shape[-1])
        return x + torch.sigmoid(score) * self.value(e)


class EngramGPT(torch.nn.Module):
    """``forward(tokens, document_starts=None) -> logits``; :meth:`engram_modules` lists the Engram tables."""

    def __init__(self, config: EngramConfig, device: torch.device):
        super().__init__()
        self.config = config
        self.embed = torch.nn.Embedding(VOCAB, config.width)
        self.blocks = torch.nn.ModuleList(_Block(config.width, config.heads) for _ in range(config.layers))
        taken: set = set()  # every table column a distinct prime modulus, across layers
        self.engrams = torch.nn.ModuleDict({str(i): _EngramBlock(config, i, device, taken)
                                            for i in config.engram_layers})
        self.norm = torch.nn.RMSNorm(config.width)
        self.head = torch.nn.Linear(config.width, VOCAB, bias=False)
        self.to(device)

    def engram_modules(self) -> list[NgramHashEmbedding]:
        """The Engram tables (:class:`speedtorch.nn.NgramHashEmbedding`), one per Engram layer: what :class:`Trainer`
        prefetches and steps."""
        return [block.memory for block in self.engrams.values()]

    def dense_parameters(self) -> list[torch.nn.Parameter]:
        """The trainable parameters outside the Engram tables (for a dense optimizer such as AdamW)."""
        return [p for p in self.parameters() if p.requires_grad]

    def forward(self, tokens: torch.Tensor, document_starts: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Logits ``(batch, seq, 257)`` for ``tokens`` ``(batch, seq)`` (bytes, 256 = padding); ``document_starts``
        marks where packed documents begin (the n-grams never span two)."""
        x = self.embed(tokens.to(self.head.weight.device, non_blocking=True))
        for i, block in enumerate(self.blocks):
            if str(i) in self.engrams:
                x = self.engrams[str(i)](x, tokens, document_starts)
            x = block(x)
        return self.head(self.norm(x))


class Trainer:
    """Trains an :class:`EngramGPT`: ``step(batch, next_batch=None) -> loss`` (a float tensor on the device).

    ``max_sms``: the SMs the prefetch's gather may take (``NgramHashEmbedding.prefetch``'s ``max_sms``; the rest are
    left to the backward it runs beside); ``None``: no bound.

    ``copy_engines`` (on a GPU): the tables' rows read ahead and written back move by CPU threads and the copy engines
    in stream order (the transfer option ``stream_ordered_staging``, as :class:`speedtorch.TrainPipeline`'s
    ``copy_engines``), and the update of the rows a forward took from a prefetch runs on them in GPU memory: no SM
    spends a step waiting on PCIe beside the model. Over UVA instead (``False``), each table's fused update held SMs
    for 1.8 ms a step beside AdamW, whose kernels then ran 2.3x slower (bench/RESULTS.md, sixteenth session).

    The prefetch's host work (hashing, counting the distinct ids, which waits for the GPU, queueing the gather) would
    hold the backward's launch on this thread, and the model is launch-bound: on a GPU it runs on a thread of its own
    (``speedtorch-prefetch``) while this one queues the backward, when every Engram table updates at ``step()`` (the
    backward then touches neither the tables nor their prefetch slots) and no profiler records (it would see this
    thread only); otherwise here, before the backward. The same bits either way. A prefetch that fails on that
    thread is dropped: the next batch's own forward meets the error (as without prefetch)."""

    _beside_backward_on_cpu = False  # tests: the GPU's prefetch thread on the CPU too

    def __init__(self, model: EngramGPT, lr: float = 3e-3, prefetch: bool = True, autocast: bool = False,
                 max_sms: Optional[int] = None, copy_engines: bool = True):
        if max_sms is not None and int(max_sms) < 0:
            raise ValueError(f"max_sms must be >= 0 (0: every SM) or None, got {max_sms}")
        self.model = model
        self.prefetch = prefetch
        self.max_sms = None if max_sms is None else int(max_sms)
        self.autocast = autocast  # the forward in bfloat16 autocast (on a GPU)
        if not isinstance(copy_engines, bool):
            raise ValueError(f"copy_engines must be True or False, got {copy_engines!r}")
        self.copy_engines = copy_engines
        self.dense = torch.optim.AdamW(model.dense_parameters(), lr=lr, weight_decay=0.0)
        self._prefetch_thread = PrefetchThread(model.head.weight.device, on_cpu=Trainer._beside_backward_on_cpu)
        self._gate: Optional[torch.cuda.Stream] = None  # where the thread's prefetch starts (made at first use)

    def step(self, batch, next_batch=None) -> torch.Tensor:
        """One training step on ``batch`` = ``(inputs, targets, document_starts)``: forward, backward with the prefetch
        of ``next_batch``'s Engram rows (if given) beside it, the tables' fused update and AdamW. Returns the loss
        (detached)."""
        inputs, targets, starts = batch
        device = self.model.head.weight.device
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=self.autocast):
            logits = self.model(inputs, starts)
        loss = F.cross_entropy(logits.reshape(-1, VOCAB).float(), targets.to(device).reshape(-1))
        memories = self.model.engram_modules()
        beside = None
        if self.prefetch and next_batch is not None:  # read under the backward; rows this step updates re-read
            if self._prefetch_thread.may_run_beside() and memories and all(m.rows.update == "step" for m in memories):
                beside = self._prefetch_thread.submit(self._prefetch_beside, next_batch, self._gate_for(next_batch))
            else:
                self._prefetch(next_batch)
        try:
            loss.backward()
        finally:  # a backward that raises (or a Ctrl-C) leaves no prefetch running behind the caller's back
            if beside is not None:
                self._prefetch_thread.wait(beside)
        with self._row_transfers():
            for memory in memories:
                memory.step()
        self.dense.step()
        self.dense.zero_grad(set_to_none=True)
        if next_batch is None:  # the last batch: no thread left idle
            self._prefetch_thread.shutdown()
        return loss.detach()

    def _prefetch(self, next_batch) -> None:
        with self._row_transfers():
            for memory in self.model.engram_modules():
                memory.prefetch(next_batch[0], next_batch[2], max_sms=self.max_sms)

    def _row_transfers(self):
        """The transfer options of the tables' prefetches and updates (speedtorch.pipeline.row_transfers; set around
        each call, on the thread that makes it)."""
        return row_transfers(self.model.head.weight.device, self.copy_engines)

    def _prefetch_beside(self, next_batch, gate: Optional[torch.cuda.Stream]) -> None:
        """:meth:`_prefetch` on the prefetch thread, from ``gate`` (see :meth:`_gate_for`)."""
        try:
            with torch.cuda.stream(gate) if gate is not None else contextlib.nullcontext():
                self._prefetch(next_batch)
        except Exception:  # noqa: BLE001 (raised again by that batch's own forward; this step still trains)
            for memory in self.model.engram_modules():
                memory.drop_prefetch()

    def _gate_for(self, next_batch) -> Optional[torch.cuda.Stream]:
        """On a GPU, the stream the thread's prefetch starts on: it has waited for this thread's work so far (what made
        ``next_batch``'s tensors on the GPU, which are hashed there), not for the backward queued next. (The thread's
        own current stream is its default one: not necessarily this thread's, and behind that backward.) Host tokens
        are hashed on each table's side stream, which needs nothing of this one."""
        if self._prefetch_thread.device.type != "cuda":
            return None
        if self._gate is None:  # high priority: its few kernels (a hash) run between the backward's
            self._gate = torch.cuda.Stream(self._prefetch_thread.device, priority=-1)
        self._gate.wait_stream(torch.cuda.current_stream(self._prefetch_thread.device))
        for t in next_batch:
            if isinstance(t, torch.Tensor) and t.is_cuda:
                t.record_stream(self._gate)  # read there, freed on this thread's stream
        return self._gate


def main(argv: Optional[list] = None) -> int:
    """``python -m speedtorch engram-demo``: trains the GPT on the standard library's bytes and prints the loss."""
    import argparse
    import time

    parser = argparse.ArgumentParser(prog="python -m speedtorch engram-demo", description=main.__doc__)
    cuda = torch.cuda.is_available()
    parser.add_argument("--steps", type=int, default=200 if cuda else 60)
    parser.add_argument("--batch", type=int, default=16 if cuda else 8)
    parser.add_argument("--seq", type=int, default=512 if cuda else 64)
    parser.add_argument("--placement", choices=("host", "gpu"), default="host")
    args = parser.parse_args(argv)
    device = torch.device("cuda" if cuda else "cpu")
    config = (EngramConfig(layers=4, width=384, heads=6, engram_layers=(1,), rows_per_head=1 << 20,
                           placement=args.placement, dtype=torch.bfloat16)
              if cuda else EngramConfig(layers=2, width=64, heads=2, engram_layers=(0, 1), hash_heads=2,
                                        rows_per_head=4096, engram_dim=16, optimizer_options={"lr": 0.05}))
    tokens, starts = stdlib_corpus()
    torch.manual_seed(0)
    model = EngramGPT(config, device)
    trainer = Trainer(model, lr=3e-3 if cuda else 1e-2, autocast=cuda)
    data = batches(tokens, starts, args.batch, args.seq, args.steps + 1)
    rows = sum(m.num_rows for m in model.engram_modules())
    print(f"EngramGPT: {config.layers} layers x {config.width}, Engram at {config.engram_layers} "
          f"({rows:,} table rows, {config.placement} placement), {tokens.numel():,} bytes of the standard library "
          f"on {device}")
    start = time.perf_counter()
    for i in range(args.steps):
        loss = trainer.step(data[i], data[i + 1])
        if i % max(1, args.steps // 10) == 0 or i == args.steps - 1:
            print(f"step {i:4d}  loss {float(loss):.3f}  ({(time.perf_counter() - start) / (i + 1) * 1e3:.1f} ms/step)")
    return 0
