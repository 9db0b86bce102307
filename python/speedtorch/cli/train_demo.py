"""`python -m speedtorch demo`: trains the recommender of speedtorch.models.recommender with its user table and Adam
state in host RAM (a HostEmbedding; pinned when there is a GPU), shows the loss falling with a progress bar, and
compares steps/s with the plain-PyTorch way in the same process (the user table on the CPU with
nn.Embedding(sparse=True) + SparseAdam, as one does when the table does not fit on the GPU), the ways taking turns
every 10 steps. The item table stays on the compute device with SparseAdam in both, and a third way puts it in
speedtorch too (a HostEmbedding there with the fused Adam). Runs on the GPU when there is one, else on the CPU."""

from __future__ import annotations

import argparse
import time

import torch

from .benchmarking import format_table, host_memory_words, positive_int
from ..models.recommender import make_way, zipf_batches

#: Steps each way runs in its turn before the other takes over.
ROUND_STEPS = 10


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def _train_in_turns(names, args, device, batches, progress):
    """Trains the ways side by side: all alive, taking turns in rounds of ROUND_STEPS steps, so a shared machine's
    changing load falls on each way alike (timing one way after the other swung the ratio from 0.6x to 2.5x on a
    loaded 2-core machine). Returns name -> (seconds of its timed steps, its losses every 10 steps)."""
    ways = {name: make_way(name, args.rows, args.dim, args.items, device, args.lr) for name in names}
    bar = None
    if progress:
        try:
            from tqdm import tqdm

            bar = tqdm(total=args.steps * len(ways), desc=" + ".join(ways), unit="step")
        except ImportError:
            bar = None
    for way in ways.values():
        way.step(*batches[0])  # warm-up: allocations, staging buffers, kernels loaded
    seconds = {name: 0.0 for name in ways}
    losses = {name: [] for name in ways}
    done = 0
    while done < args.steps:
        count = min(ROUND_STEPS, args.steps - done)
        for name, way in ways.items():
            _sync(device)
            start = time.perf_counter()
            for i in range(done, done + count):
                loss = way.step(*batches[i % len(batches)])
                if i % 10 == 0 or i == args.steps - 1:
                    losses[name].append(float(loss.detach()))
            _sync(device)
            seconds[name] += time.perf_counter() - start
            if bar is not None:
                bar.update(count)
                bar.set_postfix({f"loss {n}": f"{v[-1]:.4f}" for n, v in losses.items() if v})
        done += count
    if bar is not None:
        bar.close()
    return {name: (seconds[name], losses[name]) for name in ways}


def main(argv: list[str] | None = None) -> int:
    """``python -m speedtorch demo``: parses ``argv`` (see ``--help``), trains the recommender the ways the module
    docstring describes and prints their loss and steps/s. Returns the exit status."""
    gpu = torch.cuda.is_available()
    parser = argparse.ArgumentParser(
        prog="python -m speedtorch demo", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description=__doc__ + f" Sizes default to what suits the hardware ({'a GPU' if gpu else 'no GPU'} here).")
    parser.add_argument("--rows", type=positive_int, default=4_000_000 if gpu else 200_000, help="user table rows")
    parser.add_argument("--dim", type=positive_int, default=128 if gpu else 32, help="embedding width")
    parser.add_argument("--items", type=positive_int, default=100_000 if gpu else 10_000, help="item table rows (on the "
                        "compute device)")
    parser.add_argument("--batch", type=positive_int, default=65_536 if gpu else 4_096, help="interactions per step")
    parser.add_argument("--steps", type=positive_int, default=200 if gpu else 100, help="timed steps per way")
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
          f"compute on {device}; {torch.get_num_threads()} CPU threads")
    results = []
    trained = _train_in_turns(("speedtorch", "speedtorch_both_tables", "cpu_sparse_adam"), args, device, batches,
                              not args.no_progress)
    for name, (seconds, losses) in trained.items():
        results.append({"way": name, "steps/s": args.steps / seconds, "ms/step": 1e3 * seconds / args.steps,
                        "first loss": losses[0], "last loss": losses[-1]})
    print(format_table(results, ["way", "steps/s", "ms/step", "first loss", "last loss"]))
    by_way = {r["way"]: r for r in results}
    base = by_way["cpu_sparse_adam"]["steps/s"]
    fell = all(r["last loss"] < r["first loss"] for r in results if r["way"].startswith("speedtorch"))
    print(f"speedtorch trains at {by_way['speedtorch']['steps/s'] / base:.2f}x the steps/s of the plain-PyTorch way "
          f"(the user table in speedtorch, the item table on {device} with SparseAdam in both), "
          f"{by_way['speedtorch_both_tables']['steps/s'] / base:.2f}x with the item table in speedtorch too; "
          f"its loss fell: {fell}")
    return 0 if fell else 1
