"""`python -m speedtorch demo`: trains the recommender of speedtorch.recommender with its user table and Adam state
in host RAM (a HostEmbedding; pinned when there is a GPU), shows the loss falling with a progress bar, and compares
steps/s with the plain-PyTorch way in the same process (the user table on the CPU with nn.Embedding(sparse=True) +
SparseAdam, as one does when the table does not fit on the GPU). Runs on the GPU when there is one, else on the
CPU."""

from __future__ import annotations

import argparse
import time

import torch

from .benchmarking import format_table, host_memory_words
from .recommender import make_way, zipf_batches


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def _train(way_name, args, device, batches, progress):
    way = make_way(way_name, args.rows, args.dim, args.items, device, args.lr)
    losses = []
    bar = None
    if progress:
        try:
            from tqdm import tqdm

            bar = tqdm(total=args.steps, desc=way_name, unit="step")
        except ImportError:
            bar = None
    way.step(*batches[0])  # warm-up: allocations, staging buffers, kernels loaded
    _sync(device)
    start = time.perf_counter()
    for i in range(args.steps):
        loss = way.step(*batches[i % len(batches)])
        if i % 10 == 0 or i == args.steps - 1:
            losses.append(float(loss.detach()))
            if bar is not None:
                bar.set_postfix(loss=f"{losses[-1]:.4f}")
        if bar is not None:
            bar.update(1)
    _sync(device)
    seconds = time.perf_counter() - start
    if bar is not None:
        bar.close()
    del way
    return seconds, losses


def main(argv: list[str] | None = None) -> int:
    gpu = torch.cuda.is_available()
    parser = argparse.ArgumentParser(
        prog="python -m speedtorch demo", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description=__doc__ + f" Sizes default to what suits the hardware ({'a GPU' if gpu else 'no GPU'} here).")
    parser.add_argument("--rows", type=int, default=4_000_000 if gpu else 200_000, help="user table rows")
    parser.add_argument("--dim", type=int, default=128 if gpu else 32, help="embedding width")
    parser.add_argument("--items", type=int, default=100_000 if gpu else 10_000, help="item table rows (on the "
                        "compute device)")
    parser.add_argument("--batch", type=int, default=65_536 if gpu else 4_096, help="interactions per step")
    parser.add_argument("--steps", type=int, default=200 if gpu else 100, help="timed steps per way")
    parser.add_argument("--lr", type=float, default=1e-2, help="Adam learning rate")
    parser.add_argument("--cpu", action="store_true", help="train on the CPU even when a GPU is present")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)
    device = torch.device("cuda" if gpu and not args.cpu else "cpu")
    torch.manual_seed(0)
    # A few batches reused in turn: the loss falls as the model fits them.
    batches = zipf_batches(args.rows, args.batch, 8, num_items=args.items)
    if device.type == "cuda":
        batches = [tuple(t.to(device) for t in b) for b in batches]
    print(f"user table {args.rows:,} x {args.dim} float32 + Adam state in {host_memory_words()} "
          f"({args.rows * args.dim * 12 / 1e9:.2f} GB); {args.items:,} items; batch {args.batch:,} Zipf(1.2) users; "
          f"compute on {device}")
    results = []
    for name in ("speedtorch", "cpu_sparse_adam"):
        seconds, losses = _train(name, args, device, batches, not args.no_progress)
        results.append({"way": name, "steps/s": args.steps / seconds, "ms/step": 1e3 * seconds / args.steps,
                        "first loss": losses[0], "last loss": losses[-1]})
    print(format_table(results, ["way", "steps/s", "ms/step", "first loss", "last loss"]))
    ratio = results[0]["steps/s"] / results[1]["steps/s"]
    fell = results[0]["last loss"] < results[0]["first loss"]
    print(f"speedtorch trains at {ratio:.2f}x the steps/s of the plain-PyTorch way; its loss fell: {fell}")
    return 0 if fell else 1
