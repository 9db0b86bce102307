"""Timing helpers shared by the CLI demo and bench/: median wall time of a callable that may queue GPU work,
bandwidth, and ratio tables. Timing includes host work on purpose: the staged path is done by CPU threads."""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

import torch


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def host_memory_words() -> str:
    """Where a PinnedEmbedding's rows live on this machine, for the demos' output: memory is only pinned (page-locked
    for the GPU) when there is a GPU."""
    from ..ops import pinned_empty

    return "pinned host RAM" if pinned_empty(1, 1).is_pinned() else "host RAM (not pinned: no GPU)"


def positive_int(text: str) -> int:
    """An argparse type for the demos' sizes and step counts: an int >= 1 (0 rows or 0 steps have nothing to
    measure: a zero-row table cannot be sampled, and zero steps divided the time by zero)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def median_seconds(fn: Callable[[], object], reps: int = 10, warmup: int = 3) -> float:
    """Median seconds per call over `reps` calls after `warmup` calls, synchronizing the GPU around each call."""
    for _ in range(warmup):
        fn()
    _sync()
    times = []
    for _ in range(reps):
        _sync()
        start = time.perf_counter()
        fn()
        _sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def gbps(nbytes: int, seconds: float) -> float:
    """Throughput in GB/s (10^9 bytes per second) of ``nbytes`` moved in ``seconds``."""
    return nbytes / seconds / 1e9


def format_table(rows: list[dict], columns: list[str]) -> str:
    """A plain-text table of `rows` (dicts) with the given column keys."""
    text = [[str(c) for c in columns]]
    for row in rows:
        cells = []
        for c in columns:
            v = row.get(c, "")
            cells.append(f"{v:.3f}" if isinstance(v, float) else str(v))
        text.append(cells)
    widths = [max(len(r[i]) for r in text) for i in range(len(columns))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)) for r in text]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
