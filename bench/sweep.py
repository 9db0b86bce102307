"""Scaling sweeps: transfer rate and training step time as the batch grows (`--batches` ids at `--dim` wide) and as
the rows widen (`--dims` wide at `--batch` ids), each against the link's bound measured at the same point in the
same run. Writes JSON (`--json`); bench/plot_sweeps.py draws it.

At each point (batch, width), everything below is timed in turns (`--rounds`), so drift falls on all alike:
- bound: a contiguous copy of the point's bytes (batch x width float32), pinned host -> GPU and GPU -> host; on a
  machine without a GPU, a host-to-host copy (the memory bus is the link there).
- transfer: `batch` random distinct rows of a table of `--table-mb` MB (its row count is the table's bytes over the
  row's, so the rows spread over the same host memory at every width) gathered to the GPU and scattered back by
  speedtorch's default plan, beside torch's way (``index_select`` into pinned staging + copy; staging +
  ``index_copy_``) and SpeedTorch 0.1.6 itself (bench/seed_speedtorch.py; left out with a line saying why when it
  cannot run). Without a GPU: speedtorch's CPU gather / scatter_ beside torch's ``index_select`` / ``index_copy_``.
- step: one training step of the recommender (speedtorch.models.recommender: Zipf(1.2) user ids, a `--items` item table,
  Adam) for each of `--ways`, over a user table of the same rows. Its bound: the bytes a step must move each way,
  the weights and both Adam moments of each distinct id of the batch, at the copy rate (the two directions overlap
  on PCIe, so the slower one bounds).

    python bench/sweep.py --json sweep.json      # GPU: 16k..512k ids at 128 wide, 32..512 wide at 128k ids
    python bench/sweep.py --json sweep.json --batches 1024,4096 --dims 16,64 --table-mb 16   # a tiny sweep
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
import speedtorch  # noqa: E402
from speedtorch.cli.benchmarking import gbps  # noqa: E402
from speedtorch.models.recommender import make_way, zipf_batches  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import seed_speedtorch  # noqa: E402
from interleaved_timing import time_calls, time_steps  # noqa: E402
from torch_staged_baseline import torch_staged_calls  # noqa: E402

SEED_WAY = "speedtorch_2019"
GPU_DEFAULTS = {"table_mb": 4096, "ways": ["speedtorch", "gpu_sparse_adam", SEED_WAY]}
CPU_DEFAULTS = {"table_mb": 256, "ways": ["speedtorch", "cpu_sparse_adam"]}
#: Bytes of Adam state per weight: the two moments (speedtorch's per-row step counts are not counted).
ADAM_COPIES = 3


def int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def points_of(args) -> list[dict]:
    """The sweep's points, one per (batch, width); the point both sweeps share is timed once and tagged with both."""
    points: dict[tuple[int, int], dict] = {}
    for sweep, pairs in (("batch", [(b, args.dim) for b in args.batches]),
                         ("dim", [(args.batch, d) for d in args.dims])):
        for batch, dim in pairs:
            points.setdefault((batch, dim), {"batch": batch, "dim": dim, "sweeps": []})["sweeps"].append(sweep)
    return list(points.values())


