"""What stochastic rounding of 16-bit tables costs: the fused optimizer step (PinnedEmbedding.apply_gradients) on a
bfloat16 / float16 table with rounding to nearest and with stochastic rounding (the optimizer option
stochastic_rounding, HostEmbedding's default for 16-bit tables), and on a float32 table for reference, side by side
in one run (the ways alternate in rounds), with ratios.

    python bench/stochastic_rounding.py                      # CPU: 65,536 distinct rows x 128 of a 1M-row table
    python bench/stochastic_rounding.py --device cuda        # the same step with gradients on the GPU (UVA kernel)
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
import speedtorch  # noqa: E402
from speedtorch.cli.benchmarking import format_table, median_seconds  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--batch", type=int, default=65_536, help="distinct rows per step")
    parser.add_argument("--optimizer", default="adam")
    parser.add_argument("--device", default="cpu", help="where the gradients live (cpu or cuda)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reps", type=int, default=10)
    args = parser.parse_args()

    ways = {"float32": (torch.float32, 0), "bfloat16, to nearest": (torch.bfloat16, 0),
            "bfloat16, stochastic": (torch.bfloat16, 1), "float16, to nearest": (torch.float16, 0),
            "float16, stochastic": (torch.float16, 1)}
    gen = torch.Generator().manual_seed(0)
    ids = torch.randperm(args.rows, generator=gen)[:args.batch].sort().values.to(args.device)
    grad = torch.randn(args.batch, args.dim, generator=gen).to(args.device)
    tables = {}
    for name, (dtype, rounding) in ways.items():
        table = speedtorch.PinnedEmbedding(args.rows, args.dim, dtype)
        table.set_optimizer(args.optimizer, {"lr": 1e-3, "stochastic_rounding": rounding}, True)
        table.normal_(0.0, 0.1, 0)
        tables[name] = table
    times = {name: [] for name in ways}
    for _ in range(args.rounds):  # alternating, so drift on a shared machine falls on every way alike
        for name, table in tables.items():
            times[name].append(median_seconds(lambda t=table: t.apply_gradients(ids, grad, True), reps=args.reps))
    base = {dtype: statistics.median(times[f"{str(dtype).split('.')[-1]}, to nearest"])
            for dtype in (torch.bfloat16, torch.float16)}
    rows = []
    for name, (dtype, _) in ways.items():
        ms = statistics.median(times[name]) * 1e3
        rows.append({"way": name, "ms/step": ms,
                     "vs to nearest": ms / (base[dtype] * 1e3) if dtype in base else "",
                     "vs float32": ms / (statistics.median(times["float32"]) * 1e3)})
    print(f"fused {args.optimizer} step, {args.batch} distinct rows x {args.dim} of {args.rows}, gradients on "
          f"{args.device}, {torch.get_num_threads()} threads, median of {args.rounds} rounds x {args.reps}")
    print(format_table(rows, ["way", "ms/step", "vs to nearest", "vs float32"]))


if __name__ == "__main__":
    main()
