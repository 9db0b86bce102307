"""Interleaved timing for the benchmarks in bench/: every way alive at once, timed in rounds, one way after the other
within a round. The lent GPU machines drift by 15-25% over minutes; taking turns puts that drift on every way alike,
so the ratios printed from one run compare like with like. Works on the CPU too (no synchronize there).

- `time_steps`: training ways (objects with ``step(users, items, labels) -> loss``), median ms per step.
- `time_calls`: plain callables (a gather, a scatter), median seconds per call.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def time_steps(entries: dict, steps: int, rounds: int, warmup: int) -> dict:
    """`entries` maps a label to (way, batches); each way steps `warmup` times, then `rounds` rounds of
    ``steps // rounds`` timed steps each, every turn starting with an untimed step (it runs cold after the other
    ways' turns: the CPU-bound ones leave the GPU idle). Returns label -> (median ms per step, first loss, last
    loss)."""
    for way, batches in entries.values():
        for i in range(warmup):
            way.step(*batches[i % len(batches)])
    times = {label: [] for label in entries}
    losses = {label: [] for label in entries}
    per_round = max(1, steps // rounds)
    for r in range(rounds):
        for label, (way, batches) in entries.items():
            way.step(*batches[(r * per_round) % len(batches)])
            for i in range(per_round):
                _sync()
                start = time.perf_counter()
                loss = way.step(*batches[(r * per_round + i) % len(batches)])
                _sync()
                times[label].append(time.perf_counter() - start)
                losses[label].append(float(loss.detach()))
    return {label: (statistics.median(times[label]) * 1e3, losses[label][0], losses[label][-1]) for label in entries}


def time_calls(calls: dict[str, Callable[[], object]], reps: int, rounds: int, warmup: int = 3) -> dict[str, float]:
    """Median seconds per call of each callable in `calls`, `reps` timed calls each spread over `rounds` turns
    (each turn starts with an untimed call), after `warmup` calls of each."""
    for fn in calls.values():
        for _ in range(warmup):
            fn()
    _sync()
    times = {label: [] for label in calls}
    per_round = max(1, -(-reps // max(1, rounds)))
    for _ in range(max(1, rounds)):
        for label, fn in calls.items():
            fn()
            for _ in range(per_round):
                _sync()
                start = time.perf_counter()
                fn()
                _sync()
                times[label].append(time.perf_counter() - start)
    return {label: statistics.median(t) for label, t in times.items()}
