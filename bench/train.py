"""End-to-end training benchmark (bench/BASELINES.md) and the fused optimizer step micro-benchmark, side by side in
one run, with ratios.

Training: a `--rows` x `--dim` user table trained with Adam, batches of `--batch` Zipf(1.2) user ids, a `--items`
item table on the GPU, dot product + BCE (speedtorch.models.recommender), each way of
speedtorch.models.recommender.WAYS and SpeedTorch 0.1.6 itself (`speedtorch_2019`: its ModelFactory / OptimizerFactory switchers with pinned CuPy
collections, bench/seed_speedtorch.py; skipped with a line saying why without CuPy or `make seed-speedtorch`) timed
per step (median after warm-up; all ways alive, taking turns in `--rounds` rounds). Fused step: Adam on
`--fused-rows` distinct random rows of a pinned table, against the PCIe bound (bytes each way / contiguous pinned
memcpy rate; the two directions overlap). Scale: the speedtorch way on a table of `--scale-rows` rows (weights +
Adam state larger than the GPU's memory when big enough) against the `--rows` table, both alive and timed in
alternating rounds.

    python bench/train.py                        # the workload (GPU; ~105 GB of host RAM: every way is alive)
    python bench/train.py --scale-rows 56000000  # then a table past GPU memory beside the 10M one (~105 GB)
    python bench/train.py --ways speedtorch,gpu_sparse_adam,speedtorch_2019   # fewer ways, less memory
    python bench/train.py --cpu                  # no GPU (or --cpu): the demo's CPU sizes, see cpu_main

On the CPU (no GPU, or `--cpu`), the sizes default to `python -m speedtorch demo`'s CPU sizes and the ways to
speedtorch, speedtorch_both_tables and cpu_sparse_adam; the fused step is timed against torch's SparseAdam on the same rows, and each
training step is also split into its stages (where the time goes), all at `--threads` intra-op threads.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
import speedtorch  # noqa: E402
from speedtorch.cli.benchmarking import format_table, gbps, median_seconds  # noqa: E402
from speedtorch.models import recommender  # noqa: E402
from speedtorch.models.recommender import WAYS, make_way, zipf_batches  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from interleaved_timing import time_steps  # noqa: E402
import seed_speedtorch  # noqa: E402

#: The way that is SpeedTorch 0.1.6 itself (bench/seed_speedtorch.py), timed in turns with ours.
SEED_WAY = "speedtorch_2019"


def build_way(way, rows, args, device, batches):
    """The way; for SpeedTorch, after one step (None, with a line saying why, if it fails)."""
    if way != SEED_WAY:
        return make_way(way, rows, args.dim, args.items, device, args.lr)

    def build():
        built = seed_speedtorch.SeedSpeedTorchWay(rows, args.dim, args.items, device, args.lr)
        built.step(*batches[0])
        return built

    return seed_speedtorch.build_or_report("the training way", build)


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def free_ways() -> None:
    gc.collect()
    torch.cuda.empty_cache()
    if hasattr(torch._C, "_host_emptyCache"):  # torch_staged's pinned tables linger in torch's host cache
        torch._C._host_emptyCache()


def fused_step_bench(args):
    emb = speedtorch.PinnedEmbedding(args.rows, args.dim)
    emb.uniform_(-0.1, 0.1, 0)
    emb.set_optimizer("adam", {"lr": 1e-3}, True)
    rows = torch.randperm(args.rows)[: args.fused_rows].cuda()
    grad = torch.randn(args.fused_rows, args.dim, device="cuda")
    step = median_seconds(lambda: emb.apply_gradients(rows, grad), args.reps)
    # Per row, each way: weights + header + exp_avg + exp_avg_sq.
    row_bytes = args.dim * 4 + emb.state().shape[1] * 4
    host = torch.empty(args.fused_rows * row_bytes // 4, pin_memory=True)
    dev = torch.empty_like(host, device="cuda")
    h2d = gbps(host.numel() * 4, median_seconds(lambda: dev.copy_(host, non_blocking=True), args.reps))
    bound = args.fused_rows * row_bytes / (h2d * 1e9)
    result = {"rows": args.fused_rows, "ms": step * 1e3, "pcie bound ms": bound * 1e3, "of bound": bound / step,
              "GB/s each way": gbps(args.fused_rows * row_bytes, step), "memcpy GB/s": h2d}
    del emb
    gc.collect()
    return result


def cpu_fused_step_bench(args):
    """Adam on `--fused-rows` distinct rows of a CPU table: speedtorch's fused step (ids as torch.unique returns
    them, with and without sorted_unique) against SparseAdam on the same rows (a coalesced sparse gradient), all
    timed in alternating rounds."""
    rows = torch.randperm(args.rows)[: args.fused_rows].sort().values
    grad = torch.randn(args.fused_rows, args.dim)
    emb = speedtorch.PinnedEmbedding(args.rows, args.dim)
    emb.uniform_(-0.1, 0.1, 0)
    emb.set_optimizer("adam", {"lr": 1e-3}, True)
    param = torch.nn.Parameter(torch.empty(args.rows, args.dim).uniform_(-0.1, 0.1))
    opt = torch.optim.SparseAdam([param], lr=1e-3)
    sparse_grad = torch.sparse_coo_tensor(rows.unsqueeze(0), grad, param.shape).coalesce()

    def sparse_adam():
        param.grad = sparse_grad
        opt.step()

    calls = {"speedtorch fused step": lambda: emb.apply_gradients(rows, grad),
             "speedtorch fused step, sorted_unique": lambda: emb.apply_gradients(rows, grad, True),
             "torch SparseAdam": sparse_adam}
    times = {label: [] for label in calls}
    for _ in range(args.rounds):
        for label, fn in calls.items():
            times[label].append(median_seconds(fn, max(1, args.reps // args.rounds), warmup=1))
    base = statistics.median(times["torch SparseAdam"])
    return [{"way": label, "rows": args.fused_rows, "ms": statistics.median(t) * 1e3,
             "speedup vs SparseAdam": base / statistics.median(t)} for label, t in times.items()]


def cpu_stage_profile(args, batches):
    """Each way's training step cut into stages, wall ms (median over `--steps` steps, the ways alternating)."""
    import torch.nn.functional as F

    from speedtorch.nn.embedding import _HostRows

    cpu = torch.device("cpu")
    st = make_way("speedtorch", args.rows, args.dim, args.items, cpu, args.lr)
    sp = make_way("cpu_sparse_adam", args.rows, args.dim, args.items, cpu, args.lr)
    times: dict[str, list[float]] = {}

    def lap(key, start):
        now = time.perf_counter()
        times.setdefault(key, []).append((now - start) * 1e3)
        return now

    def speedtorch_step(users, items, labels):
        m = st.users
        t = time.perf_counter()
        unique, inverse = torch.unique(users, sorted=True, return_inverse=True)
        t = lap("speedtorch: unique ids", t)
        rows = _HostRows.apply(m._anchor, m, unique, m.table.gather(unique, cpu))
        t = lap("speedtorch: gather rows", t)
        loss = st._loss(F.embedding(inverse, rows), items, labels)
        t = lap("speedtorch: forward (embedding + loss)", t)
        st.item_opt.zero_grad()
        loss.backward()
        t = lap("speedtorch: backward", t)
        m.step()
        t = lap("speedtorch: user table step (fused)", t)
        st.item_opt.step()
        lap("speedtorch: item table step (SparseAdam)", t)

    def sparse_adam_step(users, items, labels):
        t = time.perf_counter()
        loss = sp._loss(sp.users(users), items, labels)
        t = lap("cpu_sparse_adam: forward (embedding + loss)", t)
        sp.user_opt.zero_grad()
        sp.item_opt.zero_grad()
        loss.backward()
        t = lap("cpu_sparse_adam: backward", t)
        sp.user_opt.step()
        t = lap("cpu_sparse_adam: user table step (SparseAdam)", t)
        sp.item_opt.step()
        lap("cpu_sparse_adam: item table step (SparseAdam)", t)

    for i in range(args.warmup):
        speedtorch_step(*batches[i % len(batches)])
        sparse_adam_step(*batches[i % len(batches)])
    times.clear()
    for i in range(args.steps):
        speedtorch_step(*batches[i % len(batches)])
        sparse_adam_step(*batches[i % len(batches)])
    return [{"stage": k, "median ms": statistics.median(v)} for k, v in times.items()]


