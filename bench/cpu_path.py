"""The CPU path beside the torch code that does the same job, side by side in one run, at 1 and 2 threads (issue 23
item 7), with ratios (> 1: speedtorch faster).

Operators, on two workloads: the design batch (`--batch` distinct random rows x `--dim` float32 of a `--rows` table:
64 MiB of rows at the defaults; for the steps with duplicates, `--batch` ids drawn with replacement) and one batch of
`python -m speedtorch demo` (4,096 Zipf(1.2) ids over 200,000 x 32: ~1,400 distinct rows):
- gather against `index_select`; scatter_ (distinct rows) against `index_copy_`;
- the fused Adam step (PinnedEmbedding.apply_gradients, state beside each row; for distinct ids `sorted_unique=True`,
  as HostEmbedding hands them over) against torch's `SparseAdam` and against the fastest torch code for the same
  update: the touched rows and their state taken out with `index_select`, `torch._fused_adam_` (what
  `Adam(fused=True)` runs) on them, and put back with `index_copy_`; with duplicate ids, `torch.unique` and
  `index_add_` sum their gradients first.
Training: the demo's ways (`python -m speedtorch demo`'s CPU sizes: every embedding table in speedtorch; the user
table only; the user table on the CPU with nn.Embedding(sparse=True) + SparseAdam, the item table with SparseAdam in
the last two) trained in alternating rounds; steps/s from the median step.

Every way of a block is timed in interleaved rounds (bench/interleaved_timing.py: medians); the load average is
printed with each block, as this is a shared machine and only ratios from one run compare.

    python bench/cpu_path.py                       # ~3 minutes on 2 cores, ~3 GB of RAM
    python bench/cpu_path.py --threads 1,2,4 --json cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
import speedtorch  # noqa: E402
from speedtorch.cli.benchmarking import format_table  # noqa: E402
from speedtorch.models.recommender import make_way, zipf_batches  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from interleaved_timing import time_calls, time_steps  # noqa: E402

SPEEDTORCH = "speedtorch"
DEMO_WAYS = ("speedtorch_both_tables", "speedtorch", "cpu_sparse_adam")


def workloads(args) -> list[dict]:
    """The design batch and one demo batch: distinct ids (sorted, as torch.unique gives them) and ids with
    duplicates."""
    gen = torch.Generator().manual_seed(0)
    demo_ids = zipf_batches(200_000, 4_096, 1)[0][0]
    return [
        {"label": f"{args.batch:,} of {args.rows:,} x {args.dim}", "rows": args.rows, "dim": args.dim,
         "distinct": torch.randperm(args.rows, generator=gen)[: args.batch].sort().values,
         "with_duplicates": torch.randint(0, args.rows, (args.batch,), generator=gen),
         "reps": args.reps, "rounds": args.rounds},
        {"label": "demo batch: 4,096 Zipf ids of 200,000 x 32", "rows": 200_000, "dim": 32,
         "distinct": torch.unique(demo_ids), "with_duplicates": demo_ids,
         "reps": args.small_reps, "rounds": args.small_rounds},
    ]


def calls(work: dict) -> dict[tuple[str, str], object]:
    """(op, way) -> callable: speedtorch's gather, scatter_ and fused Adam step, and the torch code doing the same."""
    rows, dim = work["rows"], work["dim"]
    ids, dup = work["distinct"], work["with_duplicates"]
    table = speedtorch.pinned_empty(rows, dim)
    table.uniform_(-1, 1)
    src = torch.randn(ids.numel(), dim)
    grad, dup_grad = torch.randn(ids.numel(), dim), torch.randn(dup.numel(), dim)
    emb = speedtorch.PinnedEmbedding(rows, dim)
    emb.set_optimizer("adam", {"lr": 1e-3}, True)
    emb.uniform_(-0.1, 0.1, 0)
    # torch's table: the weights as a Parameter for SparseAdam, its tensors also for the code on the touched rows.
    param = torch.nn.Parameter(torch.empty(rows, dim).uniform_(-0.1, 0.1))
    sparse_adam = torch.optim.SparseAdam([param], lr=1e-3)
    coalesced = torch.sparse_coo_tensor(ids.unsqueeze(0), grad, (rows, dim), check_invariants=False).coalesce()
    uncoalesced = torch.sparse_coo_tensor(dup.unsqueeze(0), dup_grad, (rows, dim), check_invariants=False)
    exp_avg, exp_avg_sq, step = torch.zeros(rows, dim), torch.zeros(rows, dim), torch.zeros(())

    def sparse_adam_step(g):
        param.grad = g
        sparse_adam.step()

    def torch_rows_adam(touched, g):
        w, m, v = (t.index_select(0, touched) for t in (param.data, exp_avg, exp_avg_sq))
        step.add_(1)
        torch._fused_adam_([w], [g], [m], [v], [], [step], lr=1e-3, beta1=0.9, beta2=0.999, weight_decay=0.0,
                           eps=1e-8, amsgrad=False, maximize=False)
        for t, value in ((param.data, w), (exp_avg, m), (exp_avg_sq, v)):
            t.index_copy_(0, touched, value)

    def torch_rows_adam_summed():
        unique, inverse = torch.unique(dup, sorted=True, return_inverse=True)
        torch_rows_adam(unique, torch.zeros(unique.numel(), dim).index_add_(0, inverse, dup_grad))

    rows_adam = "torch index_select + _fused_adam_ + index_copy_"
    return {
        ("gather", SPEEDTORCH): lambda: speedtorch.gather(table, ids),
        ("gather", "torch index_select"): lambda: table.index_select(0, ids),
        ("scatter_", SPEEDTORCH): lambda: speedtorch.scatter_(table, ids, src),
        ("scatter_", "torch index_copy_"): lambda: table.index_copy_(0, ids, src),
        ("Adam step, distinct ids", SPEEDTORCH): lambda: emb.apply_gradients(ids, grad, True),
        ("Adam step, distinct ids", "torch SparseAdam"): lambda: sparse_adam_step(coalesced),
        ("Adam step, distinct ids", rows_adam): lambda: torch_rows_adam(ids, grad),
        ("Adam step, ids with duplicates", SPEEDTORCH): lambda: emb.apply_gradients(dup, dup_grad),
        ("Adam step, ids with duplicates", "torch SparseAdam"): lambda: sparse_adam_step(uncoalesced),
        ("Adam step, ids with duplicates", "torch unique + index_add_ + " + rows_adam[6:]): torch_rows_adam_summed,
    }


