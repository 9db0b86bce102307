"""One profiled window of a raw trace (``bench/dlrm.py --trace-dir``) as a timeline per stream: when each stream's
kernels and copies run, merged into spans, and the gaps of the busiest stream. Where trace_summary.py says how much,
this says when: whether a forward waits for rows read ahead, and what runs while it waits.

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace")
    parser.add_argument("--from", dest="begin", type=float, default=0.0, help="ms after the first GPU event")
    parser.add_argument("--to", dest="end", type=float, default=60.0)
    parser.add_argument("--gap", type=float, default=0.05, help="ms: closer events are one span")
    args = parser.parse_args()
    with gzip.open(args.trace, "rt") if args.trace.endswith(".gz") else open(args.trace) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("cat") in _GPU_CATEGORIES]
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
                print(f"  gap {(start - t0) / 1e3:8.2f} -> {(end - t0) / 1e3:8.2f} ms ({(end - start) / 1e3:.2f})")
        else:
            for start, end, name in merged:
                print(f"  {(start - t0) / 1e3:8.2f} -> {(end - t0) / 1e3:8.2f} ms ({(end - start) / 1e3:5.2f}) "
                      f"{name[:60]}")


if __name__ == "__main__":
    main()
