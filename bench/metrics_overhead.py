"""What the library counters cost (speedtorch.stats(), csrc/metrics/transfer_counters.h): the same small calls
timed with counting on and off (speedtorch.set_stats_enabled), side by side in one run, with the difference per
call and the ratio. Small calls on purpose: the counters cost the same per call whatever its size (a few relaxed
atomic adds), so small calls show them largest.

Each round times `--calls` back-to-back calls with counting on, then the same with it off (the order alternates
between rounds). The minimum over rounds of the mean per call is the least disturbed estimate on a shared machine;
the medians are printed beside it. On a loaded machine the spread between rounds can exceed the difference: read
the "IQR off" column first. bench/metrics_counter_cost.cpp (build/speedtorch_metrics_bench) times the counting
itself in C++, where a few ns are visible.

    python bench/metrics_overhead.py                   # CPU tables
    python bench/metrics_overhead.py --device cuda     # adds the pinned -> GPU and GPU-table gathers
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
import speedtorch  # noqa: E402
from speedtorch.cli.benchmarking import format_table  # noqa: E402


def per_call_seconds(fn, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def workloads(device: str, rows: int, dim: int):
    table = torch.randn(100_000, dim)
    idx = torch.randint(0, 100_000, (rows,))
    src = torch.randn(rows, dim)
    emb = speedtorch.PinnedEmbedding(100_000, dim)
    emb.set_optimizer("adagrad", {"lr": 0.01}, True)
    grad = torch.randn(rows, dim)
    out = {
        f"gather cpu ({rows} rows)": lambda: speedtorch.gather(table, idx),
        f"scatter_ cpu ({rows} rows)": lambda: speedtorch.scatter_(table, idx, src),
        f"adagrad step cpu ({rows} rows)": lambda: emb.apply_gradients(idx, grad),
        "record_cache_lookups op": lambda: speedtorch.counters.record_cache_lookups(3, 1),
    }
    if device == "cuda":
        pinned = speedtorch.pinned_empty(100_000, dim)
        gpu_table = torch.randn(100_000, dim, device="cuda")
        gpu_idx = idx.cuda()
        out[f"gather pinned->cuda ({rows} rows)"] = lambda: speedtorch.gather(pinned, gpu_idx)
        out[f"gather gpu table ({rows} rows)"] = lambda: speedtorch.gather(gpu_table, gpu_idx)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=31)
    args = parser.parse_args()
    torch.manual_seed(0)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    results = []
    for name, fn in workloads(args.device, args.rows, args.dim).items():
        for _ in range(200):
            fn()  # warm-up
        on, off = [], []
        for r in range(args.rounds):
            for enabled in ((True, False) if r % 2 == 0 else (False, True)):
                speedtorch.set_stats_enabled(enabled)
                sync()
                (on if enabled else off).append(per_call_seconds(fn, args.calls))
                sync()
        speedtorch.set_stats_enabled(True)
        quartiles = statistics.quantiles(off, n=4)
        results.append({"call": name, "min off us": min(off) * 1e6, "min on us": min(on) * 1e6,
                        "on - off ns": (min(on) - min(off)) * 1e9, "on / off": min(on) / min(off),
                        "median off us": statistics.median(off) * 1e6, "median on us": statistics.median(on) * 1e6,
                        "IQR off ns": (quartiles[2] - quartiles[0]) * 1e9})  # fmt: skip
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.calls} calls x {args.rounds} rounds, "
          f"device {args.device}; {speedtorch.build_info()}")
    print(format_table(results, ["call", "min off us", "min on us", "on - off ns", "on / off", "median off us",
                                 "median on us", "IQR off ns"]))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
