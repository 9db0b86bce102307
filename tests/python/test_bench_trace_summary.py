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


def op(name, start, duration, tid=1, cat="cpu_op", **args):
    return {"ph": "X", "cat": cat, "name": name, "ts": start, "dur": duration, "tid": tid, "pid": 1, "args": args}


def launch(start, correlation, tid=1):
    return op("cudaLaunchKernel", start, 2, tid, "cuda_runtime", correlation=correlation)


def gpu(name, start, duration, correlation, stream=7, cat="kernel"):
    return {"ph": "X", "cat": cat, "name": name, "ts": start, "dur": duration,
            "args": {"stream": stream, "correlation": correlation}}


def test_phases_of_a_gpu_trace(trace_summary):
    """Kernels charged to the phase range around their launch (innermost), a backward node to its forward operator's
    phase by sequence number (on the autograd engine's thread), a copy outside the phases to copies, the optimizer's
    range to the dense optimizer; overlapping kernels share their time; the rest of the window is idle."""
    prefix = "speedtorch.phase: "
    events = [
        op(prefix + "steps", 0, 1000, cat="user_annotation"),
        op(prefix + "pooling", 10, 100, cat="user_annotation"),
        op(prefix + "gather", 20, 30, cat="user_annotation"), launch(25, 1),  # gather inside pooling: gather
        op("aten::embedding_bag", 60, 40, **{"Sequence number": 5}), launch(70, 2),  # pooling
        op(prefix + "interaction", 120, 50, cat="user_annotation"),
        op("aten::addmm", 125, 40, **{"Sequence number": 6}), launch(130, 3),
        op("autograd::engine::evaluate_function: AddmmBackward0", 300, 50, tid=2, **{"Sequence number": 6}),
        launch(310, 4, tid=2),  # the interaction's backward
        op("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", 360, 20, tid=2,
           **{"Sequence number": 99}), launch(365, 5, tid=2),  # no forward operator: backward
        op("Optimizer.step#Adagrad.step", 400, 50, cat="user_annotation"), launch(410, 6),
        op("aten::copy_", 500, 10), launch(505, 7),  # a batch's copy, outside the phases
        gpu("gather_kernel", 100, 100, 1), gpu("embedding_bag_kernel", 200, 100, 2),
        gpu("gemm", 250, 100, 3, stream=9),  # beside the pooling kernel for 50 us
        gpu("gemm_backward", 400, 100, 4), gpu("accumulate", 500, 20, 5), gpu("adagrad", 600, 80, 6),
        gpu("Memcpy HtoD", 700, 100, 7, cat="gpu_memcpy"),
    ]
    s = trace_summary.summarize_phases(events, steps=2, wall_ms=0.5)
    ms = {name: p["ms"] * 2e3 for name, p in s["phases"].items()}  # back to us over both steps
    assert ms == pytest.approx({"gather": 100, "pooling": 75, "interaction": 75 + 100, "backward": 20,
                                "dense optimizer": 80, "copies": 100})
    assert s["phases"]["interaction"]["backward_ms"] * 2e3 == pytest.approx(100)
    assert s["phases"]["interaction"]["busy_ms"] * 2e3 == pytest.approx(200)  # overlaps in full
    assert s["window_ms"] * 2e3 == pytest.approx(1000) and s["busy_ms"] * 2e3 == pytest.approx(250 + 120 + 80 + 100)
    assert sum(ms.values()) / 2e3 + s["idle_ms"] == pytest.approx(s["window_ms"])
    text = trace_summary.format_phases("way", s)
    assert "bound by: interaction" in text and "GPU idle" in text


def test_phases_of_a_cpu_trace(trace_summary):
    """Without GPU activity: each instant of the steps' thread to the innermost event around it."""
    prefix = "speedtorch.phase: "
    events = [op(prefix + "steps", 0, 100, cat="user_annotation"),
              op(prefix + "mlp", 10, 40, cat="user_annotation"), op("aten::addmm", 20, 10),
              op(prefix + "loss", 60, 20, cat="user_annotation"),
              op("aten::mm", 200, 50)]  # after the steps: not counted
    s = trace_summary.summarize_phases(events, steps=1)
    assert {n: p["ms"] * 1e3 for n, p in s["phases"].items()} == pytest.approx({"mlp": 40, "loss": 20, "other": 40})
    assert s["window_ms"] == pytest.approx(0.1) and s["idle_ms"] == pytest.approx(0.0)