def transfer_calls(table, batch, dim, seed, cuda, gen):
    """The point's transfer ways and its bound, as labelled callables: (way, direction) -> call."""
    rows = table.shape[0]
    idx_cpu = torch.randperm(rows, generator=gen)[:batch]
    if not cuda:
        src = torch.randn(batch, dim)
        host_a, host_b = torch.empty(batch, dim), torch.randn(batch, dim)
        return {("bound", "h2d"): lambda: host_a.copy_(host_b),
                ("speedtorch", "h2d"): lambda: speedtorch.gather(table, idx_cpu),
                ("speedtorch", "d2h"): lambda: speedtorch.scatter_(table, idx_cpu, src),
                ("torch", "h2d"): lambda: table.index_select(0, idx_cpu),
                ("torch", "d2h"): lambda: table.index_copy_(0, idx_cpu, src)}
    idx_gpu = idx_cpu.cuda()
    out = torch.empty(batch, dim, device="cuda")
    src = torch.randn(batch, dim, device="cuda")
    pinned = torch.empty(batch, dim, pin_memory=True)
    staging = torch.empty(batch, dim, pin_memory=True)

    torch_gather, torch_scatter = torch_staged_calls(table, idx_cpu, out, src, staging)
    calls = {("bound", "h2d"): lambda: out.copy_(pinned, non_blocking=True),
             ("bound", "d2h"): lambda: pinned.copy_(src, non_blocking=True),
             ("speedtorch", "h2d"): lambda: speedtorch.gather(table, idx_gpu),
             ("speedtorch", "d2h"): lambda: speedtorch.scatter_(table, idx_gpu, src),
             ("torch", "h2d"): torch_gather,
             ("torch", "d2h"): torch_scatter}
    if seed is not None:
        seed_idx = seed.indices(idx_gpu)
        seed.gather(seed_idx)  # the model variable holds a batch before the first write-back
        calls[(seed_speedtorch.LABEL, "h2d")] = lambda: seed.gather(seed_idx)
        calls[(seed_speedtorch.LABEL, "d2h")] = lambda: seed.scatter(seed_idx)
    return calls


def build_ways(ways, rows, dim, args, device):
    """The training ways at this width; SpeedTorch's after one step (left out, with a line, if it fails)."""
    built = {}
    for way in ways:
        if way != SEED_WAY:
            built[way] = make_way(way, rows, dim, args.items, device, args.lr)
            continue

        def seed_way():
            made = seed_speedtorch.SeedSpeedTorchWay(rows, dim, args.items, device, args.lr)
            ids = torch.tensor([0, 1], device=device)
            made.step(ids, ids, torch.tensor([0.0, 1.0], device=device))
            return made

        made = seed_speedtorch.build_or_report(f"the training way at {dim} wide", seed_way)
        if made is not None:
            built[seed_speedtorch.LABEL] = made
    return built