def cpu_main(args) -> int:
    """The CPU benchmark: training ways interleaved, the fused step against SparseAdam, the stages of a step."""
    if args.threads:
        torch.set_num_threads(args.threads)
    batches = zipf_batches(args.rows, args.batch, 8, num_items=args.items)
    print(f"CPU, {torch.get_num_threads()} intra-op threads; user table {args.rows:,} x {args.dim}; {args.items:,} "
          f"items; batch {args.batch:,}; distinct users per batch ~{len(torch.unique(batches[0][0])):,}", flush=True)
    entries = {way: (make_way(way, args.rows, args.dim, args.items, torch.device("cpu"), args.lr), batches)
               for way in args.ways}
    results = [{"way": way, "ms/step": ms, "first loss": first, "last loss": last}
               for way, (ms, first, last) in time_steps(entries, args.steps, args.rounds, args.warmup).items()]
    del entries
    by_way = {r["way"]: r["ms/step"] for r in results}
    for r in results:
        r["speedtorch speedup"] = r["ms/step"] / by_way["speedtorch"] if "speedtorch" in by_way else float("nan")
    print(format_table(results, ["way", "ms/step", "speedtorch speedup", "first loss", "last loss"]))
    fused = cpu_fused_step_bench(args)
    print(format_table(fused, ["way", "rows", "ms", "speedup vs SparseAdam"]))
    stages = cpu_stage_profile(args, batches)
    print(format_table(stages, ["stage", "median ms"]))
    if args.json:
        args.json.write_text(json.dumps({"train": results, "fused_step": fused, "stages": stages}, indent=1))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu", action="store_true", help="the CPU benchmark even when a GPU is present")
    parser.add_argument("--threads", type=int, default=0, help="CPU: intra-op threads (default: torch's)")
    parser.add_argument("--rows", type=int, default=None, help="user table rows (10M; CPU: 200k)")
    parser.add_argument("--dim", type=int, default=None, help="(128; CPU: 32)")
    parser.add_argument("--items", type=int, default=None, help="(100k; CPU: 10k)")
    parser.add_argument("--batch", type=int, default=None, help="(65,536; CPU: 4,096)")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=5, help="the ways take turns this many times")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--ways", type=lambda s: s.split(","), default=None,
                        help=f"ways to time (all, and {SEED_WAY}: SpeedTorch {seed_speedtorch.VERSION} itself, skipped "
                             "with a line saying why when it cannot run; CPU: speedtorch, speedtorch_both_tables, "
                             "cpu_sparse_adam)")
    parser.add_argument("--fused-rows", type=int, default=None, help="(131,072; CPU: 1,350, a demo batch's users)")
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--scale-rows", type=int, default=0, help="also train the speedtorch way on this many rows")
    parser.add_argument("--hot-fraction", type=float, default=recommender.HOT_FRACTION,
                        help="share of users the speedtorch_hybrid way's row cache holds on the GPU")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    recommender.HOT_FRACTION = args.hot_fraction
    on_cpu = args.cpu or not torch.cuda.is_available()
    # GPU defaults: the workload of bench/BASELINES.md; CPU defaults: python -m speedtorch demo's CPU sizes.
    defaults = ({"rows": 200_000, "dim": 32, "items": 10_000, "batch": 4_096, "fused_rows": 1_350,
                 "ways": ["speedtorch", "speedtorch_both_tables", "cpu_sparse_adam"]} if on_cpu else
                {"rows": 10_000_000, "dim": 128, "items": 100_000, "batch": 65_536, "fused_rows": 131_072,
                 "ways": list(WAYS) + [SEED_WAY]})
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if on_cpu:
        return cpu_main(args)
    device = torch.device("cuda")
    batches = [tuple(t.to(device) for t in b) for b in zipf_batches(args.rows, args.batch, 8, num_items=args.items)]
    print(f"threads {torch.get_num_threads()}; user table {args.rows:,} x {args.dim}; batch {args.batch:,}; "
          f"distinct users per batch ~{len(torch.unique(batches[0][0])):,}", flush=True)

    results = []
    entries = {}
    seed_missing = seed_speedtorch.availability() if SEED_WAY in args.ways else "not in --ways"
    if seed_missing:
        print(f"{seed_speedtorch.LABEL}: skipped ({seed_missing})", flush=True)
        args.ways = [w for w in args.ways if w != SEED_WAY]
    for way in list(args.ways):
        print(f"building {way}", flush=True)
        built = build_way(way, args.rows, args, device, batches)
        if built is None:
            args.ways.remove(way)
            seed_missing = "failed, see above"
            continue
        entries[way] = (built, batches)
    for way, (ms, first, last) in time_steps(entries, args.steps, args.rounds, args.warmup).items():
        results.append({"way": way, "rows": args.rows, "ms/step": ms, "first loss": first, "last loss": last})
    del entries
    free_ways()
    scale = None
    if args.scale_rows:
        # The --rows table again beside the large one: their ratio comes from one interleaved timing.
        scale_batches = [tuple(t.to(device) for t in b)
                         for b in zipf_batches(args.scale_rows, args.batch, 8, num_items=args.items)]
        entries = {"small": (make_way("speedtorch", args.rows, args.dim, args.items, device, args.lr), batches),
                   "large": (make_way("speedtorch", args.scale_rows, args.dim, args.items, device, args.lr),
                             scale_batches)}
        timed = time_steps(entries, args.steps, args.rounds, args.warmup)
        del entries
        free_ways()
        scale = {"small ms": timed["small"][0], "large ms": timed["large"][0],
                 "ratio": timed["large"][0] / timed["small"][0]}
        results.append({"way": "speedtorch (scale)", "rows": args.scale_rows, "ms/step": scale["large ms"],
                        "first loss": timed["large"][1], "last loss": timed["large"][2]})
    by_way = {r["way"]: r["ms/step"] for r in results}
    base = by_way.get("speedtorch")
    for r in results:
        r["speedtorch speedup"] = r["ms/step"] / base if base else float("nan")
    print(format_table(results, ["way", "rows", "ms/step", "speedtorch speedup", "first loss", "last loss"]))
    if base and SEED_WAY in by_way:
        print(f"speedtorch vs {seed_speedtorch.LABEL}, both timed in this run in {args.rounds} alternating rounds: "
              f"{by_way[SEED_WAY] / base:.2f}x faster ({base:.3f} vs {by_way[SEED_WAY]:.3f} ms/step)")
    if scale:
        print(f"scale: the {args.scale_rows:,}-row table steps in {scale['ratio']:.3f}x the time of the "
              f"{args.rows:,}-row table ({scale['large ms']:.3f} vs {scale['small ms']:.3f} ms, both alive, timed in "
              f"{args.rounds} alternating rounds)")

    fused = fused_step_bench(args)
    print(format_table([fused], list(fused.keys())))
    if args.json:
        args.json.write_text(json.dumps({"train": results, "fused_step": fused,
                                         SEED_WAY: seed_missing or "timed"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
