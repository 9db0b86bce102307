"""One profiled window of a raw trace (``bench/dlrm.py --trace-dir``) as a timeline per stream: when each stream's
kernels and copies run, merged into spans, and the gaps of the busiest stream. Where trace_summary.py says how much,
this says when: whether a forward waits for rows read ahead, and what runs while it waits. Each gap of the busiest
stream says why it ended when it did: the GPU work after it was launched late (the host was busy: its longest
operator in the gap is named), or launched before the gap and waited for another stream or the host's copies.

    python bench/trace_timeline.py TRACE.json.gz [--from MS] [--to MS] [--gap MS]
"""

from __future__ import annotations

import argparse
import gzip
import json
from collections import defaultdict

_GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


def spans(events: list[dict], merge_us: float) -> list[tuple[float, float, str]]:
    """Events merged into spans where the next starts within merge_us of the last's end; each named by its
    longest event."""
    out: list[list] = []
    for e in sorted(events, key=lambda e: e["ts"]):
        start, end = e["ts"], e["ts"] + e.get("dur", 0)
        if out and start - out[-1][1] <= merge_us:
            out[-1][1] = max(out[-1][1], end)
            if e.get("dur", 0) > out[-1][3]:
                out[-1][2], out[-1][3] = e["name"], e.get("dur", 0)
        else:
            out.append([start, end, e["name"], e.get("dur", 0)])
    return [(s, e, n) for s, e, n, _ in out]


def gap_causes(all_events: list[dict], first: dict, start_us: float) -> str:
    """Why the GPU work `first` began only at its start: the launch (a runtime call with the same correlation id)
    came late, or came early and the stream waited."""
    correlation = first.get("args", {}).get("correlation")
    launch = next((e for e in all_events if e.get("cat") == "cuda_runtime"
                   and e.get("args", {}).get("correlation") == correlation), None)
    if launch is None:
        return "launch not in the trace"
    lag = (first["ts"] - launch["ts"]) / 1e3
    if launch["ts"] > start_us + 50:  # launched inside the gap: the host was late
        busy = [e for e in all_events if e.get("cat") == "cpu_op" and e.get("tid") == launch.get("tid")
                and e["ts"] < launch["ts"] and e["ts"] + e.get("dur", 0) > start_us]
        longest = max(busy, key=lambda e: min(e["ts"] + e.get("dur", 0), launch["ts"]) - max(e["ts"], start_us),
                      default=None)
        where = f"; the host was in {longest['name'][:50]} ({longest.get('dur', 0) / 1e3:.2f} ms)" if longest else ""
        calls = [e for e in all_events if e.get("cat") in ("cuda_runtime", "cuda_driver")
                 and e.get("tid") == launch.get("tid") and start_us <= e["ts"] < launch["ts"]]
        slowest = max(calls, key=lambda e: e.get("dur", 0), default=None)
        if slowest is not None and slowest.get("dur", 0) > 100:  # a blocking call: the usual cause
            where += f", blocked {slowest['dur'] / 1e3:.2f} ms in {slowest['name']}"
        return f"host late: launched {(launch['ts'] - start_us) / 1e3:.2f} ms into the gap{where}"
    return f"waited: launched {lag:.2f} ms before it ran ({launch['name']})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace")
    parser.add_argument("--from", dest="begin", type=float, default=0.0, help="ms after the first GPU event")
    parser.add_argument("--to", dest="end", type=float, default=60.0)
    parser.add_argument("--gap", type=float, default=0.05, help="ms: closer events are one span")
    args = parser.parse_args()
    with gzip.open(args.trace, "rt") if args.trace.endswith(".gz") else open(args.trace) as f:
        all_events = json.load(f)["traceEvents"]
    events = [e for e in all_events if e.get("cat") in _GPU_CATEGORIES]
    t0 = min(e["ts"] for e in events)
    by_stream = defaultdict(list)
    for e in events:
        if args.begin <= (e["ts"] - t0) / 1e3 <= args.end:
            by_stream[e.get("args", {}).get("stream", e.get("tid"))].append(e)
    busiest = max(by_stream, key=lambda s: sum(e.get("dur", 0) for e in by_stream[s]))
    for stream, evs in sorted(by_stream.items(), key=lambda kv: -sum(e.get("dur", 0) for e in kv[1])):
        merged = spans(evs, args.gap * 1e3)
        print(f"stream {stream}: {len(evs)} events, {sum(e.get('dur', 0) for e in evs) / 1e3:.2f} ms busy")
        if stream == busiest:
            gaps = [(a[1], b[0]) for a, b in zip(merged, merged[1:]) if b[0] - a[1] > 200]
            for start, end in gaps:
                first = min((e for e in evs if e["ts"] >= end - 1), key=lambda e: e["ts"])
                print(f"  gap {(start - t0) / 1e3:8.2f} -> {(end - t0) / 1e3:8.2f} ms ({(end - start) / 1e3:.2f}): "
                      f"{gap_causes(all_events, first, start)}")
        else:
            for start, end, name in merged:
                print(f"  {(start - t0) / 1e3:8.2f} -> {(end - t0) / 1e3:8.2f} ms ({(end - start) / 1e3:5.2f}) "
                      f"{name[:60]}")


if __name__ == "__main__":
    main()