def load() -> str:
    return f"{os.getloadavg()[0]:.1f}"


def op_benchmark(args) -> tuple[list[dict], list[dict]]:
    """Every way of every op, per workload and thread count; and per op the ratio to the fastest torch way."""
    results, summary = [], []
    for work in workloads(args):
        ways = calls(work)
        for threads in args.threads:
            torch.set_num_threads(threads)
            load_before = load()
            seconds = time_calls(ways, work["reps"], work["rounds"])
            load_range = f"{load_before}-{load()}"
            for op in dict.fromkeys(op for op, _ in ways):
                ours = seconds[(op, SPEEDTORCH)]
                theirs = {way: s for (o, way), s in seconds.items() if o == op and way != SPEEDTORCH}
                for way, s in theirs.items():
                    results.append({"threads": threads, "workload": work["label"], "op": op, "torch way": way,
                                    "speedtorch ms": ours * 1e3, "torch ms": s * 1e3, "speedup": s / ours,
                                    "load": load_range})
                best = min(theirs, key=theirs.get)
                summary.append({"threads": threads, "workload": work["label"], "op": op,
                                "speedup over the fastest torch way": theirs[best] / ours, "fastest torch way": best})
        del ways
    return results, summary


def demo_benchmark(args) -> list[dict]:
    """The demo's ways at its CPU sizes, trained in alternating rounds at each thread count."""
    results = []
    batches = zipf_batches(200_000, 4_096, 8, num_items=10_000)
    for threads in args.threads:
        torch.set_num_threads(threads)
        torch.manual_seed(0)
        entries = {name: (make_way(name, 200_000, 32, 10_000, torch.device("cpu"), 1e-2), batches)
                   for name in DEMO_WAYS}
        load_before = load()
        timed = time_steps(entries, args.demo_steps, args.demo_rounds, warmup=5)
        base = timed["cpu_sparse_adam"][0]
        for name, (ms, first_loss, last_loss) in timed.items():
            results.append({"threads": threads, "way": name, "ms/step": ms, "steps/s": 1e3 / ms,
                            "steps/s over cpu_sparse_adam": base / ms, "loss": f"{first_loss:.3f} -> {last_loss:.3f}",
                            "load": f"{load_before}-{load()}"})
        del entries
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2],
                        help="intra-op thread counts, comma-separated")
    parser.add_argument("--rows", type=int, default=500_000, help="rows of the design batch's table")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--batch", type=int, default=131_072)
    parser.add_argument("--reps", type=int, default=10, help="timed calls of each way, design batch")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds, design batch")
    parser.add_argument("--small-reps", type=int, default=300, help="timed calls of each way, demo batch")
    parser.add_argument("--small-rounds", type=int, default=15, help="interleaved rounds, demo batch")
    parser.add_argument("--demo-steps", type=int, default=300, help="timed training steps of each way")
    parser.add_argument("--demo-rounds", type=int, default=15, help="interleaved rounds of the training ways")
    parser.add_argument("--no-ops", dest="ops", action="store_false", help="leave out the operators")
    parser.add_argument("--no-demo", dest="demo", action="store_false", help="leave out the training demo")
    parser.add_argument("--json", type=Path, help="write all results here")
    args = parser.parse_args(argv)

    print(f"CPU path at {args.threads} intra-op threads; load average {load()} on {os.cpu_count()} cores; "
          f"torch {torch.__version__}; {speedtorch.build_info()}", flush=True)
    out = {}
    if args.ops:
        results, summary = op_benchmark(args)
        print(format_table(results, ["threads", "workload", "op", "torch way", "speedtorch ms", "torch ms", "speedup",
                                     "load"]))
        print()
        print(format_table(summary, ["threads", "workload", "op", "speedup over the fastest torch way",
                                     "fastest torch way"]))
        slower = [s for s in summary if s["speedup over the fastest torch way"] < 1]
        print(f"speedtorch beats the fastest torch way in {len(summary) - len(slower)} of {len(summary)} "
              f"(op, workload, threads)" + (": not in " + "; ".join(
                  f"{s['op']}, {s['workload']}, {s['threads']} threads" for s in slower) if slower else ""))
        out.update(ops=results, summary=summary)
    if args.demo:
        print()
        demo = demo_benchmark(args)
        print(format_table(demo, ["threads", "way", "ms/step", "steps/s", "steps/s over cpu_sparse_adam", "loss",
                                  "load"]))
        out.update(demo=demo)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
