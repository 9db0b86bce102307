"""Why the staged path (CPU threads gather rows into pinned staging, the copy engine moves each chunk while the
next fills) is slower than a Python prototype of the same idea (issue 16). Side by side, in one run:

- the link: contiguous pinned memcpy host -> GPU;
- the CPU gather alone: speedtorch's row copy (gather from the host table into host memory) and torch's
  index_select into pinned memory;
- the prototype: a staging area as large as the batch, index_select per chunk of 32,768 rows, each chunk's copy
  queued as soon as it is filled;
- the engine's staged path alone (uva_fraction=0) for several chunk sizes, indices on the host and on the GPU;
- the engine's split for several UVA shares (gather and scatter_);
each at 2 threads and at all of them. Prints GB/s and the share of memcpy.

    python bench/experiments/staged_path_profile.py --rows 10000000
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
import speedtorch  # noqa: E402
from speedtorch.cli.benchmarking import format_table, gbps, median_seconds  # noqa: E402


def prototype_gather(table, idx_cpu, staging, out, copy_stream, chunk_rows):
    """The prototype: fill a chunk of staging with index_select, queue its copy, go on with the next chunk."""
    caller = torch.cuda.current_stream()
    copy_stream.wait_stream(caller)
    for begin in range(0, idx_cpu.numel(), chunk_rows):
        end = min(begin + chunk_rows, idx_cpu.numel())
        torch.index_select(table, 0, idx_cpu[begin:end], out=staging[begin:end])
        with torch.cuda.stream(copy_stream):
            out[begin:end].copy_(staging[begin:end], non_blocking=True)
    caller.wait_stream(copy_stream)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--batch", type=int, default=131_072)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--chunk-mb", type=lambda s: [int(x) for x in s.split(",")], default=[2, 8, 16, 32, 64])
    parser.add_argument("--fractions", type=lambda s: [float(x) for x in s.split(",")], default=[0.2, 0.3, 0.4, 0.5])
    parser.add_argument("--threads", type=lambda s: [int(x) for x in s.split(",")], default=None,
                        help="CPU thread counts to run (default: 2 and all)")
    args = parser.parse_args()

    all_threads = torch.get_num_threads()
    emb = speedtorch.PinnedEmbedding(args.rows, args.dim, torch.float32)
    emb.uniform_(-1.0, 1.0, 0)
    table = emb.table()
    nbytes = args.batch * args.dim * 4
    gen = torch.Generator().manual_seed(3)
    idx_cpu = torch.randperm(args.rows, generator=gen)[: args.batch]
    idx_gpu = idx_cpu.cuda()
    expected = table[idx_cpu].cuda()
    host_out = torch.empty(args.batch, args.dim)
    staging = speedtorch.pinned_empty(args.batch, args.dim)
    out = torch.empty(args.batch, args.dim, device="cuda")
    copy_stream = torch.cuda.Stream()
    limit = gbps(nbytes, median_seconds(lambda: out.copy_(staging, non_blocking=True), args.reps))

    rows = []

    def record(threads, what, seconds):
        rate = gbps(nbytes, seconds)
        rows.append({"threads": threads, "path": what, "GB/s": rate, "of memcpy": rate / limit})
        print(rows[-1], flush=True)

    for threads in args.threads or sorted({2, all_threads}):
        torch.set_num_threads(threads)
        record(threads, "cpu gather: speedtorch row copy (allocates)", median_seconds(
            lambda: speedtorch.gather(table, idx_cpu), args.reps))
        record(threads, "cpu gather: index_select (allocates)", median_seconds(
            lambda: torch.index_select(table, 0, idx_cpu), args.reps))
        record(threads, "cpu gather: index_select into pinned", median_seconds(
            lambda: torch.index_select(table, 0, idx_cpu, out=staging), args.reps))
        record(threads, "cpu gather: index_select into pageable", median_seconds(
            lambda: torch.index_select(table, 0, idx_cpu, out=host_out), args.reps))
        for chunk_rows in (16_384, 32_768, 65_536):
            prototype_gather(table, idx_cpu, staging, out, copy_stream, chunk_rows)
            torch.testing.assert_close(out, expected, rtol=0, atol=0)
            record(threads, f"prototype, chunks of {chunk_rows} rows", median_seconds(
                lambda: prototype_gather(table, idx_cpu, staging, out, copy_stream, chunk_rows), args.reps))
        for chunk_mb in args.chunk_mb:
            settings = dict(uva_fraction=0.0, uva_reach_bytes=0, small_transfer_bytes=0,
                            staging_chunk_bytes=chunk_mb << 20)
            with speedtorch.transfer_config_override(**settings):
                for where, idx in (("host", idx_cpu), ("gpu", idx_gpu)):
                    torch.testing.assert_close(speedtorch.gather(table, idx, "cuda"), expected, rtol=0, atol=0)
                    record(threads, f"engine staged only, {chunk_mb} MB chunks, indices on {where}", median_seconds(
                        lambda: speedtorch.gather(table, idx, "cuda"), args.reps))
        for fraction in [-1.0, 0.0, *args.fractions, 1.0]:
            with speedtorch.transfer_config_override(uva_fraction=fraction):
                for where, idx in (("host", idx_cpu), ("gpu", idx_gpu)):
                    label = "auto" if fraction < 0 else f"{fraction:.2f}"
                    record(threads, f"gather, UVA share {label}, indices on {where}", median_seconds(
                        lambda: speedtorch.gather(table, idx, "cuda"), args.reps))
                    record(threads, f"scatter_, UVA share {label}, indices on {where}", median_seconds(
                        lambda: speedtorch.scatter_(table, idx, out), args.reps))
    torch.set_num_threads(all_threads)
    print(f"memcpy host->GPU {limit:.1f} GB/s; {args.rows} x {args.dim} float32, {args.batch} spread rows")
    print(format_table(rows, list(rows[0].keys())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
