"""`python -m speedtorch transfer-demo`: a row-swap loop over a PinnedEmbedding (pinned when there is a GPU),
speedtorch against plain PyTorch in the same process. Each step gathers a batch of rows to the compute device,
updates them there, and writes them back; both ways apply the same updates, so their tables must agree at the end."""

from __future__ import annotations

import argparse
import time

import torch

from .._library import PinnedEmbedding
from .benchmarking import format_table, host_memory_words, positive_int


def _progress(iterable, desc: str, enabled: bool):
    if not enabled:
        return iterable
    try:
        from tqdm import tqdm
    except ImportError:
        return iterable
    return tqdm(iterable, desc=desc, unit="step", leave=True)


def _run(name, steps, batches, device, fetch, store, progress):
    torch.cuda.synchronize() if device.type == "cuda" else None
    start = time.perf_counter()
    for idx in _progress(batches[:steps], name, progress):
        rows = fetch(idx)
        rows.mul_(0.5).add_(1.0)
        store(idx, rows)
    torch.cuda.synchronize() if device.type == "cuda" else None
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    """``python -m speedtorch transfer-demo``: parses ``argv`` (see ``--help``), runs the row-swap loop the module
    docstring describes, speedtorch against plain PyTorch, and prints the timings. Returns the exit status."""
    has_gpu = torch.cuda.is_available()
    parser = argparse.ArgumentParser(
        prog="python -m speedtorch transfer-demo", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description=__doc__ + f" Sizes default to what suits the hardware ({'a GPU' if has_gpu else 'no GPU'} here).")
    parser.add_argument("--rows", type=positive_int, default=4_000_000 if has_gpu else 1_000_000, help="table rows")
    parser.add_argument("--dim", type=positive_int, default=128 if has_gpu else 64, help="row width (float32)")
    parser.add_argument("--batch", type=positive_int, default=65_536 if has_gpu else 16_384, help="distinct rows per step")
    parser.add_argument("--steps", type=positive_int, default=50, help="timed steps per way")
    parser.add_argument("--cpu", action="store_true", help="stay on the CPU even when a GPU is present")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)
    device = torch.device("cuda" if has_gpu and not args.cpu else "cpu")
    progress = not args.no_progress

    print(f"table {args.rows:,} x {args.dim} float32 ({args.rows * args.dim * 4 / 1e9:.2f} GB) in "
          f"{host_memory_words()}; "
          f"batch {args.batch:,} unique rows; compute on {device}")
    emb = PinnedEmbedding(args.rows, args.dim)
    emb.uniform_(-0.1, 0.1, 0)
    reference = emb.table().clone().pin_memory() if device.type == "cuda" else emb.table().clone()
    gen = torch.Generator().manual_seed(0)
    batches = [torch.randperm(args.rows, generator=gen)[: args.batch] for _ in range(args.steps + 2)]

    def torch_fetch(idx):
        return reference[idx].to(device, non_blocking=True)

    def torch_store(idx, rows):
        reference[idx] = rows.to("cpu")

    def st_fetch(idx):
        return emb.gather(idx, device)

    def st_store(idx, rows):
        emb.scatter_(idx, rows)

    # One warm-up step each (allocations, staging buffers), on the same rows so the tables stay in step.
    for fetch, store in ((st_fetch, st_store), (torch_fetch, torch_store)):
        _run("warm-up", 1, batches[-1:], device, fetch, store, False)
    t_speed = _run("speedtorch", args.steps, batches, device, st_fetch, st_store, progress)
    t_torch = _run("plain torch", args.steps, batches, device, torch_fetch, torch_store, progress)
    if device.type == "cuda":
        torch.cuda.synchronize()
    agree = torch.equal(emb.table(), reference)

    moved = 2 * args.batch * args.dim * 4 * args.steps
    rows = [
        {"way": "speedtorch gather + scatter_", "steps/s": args.steps / t_speed, "GB/s": moved / t_speed / 1e9},
        {"way": "torch index + copy" + (" (pinned)" if reference.is_pinned() else ""), "steps/s": args.steps / t_torch,
         "GB/s": moved / t_torch / 1e9},
    ]
    print(format_table(rows, ["way", "steps/s", "GB/s"]))
    print(f"speedtorch is {t_torch / t_speed:.2f}x the plain-PyTorch step rate; tables agree: {agree}")
    return 0 if agree else 1
