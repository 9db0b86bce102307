"""Where a few training steps spend the GPU's time, per stream: what each stream is busy with, how much of it overlaps
another stream, how long the GPU sits idle, and how long the host waits for it (issue 30, item 1).

A step time alone cannot tell a pipeline that hides the link from one that serialises: two streams whose kernels
never run at the same time show as "overlap 0", and a host that blocks on the GPU (a ``torch.unique``'s size, an
index check's result, an ``.item()``) shows as host wait with the GPU idle behind it.

    summary = profile_summary(run_steps, steps=5)   # run_steps(n) runs n training steps
    print(format_summary(summary))

Figures (milliseconds a step): ``window`` from the first GPU activity to the last; per stream its ``busy`` time (the
union of its kernels and copies), ``overlapped`` (the part of busy during which another stream was busy too), its
top kernels; for the GPU ``busy`` (any stream) and ``idle`` (window - busy); for the host the time spent in CUDA
calls that wait for the device (synchronize, blocking copies, event/stream waits), with their count, and which
operators they wait in (``waits_in``: the outermost and innermost CPU operator around each wait, summed).
"""

from __future__ import annotations

import gzip
import json
import os
import tempfile
from collections import defaultdict
from typing import Callable

import torch

# CUDA runtime / driver calls in which the host waits for the device.
_HOST_WAITS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy",
               "cudaMemcpy2D", "cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize")
_GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(s, e) for s, e in merged]


def _length(intervals) -> float:
    return sum(e - s for s, e in intervals)


def _intersection(a, b) -> list[tuple[float, float]]:
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if start < end:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def summarize_trace(events: list[dict], steps: int) -> dict:
    """The summary of a Chrome trace's events (``torch.profiler``'s ``export_chrome_trace``), per step."""
    per_stream: dict[int, list] = defaultdict(list)
    kernels: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    waits, wait_calls = 0.0, 0
    wait_events, cpu_ops = [], []
    for e in events:
        if e.get("ph") != "X" or "dur" not in e:
            continue
        category, name = e.get("cat", ""), e.get("name", "")
        if category in _GPU_CATEGORIES:
            stream = int(e.get("args", {}).get("stream", -1))
            per_stream[stream].append((float(e["ts"]), float(e["ts"]) + float(e["dur"])))
            kernels[stream][name[:60]] += float(e["dur"])
        elif category in ("cuda_runtime", "cuda_driver") and name in _HOST_WAITS:
            waits += float(e["dur"])
            wait_calls += 1
            wait_events.append(e)
        elif category in ("cpu_op", "user_annotation"):
            cpu_ops.append(e)
    waits_in = _waits_by_operator(wait_events, cpu_ops, steps)
    if not per_stream:
        return {"steps": steps, "window_ms": 0.0, "streams": [], "gpu_busy_ms": 0.0, "gpu_idle_ms": 0.0,
                "host_wait_ms": waits / 1e3 / steps, "host_waits": wait_calls / steps, "waits_in": waits_in}
    unions = {s: _union(iv) for s, iv in per_stream.items()}
    everything = _union([iv for u in unions.values() for iv in u])
    start, end = everything[0][0], everything[-1][1]
    scale = 1e3 * steps  # microseconds in the trace -> ms a step
    streams = []
    for s, u in sorted(unions.items(), key=lambda kv: -_length(kv[1])):
        others = _union([iv for t, v in unions.items() if t != s for iv in v])
        top = sorted(kernels[s].items(), key=lambda kv: -kv[1])[:4]
        streams.append({"stream": s, "busy_ms": _length(u) / scale,
                        "overlapped_ms": _length(_intersection(u, others)) / scale,
                        "top": [{"name": n, "ms": t / scale} for n, t in top]})
    busy = _length(everything)
    return {"steps": steps, "window_ms": (end - start) / scale, "streams": streams, "gpu_busy_ms": busy / scale,
            "gpu_idle_ms": (end - start - busy) / scale, "host_wait_ms": waits / scale, "host_waits": wait_calls / steps,
            "waits_in": waits_in}


def _waits_by_operator(waits: list[dict], ops: list[dict], steps: int) -> list[dict]:
    """Each host wait charged to ``outermost > innermost`` CPU operator around it (same thread), ms a step, largest
    first (the five largest)."""
    by_thread: dict = defaultdict(list)
    for op in ops:
        by_thread[op.get("tid")].append((float(op["ts"]), float(op["ts"]) + float(op["dur"]), op.get("name", "")))
    charged: dict[str, list] = defaultdict(lambda: [0.0, 0])
    for w in waits:
        start, end = float(w["ts"]), float(w["ts"]) + float(w["dur"])
        around = [o for o in by_thread.get(w.get("tid"), ()) if o[0] <= start and o[1] >= end]
        if around:
            around.sort(key=lambda o: o[1] - o[0])
            key = around[-1][2][:40] if len(around) == 1 else f"{around[-1][2][:40]} > {around[0][2][:40]}"
        else:
            key = "(no operator)"
        charged[key][0] += end - start
        charged[key][1] += 1
    rows = [{"where": k, "ms": v[0] / 1e3 / steps, "calls": v[1] / steps} for k, v in charged.items()]
    return sorted(rows, key=lambda r: -r["ms"])[:5]


def profile_summary(run_steps: Callable[[int], object], steps: int = 5, keep: str | None = None) -> dict:
    """Profiles ``run_steps(steps)`` (CPU and CUDA activity) and summarizes its trace (:func:`summarize_trace`);
    ``keep``: a path where the raw Chrome trace is also written, gzipped (for a timeline in chrome://tracing or
    Perfetto)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run_steps(steps)
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            raw = f.read()
    if keep:
        with gzip.open(keep, "wt") as f:
            f.write(raw)
    return summarize_trace(json.loads(raw).get("traceEvents", []), steps)


def format_summary(label: str, s: dict) -> str:
    """A few lines: the window, GPU busy / idle, host waits, and each stream's busy and overlapped time."""
    lines = [f"trace [{label}]: {s['window_ms']:.2f} ms a step on the GPU, busy {s['gpu_busy_ms']:.2f}, idle "
             f"{s['gpu_idle_ms']:.2f}; host waited {s['host_wait_ms']:.2f} ms in {s['host_waits']:.1f} calls"]
    for w in s.get("waits_in", []):
        lines.append(f"  host wait {w['ms']:.2f} ms in {w['calls']:.1f} calls: {w['where']}")
    for st in s["streams"]:
        top = ", ".join(f"{k['name']} {k['ms']:.2f}" for k in st["top"][:3])
        lines.append(f"  stream {st['stream']}: busy {st['busy_ms']:.2f} ms, {st['overlapped_ms']:.2f} of it beside "
                     f"another stream; top: {top}")
    return "\n".join(lines)
