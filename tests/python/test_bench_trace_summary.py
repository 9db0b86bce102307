"""bench/trace_summary.py: per-stream busy and overlapped time, GPU idle time and host waits from a profiler trace,
checked on a hand-made trace whose answers are known (the profiler itself needs a GPU run)."""

from __future__ import annotations

import pytest
from helpers import bench_module


@pytest.fixture(scope="module")
def trace_summary():
    return bench_module("trace_summary")


def kernel(name, start, duration, stream):
    return {"ph": "X", "cat": "kernel", "name": name, "ts": start, "dur": duration, "args": {"stream": stream}}


def test_busy_overlap_idle_and_host_waits(trace_summary):
    events = [
        kernel("gemm", 0, 100, 7), kernel("gemm", 150, 50, 7),  # main: busy 150 us
        kernel("gather", 80, 40, 21),  # side: 80-120, 20 us of it beside the main stream's first kernel
        {"ph": "X", "cat": "cpu_op", "name": "aten::unique", "ts": 0, "dur": 500, "tid": 1},
        {"ph": "X", "cat": "cpu_op", "name": "aten::item", "ts": 10, "dur": 300, "tid": 1},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "ts": 20, "dur": 200, "tid": 1},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 5, "dur": 3, "tid": 1},  # no wait
    ]
    s = trace_summary.summarize_trace(events, steps=2)
    assert s["window_ms"] == pytest.approx(0.1)  # 0-200 us over 2 steps
    assert s["gpu_busy_ms"] == pytest.approx(0.085)  # 0-120 and 150-200: 170 us
    assert s["gpu_idle_ms"] == pytest.approx(0.015)
    by_stream = {st["stream"]: st for st in s["streams"]}
    assert by_stream[7]["busy_ms"] == pytest.approx(0.075) and by_stream[7]["overlapped_ms"] == pytest.approx(0.01)
    assert by_stream[21]["busy_ms"] == pytest.approx(0.02) and by_stream[21]["overlapped_ms"] == pytest.approx(0.01)
    assert s["host_wait_ms"] == pytest.approx(0.1) and s["host_waits"] == 0.5
    assert s["waits_in"] == [{"where": "aten::unique > aten::item", "ms": pytest.approx(0.1), "calls": 0.5}]
    text = trace_summary.format_summary("way", s)
    assert "idle 0.01" in text and "aten::unique > aten::item" in text


def test_a_trace_without_gpu_work(trace_summary):
    s = trace_summary.summarize_trace([], steps=1)
    assert s["streams"] == [] and s["gpu_busy_ms"] == 0.0 and s["waits_in"] == []
