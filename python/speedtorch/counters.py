"""The library's counters (csrc/metrics/transfer_counters.h) from Python: rows and bytes moved per transfer path,
optimizer rows updated, row-cache hits. docs/metrics.md lists every counter and what it means.

(Named ``counters`` rather than ``stats``: ``speedtorch.stats`` is the function.)"""

from __future__ import annotations

import torch

__all__ = ["stats", "stats_help", "reset_stats", "set_stats_enabled", "stats_enabled", "record_cache_lookups"]


def stats() -> dict[str, float]:
    """Every counter since the library loaded (or the last :func:`reset_stats`), by name, plus two ratios:

    - ``optimizer_distinct_rows_per_step``: ``optimizer_rows_updated / optimizer_steps`` (0.0 before any step);
    - ``cache_hit_rate``: ``cache_hits / (cache_hits + cache_misses)`` (0.0 before any lookup).

    Counters are ints; they count work when it is issued (GPU work may still be running) and are process-wide.
    """
    names, values = torch.ops.speedtorch.stats()
    out: dict[str, float] = dict(zip(names, values))
    steps = out["optimizer_steps"]
    out["optimizer_distinct_rows_per_step"] = out["optimizer_rows_updated"] / steps if steps else 0.0
    lookups = out["cache_hits"] + out["cache_misses"]
    out["cache_hit_rate"] = out["cache_hits"] / lookups if lookups else 0.0
    return out


def stats_help() -> dict[str, str]:
    """One line per counter saying what it counts."""
    names, _ = torch.ops.speedtorch.stats()
    return dict(zip(names, torch.ops.speedtorch.stats_help()))


def reset_stats() -> None:
    """Sets every counter to zero."""
    torch.ops.speedtorch.reset_stats()


def set_stats_enabled(enabled: bool) -> None:
    """Counting is on by default and costs a few relaxed atomic adds per call (bench/metrics_overhead.py); off,
    nothing is counted until it is switched on again. Values already counted are kept."""
    torch.ops.speedtorch.set_stats_enabled(bool(enabled))


def stats_enabled() -> bool:
    """Whether the counters are counting (:func:`set_stats_enabled`; on by default)."""
    return bool(torch.ops.speedtorch.stats_enabled())


def record_cache_lookups(hits: int, misses: int) -> None:
    """Adds row lookups served by a GPU-side row cache (``hits``) or not (``misses``) to ``cache_hits`` /
    ``cache_misses``. For caches kept outside the library (placement.HybridTable counts its hot rows here)."""
    torch.ops.speedtorch.record_cache_lookups(int(hits), int(misses))
