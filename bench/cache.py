"""Row cache benchmark: HostEmbedding with placement="host", "hybrid" (the C++ row cache, csrc/cache/row_cache.h)
and "gpu" side by side in one run, on Zipf-distributed ids, for training (forward, backward, fused Adam step) and for
serving (forward only, no gradient). Prints ms per step and the ratio to "host" for each, and checks that hybrid and
host trained to bit-identical weights (they must).

    python bench/cache.py                               # GPU: 2M x 64 table, batches of 65,536 ids
    python bench/cache.py --device cpu --rows 100000    # the CPU cache (a correctness smoke run; CPU timings)
    python bench/cache.py --json cache.json             # also as JSON (bench/report.py reads it)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
from speedtorch.cli.benchmarking import format_table  # noqa: E402
from speedtorch.nn import HostEmbedding  # noqa: E402
from speedtorch.models.recommender import zipf_batches  # noqa: E402


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def make(placement, args, device):
    extra = {"cache_rows": max(1, int(args.cache_fraction * args.rows))} if placement == "hybrid" else {}
    return HostEmbedding(args.rows, args.dim, device=device, optimizer="adam", optimizer_options={"lr": 1e-3},
                         init_std=0.1, seed=0, placement=placement, **extra)


def train_step(module, ids):
    loss = module(ids).float().square().sum()
    loss.backward()
    module.step()


@torch.no_grad()
def serve_step(module, ids):
    module(ids)


def time_ways(modules, batches, step, args, device):
    """Median ms per step of each way; ways take turns in rounds so machine drift lands on all of them."""
    times = {name: [] for name in modules}
    per_round = max(1, args.steps // args.rounds)
    for name, module in modules.items():  # warm-up (also fills the caches)
        for i in range(args.warmup):
            step(module, batches[i % len(batches)])
    sync(device)
    for r in range(args.rounds):
        for name, module in modules.items():
            for i in range(per_round):
                ids = batches[(r * per_round + i) % len(batches)]
                sync(device)
                start = time.perf_counter()
                step(module, ids)
                sync(device)
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) * 1e3 for name, t in times.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--batch", type=int, default=65_536)
    parser.add_argument("--cache-fraction", type=float, default=0.05, help="hybrid: cache rows / table rows")
    parser.add_argument("--zipf", type=float, default=1.2)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--placements", type=lambda s: s.split(","), default=["host", "hybrid", "gpu"])
    parser.add_argument("--json", type=Path, help="write the results here too")
    args = parser.parse_args()
    device = torch.device(args.device)
    batches = [u.to(device) for u, _, _ in zipf_batches(args.rows, args.batch, 8, exponent=args.zipf, num_items=1)]
    distinct = len(torch.unique(batches[0]))
    print(f"{device}; table {args.rows:,} x {args.dim} float32 (Adam); batch {args.batch:,} Zipf({args.zipf}) ids, "
          f"~{distinct:,} distinct; hybrid cache {args.cache_fraction:.1%} of the rows", flush=True)
    rows = []
    for mode, step in (("train", train_step), ("serve", serve_step)):
        modules = {p: make(p, args, device) for p in args.placements}
        ms = time_ways(modules, batches, step, args, device)
        base = ms.get("host")
        for p in args.placements:
            rows.append({"mode": mode, "placement": p, "ms/step": ms[p],
                         "vs host": f"{base / ms[p]:.2f}x" if base else ""})
        if mode == "train" and "host" in modules and "hybrid" in modules:
            same = torch.equal(modules["host"].weight, modules["hybrid"].weight) and torch.equal(
                modules["host"].table.state(), modules["hybrid"].table.state())
            print(f"hybrid and host weights and optimizer state bit-identical after training: {same}", flush=True)
            if not same:
                return 1
        del modules
    print(format_table(rows, ["mode", "placement", "ms/step", "vs host"]))
    if args.json:
        args.json.write_text(json.dumps({"rows": args.rows, "dim": args.dim, "batch": args.batch,
                                         "cache_fraction": args.cache_fraction, "results": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