def free() -> None:
    """Gives back a width's tables before the next width's are made (pinned staging lingers in torch's host cache)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        if hasattr(torch._C, "_host_emptyCache"):
            torch._C._host_emptyCache()


def measure_point(point, table, seed, ways, args, device, gen) -> dict:
    batch, dim = point["batch"], point["dim"]
    cuda = device.type == "cuda"
    nbytes = batch * dim * 4
    timed = time_calls(transfer_calls(table, batch, dim, seed, cuda, gen), args.reps, args.rounds)
    bound = {"h2d": gbps(nbytes, timed[("bound", "h2d")])}
    bound["d2h"] = gbps(nbytes, timed[("bound", "d2h")]) if cuda else bound["h2d"]
    point["bound GB/s"] = bound
    point["transfer"] = [{"way": way, "dir": direction, "ms": s * 1e3, "GB/s": gbps(nbytes, s),
                          "of bound": gbps(nbytes, s) / bound[direction]}
                         for (way, direction), s in timed.items() if way != "bound"]
    if ways:
        batches = [tuple(t.to(device) for t in b)
                   for b in zipf_batches(point["rows"], batch, args.batch_count, num_items=args.items)]
        distinct = sum(len(torch.unique(b[0])) for b in batches) / len(batches)
        step_bytes = distinct * dim * 4 * ADAM_COPIES
        point["distinct ids"] = distinct
        point["step bound ms"] = max(step_bytes / (bound["h2d"] * 1e9), step_bytes / (bound["d2h"] * 1e9)) * 1e3
        stepped = time_steps({label: (way, batches) for label, way in ways.items()}, args.steps, args.rounds,
                             args.warmup)
        point["step"] = [{"way": label, "ms": ms, "of bound": point["step bound ms"] / ms, "first loss": first,
                          "last loss": last} for label, (ms, first, last) in stepped.items()]
    return point


def summary_line(point) -> str:
    rates = ", ".join(f"{r['way']} {r['dir']} {r['GB/s']:.1f} GB/s ({r['of bound']:.2f})" for r in point["transfer"])
    steps = ", ".join(f"{r['way']} {r['ms']:.2f} ms" for r in point.get("step", []))
    bound = point["bound GB/s"]
    line = (f"batch {point['batch']:>7,} x {point['dim']:>3}: bound {bound['h2d']:.1f}/{bound['d2h']:.1f} GB/s; "
            f"{rates}")
    if steps:
        line += f"; step bound {point['step bound ms']:.2f} ms: {steps}"
    return line


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int_list, default=[16384 << i for i in range(6)],
                        help="ids per batch of the batch sweep, comma-separated (default 16k..512k)")
    parser.add_argument("--dims", type=int_list, default=[32 << i for i in range(5)],
                        help="row widths of the width sweep (default 32..512)")
    parser.add_argument("--dim", type=int, default=128, help="row width of the batch sweep")
    parser.add_argument("--batch", type=int, default=131072, help="ids per batch of the width sweep")
    parser.add_argument("--table-mb", type=int, default=None,
                        help=f"table size in MB at every width (default {GPU_DEFAULTS['table_mb']} with a GPU, "
                             f"{CPU_DEFAULTS['table_mb']} without)")
    parser.add_argument("--ways", type=lambda s: [w for w in s.split(",") if w], default=None,
                        help=f"training ways to time, or '' for none (default {','.join(GPU_DEFAULTS['ways'])} with "
                             f"a GPU, {','.join(CPU_DEFAULTS['ways'])} without; {SEED_WAY} is SpeedTorch 0.1.6)")
    parser.add_argument("--no-seed", dest="seed", action="store_false",
                        help=f"leave out {seed_speedtorch.LABEL} (transfer and training)")
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--reps", type=int, default=10, help="timed calls per transfer way and point")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per training way and point")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5, help="turns the ways take at each point")
    parser.add_argument("--batch-count", type=int, default=4, help="distinct training batches per point")
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (default: torch's)")
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    defaults = GPU_DEFAULTS if cuda else CPU_DEFAULTS
    args.table_mb = args.table_mb or defaults["table_mb"]
    ways = list(defaults["ways"] if args.ways is None else args.ways)
    seed_missing = "--no-seed" if not args.seed else seed_speedtorch.availability()
    if seed_missing:
        print(f"{seed_speedtorch.LABEL}: skipped ({seed_missing})", flush=True)
        ways = [w for w in ways if w != SEED_WAY]
    name = torch.cuda.get_device_name() if cuda else "CPU (no GPU)"
    print(f"sweep on {name}, {torch.get_num_threads()} threads; table {args.table_mb} MB at every width; "
          f"training ways: {', '.join(ways) or 'none'}", flush=True)

    out = {"device": name, "torch": torch.__version__, "threads": torch.get_num_threads(),
           "table_mb": args.table_mb, "base": {"batch": args.batch, "dim": args.dim},
           "bound": ("contiguous pinned copy host->GPU / GPU->host of the point's bytes" if cuda
                     else "contiguous host-to-host copy of the point's bytes (no GPU)"),
           "seed": seed_missing or seed_speedtorch.LABEL, "points": []}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    points = points_of(args)
    gen = torch.Generator().manual_seed(0)
    for dim in sorted({p["dim"] for p in points}):
        at_dim = [p for p in points if p["dim"] == dim]
        rows = max(args.table_mb * (1 << 20) // (dim * 4), max(p["batch"] for p in at_dim))
        table = speedtorch.pinned_empty(rows, dim)
        table.uniform_(-1.0, 1.0)
        seed = None if seed_missing else seed_speedtorch.build_or_report(
            f"the transfer way at {dim} wide", lambda: seed_speedtorch.SeedTransfer(rows, dim, device).probe())
        built = build_ways(ways, rows, dim, args, device)
        for point in sorted(at_dim, key=lambda p: p["batch"]):
            point["rows"] = rows
            out["points"].append(measure_point(point, table, seed, built, args, device, gen))
            print(summary_line(point), flush=True)
            # Written after every point: a run cut short by its time limit still leaves what it measured.
            args.json.write_text(json.dumps(out, indent=1))
        del table, seed, built
        free()
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
