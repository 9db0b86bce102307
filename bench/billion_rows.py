"""A table of a billion rows (issue 24): dim 32, bfloat16, row-wise Adagrad, in pinned host RAM, trained a few hundred
steps by speedtorch.TrainPipeline; prints how long the table took to set up (map, pin, optimizer layout, fill), the
step time, and the host RSS against the table's raw bytes (rows + one float of optimizer state each) and against its
layout (rows padded to 16 bytes, and the optimizer's 16-byte state record beside each).

Model: each sample a bag of ``--bag`` power-law ids, summed (HostEmbedding, mode="sum"), through a small MLP, binary
cross-entropy on synthetic labels.

    python bench/billion_rows.py                       # GPU: 1e9 rows (80 GB of host RAM), 300 steps (~4-6 min)
    python bench/billion_rows.py --rows 20000000       # a small run (the CPU machine: init rates, a few steps)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
import speedtorch  # noqa: E402
from speedtorch import TrainPipeline  # noqa: E402
from speedtorch.models.criteo import power_law_ids  # noqa: E402
from speedtorch.nn import HostEmbedding  # noqa: E402


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class BagModel(torch.nn.Module):
    def __init__(self, table: HostEmbedding, dim: int, device):
        super().__init__()
        self.table = table
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).to(device)

    def forward(self, batch):
        ids, offsets, labels = batch
        logits = self.mlp(self.table(ids, offsets).float()).squeeze(1)
        return torch.nn.functional.binary_cross_entropy_with_logits(logits, labels)

    def sparse_inputs(self, batch):
        return [(self.table, batch[0])]


def make_batches(args, count):
    generator = torch.Generator().manual_seed(0)
    out = []
    for _ in range(count):
        ids = power_law_ids(args.rows, args.batch * args.bag, args.exponent, generator)
        offsets = torch.arange(0, args.batch * args.bag, args.bag)
        labels = (ids[::args.bag] % 3 == 0).float()
        batch = (ids, offsets, labels)
        out.append(tuple(t.pin_memory() for t in batch) if torch.cuda.is_available() else batch)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000_000)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--dtype", default="bfloat16", choices=("float32", "float16", "bfloat16"))
    parser.add_argument("--batch", type=int, default=16_384, help="samples a step")
    parser.add_argument("--bag", type=int, default=16, help="ids a sample")
    parser.add_argument("--exponent", type=float, default=1.05, help="power law of the ids")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batches", type=int, default=8, help="distinct batches, cycled")
    parser.add_argument("--state-apart", action="store_true", help="optimizer state in a table of its own")
    parser.add_argument("--max-sms", type=int, default=None)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() and "cuda=none" not in speedtorch.build_info()
                          else "cpu")
    dtype = getattr(torch, args.dtype)
    element = torch.tensor([], dtype=dtype).element_size()
    raw = args.rows * (args.dim * element + 4)  # rows, and row-wise Adagrad's one float a row
    print(f"{args.rows:,} rows x {args.dim} {args.dtype}, rowwise_adagrad: raw {raw / 1e9:.1f} GB (rows + 4 bytes of "
          f"state a row); device {device}; {torch.get_num_threads()} threads", flush=True)
    if device.type == "cuda":
        torch.empty(1, device=device)  # the CUDA context's own host memory is not the table's
    rss0 = rss_bytes()
    phases = {}
    start = time.perf_counter()
    table = speedtorch.PinnedEmbedding(args.rows, args.dim, dtype)
    phases["map + pin rows"] = time.perf_counter() - start
    start = time.perf_counter()
    table.set_optimizer("rowwise_adagrad", {"lr": 0.05}, not args.state_apart)
    phases["optimizer layout (+ pin)"] = time.perf_counter() - start
    start = time.perf_counter()
    # uniform_, not normal_: torch's CPU normal_ of a bfloat16 tensor runs ~5x slower (23M values/s a core on the
    # CPU machine against 113M; bench/RESULTS.md), which would be minutes here.
    table.uniform_(-0.01, 0.01, 0)
    phases["fill U(-0.01, 0.01)"] = time.perf_counter() - start
    module = HostEmbedding(args.rows, args.dim, mode="sum", device=device, table=table)
    layout = table.nbytes()
    rss_table = rss_bytes() - rss0
    init_s = sum(phases.values())
    for name, seconds in phases.items():
        print(f"  {name}: {seconds:.1f} s", flush=True)
    print(f"init {init_s:.1f} s ({layout / 1e9 / init_s:.2f} GB/s of layout); layout {layout / 1e9:.1f} GB = "
          f"{layout / raw:.3f}x raw; host RSS +{rss_table / 1e9:.1f} GB = {rss_table / raw:.3f}x raw, "
          f"{rss_table / layout:.3f}x layout", flush=True)

    batches = make_batches(args, args.batches)
    model = BagModel(module, args.dim, device)
    opt = torch.optim.Adam(model.mlp.parameters(), lr=1e-3)
    # Timed from its first steps: prefetch fixed (prefetch="auto", the default, would run its trial among them).
    pipeline = TrainPipeline(model, opt, (batches[i % len(batches)] for i in range(args.steps)), device=device,
                             max_sms=args.max_sms, prefetch=True)
    losses, times = [], []
    warm = min(10, max(1, args.steps // 10))
    start = time.perf_counter()
    for step, loss in enumerate(pipeline):
        if step % 50 == 0 or step == args.steps - 1:
            losses.append((step, float(loss.detach())))
        if step + 1 == warm:
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
    if device.type == "cuda":
        torch.cuda.synchronize()
    timed_steps = args.steps - warm
    ms = (time.perf_counter() - start) / max(1, timed_steps) * 1e3
    distinct = torch.unique(batches[0][0]).numel()
    rss_trained = rss_bytes() - rss0
    print(f"trained {args.steps} steps: {ms:.2f} ms/step ({args.batch / ms * 1e3:,.0f} samples/s, "
          f"{distinct:,} distinct rows a batch of {args.batch * args.bag:,} ids); loss {losses[0][1]:.4f} -> "
          f"{losses[-1][1]:.4f}; host RSS +{rss_trained / 1e9:.1f} GB = {rss_trained / raw:.3f}x raw, "
          f"{rss_trained / layout:.3f}x layout", flush=True)
    if args.json:
        args.json.write_text(json.dumps({
            "rows": args.rows, "dim": args.dim, "dtype": args.dtype, "raw_bytes": raw, "layout_bytes": layout,
            "init_phases_s": phases, "init_s": init_s, "rss_after_init": rss_table, "rss_after_training": rss_trained,
            "ms_per_step": ms, "samples_per_s": args.batch / ms * 1e3, "distinct_rows": distinct, "losses": losses},
            indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
