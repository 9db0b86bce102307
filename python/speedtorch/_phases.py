"""Profiler ranges that name the phases of a training step (the ids' checks, their de-duplication, the row gather,
pooling, the interaction, the MLPs, the loss, the tables' update), so that a ``torch.profiler`` trace says which
phase launched each kernel without guessing from kernel names (bench/trace_summary.py's ``summarize_phases`` reads
them; ``python bench/dlrm.py --phases`` prints the table).

``phase(name)`` is a ``torch.profiler.record_function`` range named ``PREFIX + name`` while a profiler records, and
nothing otherwise (one check of the profiler's state: no range object, no dispatcher call), nor while
``torch.compile`` traces (a range is not part of a graph).
"""

from __future__ import annotations

import contextlib

import torch

__all__ = ["PREFIX", "phase"]

PREFIX = "speedtorch.phase: "

_NOTHING = contextlib.nullcontext()


def phase(name: str):
    """A context manager: the range ``PREFIX + name`` in a profiler's trace while one records, else nothing."""
    if torch.compiler.is_compiling() or not torch.autograd._profiler_enabled():
        return _NOTHING
    return torch.profiler.record_function(PREFIX + name)
