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

Where a step's time goes, by phase (:func:`summarize_phases`, from the same trace): each kernel, copy and memset is
charged to the phase whose range (``speedtorch._phases``: ``speedtorch.phase: <name>``, which the collection, the
tables, DLRM and TrainPipeline open around their parts) was open around the CPU call that launched it (the innermost
range, on the launching thread). By these rules, in order, innermost first:

- a ``speedtorch.phase: <name>`` range: that phase (``ids``, ``dedup``, ``gather``, ``pooling``, ``interaction``,
  ``mlp``, ``loss``, ``update``, ``dense optimizer``, ``copies``);
- torch's ``Optimizer.step#...`` / ``Optimizer.zero_grad#...`` ranges: ``dense optimizer``;
- a backward node (``autograd::engine::evaluate_function: ...``): the phase of the forward operator with the node's
  sequence number (so a layer's backward counts with its forward), ``backward`` when none has a phase
  (``AccumulateGrad``, ...); the part in backward is counted apart too;
- else a copy or memset is ``copies`` and anything else ``other``.

Streams overlap: an instant during which k kernels run is charged 1/k to each one's phase, so the phases add up to the
GPU's busy time, and with ``idle`` to the window. Without GPU activity (a run on the CPU) the host is the device: each
instant of the thread that ran the steps is charged to the innermost operator or range around it, by the same rules,
and the window is the steps' range.
"""

from __future__ import annotations

import gzip
import json
import os
import tempfile
import time
from collections import defaultdict
from typing import Callable

import torch

from speedtorch._phases import PREFIX
from speedtorch.cli.benchmarking import format_table

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


def profile_trace(run_steps: Callable[[int], object], steps: int = 5, keep: str | None = None) -> tuple[list, float]:
    """The Chrome trace's events of ``run_steps(steps)`` (CPU activity, and CUDA's where there is a GPU) inside one
    ``speedtorch.phase: steps`` range, and the wall time of those steps (ms a step, measured around them under the
    profiler); ``keep``: a path where the raw trace is also written, gzipped (for a timeline in chrome://tracing or
    Perfetto)."""
    from torch.profiler import ProfilerActivity, profile, record_function

    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        start = time.perf_counter()
        with record_function(PREFIX + "steps"):
            run_steps(steps)
            if cuda:
                torch.cuda.synchronize()
        wall_ms = (time.perf_counter() - start) * 1e3 / steps
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            raw = f.read()
    if keep:
        with gzip.open(keep, "wt") as f:
            f.write(raw)
    return json.loads(raw).get("traceEvents", []), wall_ms


def profile_summary(run_steps: Callable[[int], object], steps: int = 5, keep: str | None = None) -> dict:
    """Profiles ``run_steps(steps)`` (:func:`profile_trace`) and summarizes its trace (:func:`summarize_trace`)."""
    return summarize_trace(profile_trace(run_steps, steps, keep)[0], steps)


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


# --- phases --------------------------------------------------------------------------------------------------------

# The rows of the phase table, in order: (phase, what it is). Phases a trace names otherwise follow them.
PHASES = (("ids", "ids: offsets, range checks"), ("dedup", "de-duplication (unique)"),
          ("gather", "row gather / lookup"), ("pooling", "pooling (embedding bags)"),
          ("interaction", "interaction (DCN cross layers / dot)"), ("mlp", "MLPs (bottom, top)"),
          ("loss", "loss (BCE)"), ("backward", "backward, other nodes"), ("update", "fused table update"),
          ("dense optimizer", "dense optimizer"), ("copies", "copies (batches; memcpy, memset)"), ("other", "other"))
_BACKWARD_NODE = "autograd::engine::evaluate_function: "
_DENSE_OPTIMIZER = ("Optimizer.step#", "Optimizer.zero_grad#")
_STEPS = PREFIX + "steps"


def _end(event: dict) -> float:
    return float(event["ts"]) + float(event["dur"])


def _own_phase(event: dict):
    """The phase an operator or range names itself (None: its surroundings decide), or ("node", sequence number)
    for a backward node."""
    name = event.get("name", "")
    if name.startswith(PREFIX):
        return None if name == _STEPS else name[len(PREFIX):]
    if name.startswith(_DENSE_OPTIMIZER):
        return "dense optimizer"
    if name.startswith(_BACKWARD_NODE):
        return ("node", event.get("args", {}).get("Sequence number"))
    return None


def _cpu_phases(events: list[dict]) -> list[dict]:
    """The CPU events (operators, ranges, CUDA calls), each with its ``phase`` (None: none), ``backward`` (inside a
    backward node) and ``parent`` (the innermost event around it on its thread, or None)."""
    cpu = [dict(e) for e in events if e.get("ph") == "X" and "dur" in e and
           e.get("cat") in ("cpu_op", "user_annotation", "cuda_runtime", "cuda_driver")]
    by_thread: dict = defaultdict(list)
    for e in cpu:
        by_thread[(e.get("pid"), e.get("tid"))].append(e)
    for thread in by_thread.values():
        stack: list[dict] = []
        for e in sorted(thread, key=lambda e: (float(e["ts"]), -float(e["dur"]))):
            while stack and _end(stack[-1]) <= float(e["ts"]):
                stack.pop()
            e["parent"] = stack[-1] if stack else None
            own = _own_phase(e)
            e["backward"] = isinstance(own, tuple) or bool(e["parent"] and e["parent"]["backward"])
            e["phase"] = own if own is not None else (e["parent"]["phase"] if e["parent"] else None)
            stack.append(e)
    # A backward node takes the phase of its forward operator: of the operators that carry the node's sequence number
    # (each records the number the next node will get), the last to start made the node. Nodes inside a node too.
    in_order = sorted(cpu, key=lambda e: (float(e["ts"]), -float(e["dur"])))  # parents before children
    forward: dict = {}
    for e in in_order:
        seq = e.get("args", {}).get("Sequence number")
        if seq is not None and not e["backward"] and e["cat"] == "cpu_op":
            forward[seq] = e["phase"]
    for e in in_order:
        if isinstance(e["phase"], tuple):
            own = _own_phase(e)
            e["phase"] = (forward.get(own[1]) or "backward") if isinstance(own, tuple) else e["parent"]["phase"]
    return cpu


def _charged(intervals: list[tuple[float, float, str, bool]]) -> dict:
    """Per (phase, backward): the time of ``intervals`` (start, end, phase, backward), an instant covered by k of
    them charged 1/k to each."""
    edges = sorted({t for s, e, _, _ in intervals for t in (s, e)})
    starts: dict = defaultdict(list)
    for i, (s, _, _, _) in enumerate(intervals):
        starts[s].append(i)
    out: dict = defaultdict(float)
    active: set = set()
    for left, right in zip(edges, edges[1:]):
        active = {i for i in active | set(starts.get(left, ())) if intervals[i][1] > left}
        if active:
            share = (right - left) / len(active)
            for i in active:
                out[intervals[i][2:]] += share
    return out


def summarize_phases(events: list[dict], steps: int, wall_ms: float | None = None) -> dict:
    """Where ``steps`` steps' time goes by phase (the rules in this module's docstring), from a Chrome trace's
    events: per phase ``ms`` (its share of the window, overlaps split), ``backward_ms`` (the part in backward nodes),
    ``busy_ms`` (its kernels' time, overlaps counted in full: on the CPU the same as ``ms``); ``window_ms``, the GPU's
    ``busy_ms`` and ``idle_ms``, all a step, and ``wall_ms`` as given (the steps timed around the profile)."""
    cpu = _cpu_phases(events)
    launches = {e["args"]["correlation"]: e for e in cpu
                if e["cat"] in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    roots = [e for e in cpu if e.get("name") == _STEPS]
    intervals, busy_full = [], defaultdict(float)
    gpu = [e for e in events if e.get("ph") == "X" and "dur" in e and e.get("cat") in _GPU_CATEGORIES]
    for e in gpu:
        launch = launches.get(e.get("args", {}).get("correlation"))
        phase = launch["phase"] if launch is not None else None
        if phase is None:
            phase = "copies" if e["cat"] in ("gpu_memcpy", "gpu_memset") else "other"
        intervals.append((float(e["ts"]), _end(e), phase, bool(launch and launch["backward"])))
        busy_full[phase] += float(e["dur"])
    if not gpu:  # the host is the device: each instant of the steps' thread, to the innermost event around it
        mine = [e for r in roots for e in cpu if (e.get("pid"), e.get("tid")) == (r.get("pid"), r.get("tid"))
                and _end(r) >= _end(e) and float(e["ts"]) >= float(r["ts"])]
        inner: dict = defaultdict(list)
        for e in mine:
            if e["parent"] is not None:
                inner[id(e["parent"])].append((float(e["ts"]), _end(e)))
        for e in mine:  # its time outside the events inside it
            cursor = float(e["ts"])
            for s, t in _union(inner[id(e)]) + [(_end(e), _end(e))]:
                if s > cursor:
                    intervals.append((cursor, s, e["phase"] or "other", e["backward"]))
                    busy_full[e["phase"] or "other"] += s - cursor
                cursor = max(cursor, t)
    scale = 1e3 * steps
    spans = [(s, e) for s, e, _, _ in intervals] + [(float(r["ts"]), _end(r)) for r in roots]
    window = (max(e for _, e in spans) - min(s for s, _ in spans)) if spans else 0.0
    busy = _length(_union([(s, e) for s, e, _, _ in intervals]))
    phases: dict = {}
    for (phase, backward), t in _charged(intervals).items():
        row = phases.setdefault(phase, {"ms": 0.0, "backward_ms": 0.0, "busy_ms": busy_full[phase] / scale})
        row["ms"] += t / scale
        if backward:
            row["backward_ms"] += t / scale
    return {"steps": steps, "window_ms": window / scale, "busy_ms": busy / scale, "idle_ms": (window - busy) / scale,
            "wall_ms": wall_ms, "phases": phases, "device": "gpu" if gpu else "cpu"}


def format_phases(label: str, s: dict) -> str:
    """The phase table (every phase of :data:`PHASES`, then any other a trace named, then the device's idle time):
    ms a step, share of the window, the part in backward, the kernels' time with overlaps counted in full; then the
    window, the wall time, and the largest phase."""
    device = "GPU" if s["device"] == "gpu" else "CPU"
    names = [p for p, _ in PHASES] + sorted(set(s["phases"]) - {p for p, _ in PHASES})
    words = dict(PHASES)
    window = s["window_ms"] or float("nan")
    rows = []
    for name in names:
        p = s["phases"].get(name, {"ms": 0.0, "backward_ms": 0.0, "busy_ms": 0.0})
        rows.append({"phase": words.get(name, name), "ms a step": p["ms"], "share": f"{p['ms'] / window:.1%}",
                     "of it in backward": p["backward_ms"], f"{device} busy (overlaps in full)": p["busy_ms"]})
    rows.append({"phase": f"{device} idle", "ms a step": s["idle_ms"], "share": f"{s['idle_ms'] / window:.1%}"})
    rows.append({"phase": "total (the window)", "ms a step": s["window_ms"], "share": "100.0%"})
    largest = max(s["phases"].items(), key=lambda kv: kv[1]["ms"], default=("none", {"ms": 0.0}))
    wall = "" if s["wall_ms"] is None else f"; wall {s['wall_ms']:.2f} ms a step under the profiler"
    return "\n".join([
        f"phases [{label}]: {s['window_ms']:.2f} ms a step (the window: the steps' range, to their last {device} "
        f"activity){wall}; "
        f"{device} idle {s['idle_ms'] / window:.1%}",
        format_table(rows, ["phase", "ms a step", "share", "of it in backward", f"{device} busy (overlaps in full)"]),
        f"bound by: {words.get(largest[0], largest[0])} ({largest[1]['ms']:.2f} ms a step, "
        f"{largest[1]['ms'] / window:.1%})"])
