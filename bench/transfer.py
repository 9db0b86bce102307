"""Row-transfer benchmark: speedtorch gather / scatter_ against the link's limit and the PyTorch and CuPy ways, side
by side in one run, with ratios to the contiguous pinned memcpy bandwidth measured in the same run.

Workload (bench/BASELINES.md): `--batch` random distinct rows x `--dim` float32 between a `--rows` x `--dim` pinned host
table and a GPU tensor; rows spread over the whole table ("spread") and within its first `--local-bytes` ("local");
float16 / bfloat16 views of the same bytes; at each of `--threads` CPU thread counts. Then the fused optimizer step
(`--step`, on by default: Adam, row-wise Adagrad and SGD with momentum, the batch's distinct rows, state beside each
row) against the pinned memcpy of its bytes in both directions at once ("duplex": the step reads and writes every
row, so that is its bound). `auto` measures its split at its first call of each kind (`speedtorch.transfer_calibrations()`;
the warm-up calls take it). SpeedTorch 0.1.6 itself
(its ModelFactory over a pinned CuPy collection of the same size: beforeForwardPass / afterOptimizerStep, see
bench/seed_speedtorch.py) is timed in turns with speedtorch's default plan on the spread rows, with the ratio
printed; without CuPy or `make seed-speedtorch` a line says it was skipped. Without a GPU it runs bench/cpu_path.py
instead (the CPU path's operators beside the torch code doing the same, at `--threads`, default 1 and 2).

Checks (issue 30 item 4): `auto` must never be slower than UVA alone. For every thread count, dtype and direction
`auto` and UVA alone (`uva_fraction=1`) are also timed in turns, and a line `check ... ok` or `check ... FAIL` is
printed for each (FAIL: `auto`'s median is more than 3% slower, the link's run-to-run spread), and for every other
`auto` row of the run against the UVA-alone row of its thread count and dtype. These are benchmark checks, not tests:
they print, the exit status stays 0. Beside them: what the CPU threads of the staged share move (one staging chunk
gathered on the CPU, at each thread count), and the split each kind of call measured and the guard's state
(`speedtorch.transfer_calibrations()`), so a slow `auto` shows whether its CPU share or the GPU was slow.

`--reference` (default with `--quick`) runs bench/uva_reference.py afterwards in the same process: stand-alone
CuPy kernels, and a UVA kernel beside CPU threads staging a share, as shares of the same memcpy.

    python bench/transfer.py                       # the design workload (needs ~6 GB of host RAM per table)
    python bench/transfer.py --rows 1000000 --json out.json
    python bench/transfer.py --quick --threads 16,2    # issue 30 item 4's figures in ~3 minutes
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
import speedtorch  # noqa: E402
from speedtorch.cli.benchmarking import format_table, gbps, median_seconds  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cpu_path  # noqa: E402
import seed_speedtorch  # noqa: E402
from interleaved_timing import time_calls  # noqa: E402
from torch_staged_baseline import torch_staged_calls  # noqa: E402

SEED_ROW = f"{seed_speedtorch.LABEL} ModelFactory(CPUPinn=True)"
AUTO_IN_TURNS = "speedtorch auto, in turns with UVA alone"
UVA_IN_TURNS = "speedtorch uva=1.00, in turns with auto"
# `auto` counts as slower than UVA alone when its median time is more than this much above UVA alone's: the link's
# run-to-run spread (the calibration's margin, csrc/transfer/split_calibration.cpp).
AUTO_TOLERANCE = 1.03


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def fraction_label(f: float) -> str:
    return "auto" if f < 0 else f"uva={f:.2f}"


def busy_threads(when: str, count: int = 8) -> None:
    """Prints the machine's busiest threads over the last 0.3 s (`top`'s second frame): what else competes with the
    CPU threads of the staged share (issue 30: one core busy elsewhere makes an OpenMP region wait a scheduling
    period)."""
    try:
        frames = subprocess.run(["top", "-b", "-H", "-n", "2", "-d", "0.3", "-w", "160"], capture_output=True,
                                text=True, timeout=10).stdout.split("\n\n")
    except (OSError, subprocess.SubprocessError) as e:
        print(f"busiest threads {when}: top failed ({e})", flush=True)
        return
    table = [line for line in frames[-1].splitlines() if line.strip()]
    header = next((i for i, line in enumerate(table) if line.split()[:1] == ["PID"]), None)
    rows = table[header + 1:header + 1 + count] if header is not None else []
    # top's columns: PID USER PR NI VIRT RES SHR S %CPU %MEM TIME+ COMMAND
    busy = [f"{r.split()[8]}% {' '.join(r.split()[11:])} ({r.split()[0]})" for r in rows if len(r.split()) >= 12]
    print(f"busiest threads {when} (load average {os.getloadavg()[0]:.1f}): " + " | ".join(busy), flush=True)


def cupy_take(table: torch.Tensor, idx_gpu: torch.Tensor, out: torch.Tensor):
    """CuPy fancy indexing over the pinned table, as SpeedTorch does it (a CuPy array over pinned memory, read by
    CuPy's kernel through UVA); None when CuPy is missing."""
    try:
        import cupy
    except ImportError:
        return None
    nbytes = table.numel() * table.element_size()
    mem = cupy.cuda.UnownedMemory(table.data_ptr(), nbytes, table)
    host = cupy.ndarray(tuple(table.shape), dtype=cupy.float32, memptr=cupy.cuda.MemoryPointer(mem, 0))
    idx = cupy.from_dlpack(idx_gpu)
    dst = cupy.from_dlpack(out)
    stream = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)

    def gather():
        with stream:
            cupy.take(host, idx, axis=0, out=dst)

    def scatter():
        with stream:
            host[idx] = dst

    return gather, scatter


def gpu_benchmark(args) -> list[dict]:
    results: list[dict] = []
    dim, batch = args.dim, args.batch
    row_bytes = dim * 4
    nbytes = batch * row_bytes

    torch.empty(1, device="cuda")  # CUDA context first: its own host memory is not the table's
    rss0 = rss_bytes()
    emb = speedtorch.PinnedEmbedding(args.rows, dim)
    emb.uniform_(-1.0, 1.0, 0)
    table = emb.table()
    rss_table = rss_bytes() - rss0
    raw = args.rows * row_bytes
    print(f"table {args.rows:,} x {dim} float32: {raw / 1e9:.2f} GB raw, host RSS +{rss_table / 1e9:.2f} GB "
          f"({rss_table / raw:.3f}x)", flush=True)
    results.append({"what": "host RSS / raw bytes, speedtorch table", "value": rss_table / raw})
    seed = None
    seed_missing = seed_speedtorch.availability() if args.seed else "--no-seed"
    if seed_missing:
        print(f"{seed_speedtorch.LABEL}: skipped ({seed_missing})", flush=True)
    else:
        seed = seed_speedtorch.build_or_report(
            "the transfer way", lambda: seed_speedtorch.SeedTransfer(args.rows, dim, "cuda").probe())
        if seed is not None:
            print(f"{seed_speedtorch.LABEL}: a {args.rows:,} x {dim} collection in its pinned CuPy memory", flush=True)
    if args.torch_pinned_rss:
        rss1 = rss_bytes()
        other = torch.empty(args.rows, dim, pin_memory=True)
        other.fill_(1.0)
        results.append({"what": "host RSS / raw bytes, torch pin_memory=True", "value": (rss_bytes() - rss1) / raw})
        del other

    gen = torch.Generator().manual_seed(1)
    local_rows = min(args.rows, args.local_bytes // row_bytes)
    index_sets = {
        "spread": torch.randperm(args.rows, generator=gen)[:batch],
        "local": torch.randperm(local_rows, generator=gen)[:batch],
    }
    out = torch.empty(batch, dim, device="cuda")
    src = torch.randn(batch, dim, device="cuda")

    # The link's limit: a contiguous pinned copy of the same size. It is measured again before every group of
    # rows (the link's rate drifted between runs on the shared GPU machine) and each ratio uses the latest.
    host = torch.empty(batch, dim, pin_memory=True)
    limit: dict[str, float] = {}
    limits_seen: list[dict[str, float]] = []

    def measure_limit():
        h2d = median_seconds(lambda: out.copy_(host, non_blocking=True), args.reps)
        d2h = median_seconds(lambda: host.copy_(src, non_blocking=True), args.reps)
        limit.update(h2d=gbps(nbytes, h2d), d2h=gbps(nbytes, d2h))
        limits_seen.append(dict(limit))

    measure_limit()
    print(f"contiguous pinned memcpy: host->GPU {limit['h2d']:.1f} GB/s, GPU->host {limit['d2h']:.1f} GB/s",
          flush=True)

    def record(threads, locality, dtype, way, direction, seconds):
        bw = gbps(nbytes, seconds)
        results.append({"threads": threads, "rows": locality, "dtype": dtype, "way": way, "dir": direction,
                        "ms": seconds * 1e3, "GB/s": bw, "of memcpy": bw / limit[direction],
                        "memcpy GB/s": limit[direction]})

    def seed_rows(threads, seed, idx_gpu):
        """SpeedTorch 0.1.6 and speedtorch's default plan on the same rows, timed in turns (`--rounds`)."""
        seed_idx = seed.indices(idx_gpu)
        seed.gather(seed_idx)  # the model variable holds a batch before the first write-back
        timed = time_calls({("speedtorch", "h2d"): lambda: speedtorch.gather(table, idx_gpu),
                            ("seed", "h2d"): lambda: seed.gather(seed_idx),
                            ("speedtorch", "d2h"): lambda: speedtorch.scatter_(table, idx_gpu, src),
                            ("seed", "d2h"): lambda: seed.scatter(seed_idx)}, args.reps, args.rounds)
        for direction in ("h2d", "d2h"):
            record(threads, "spread", "float32", "speedtorch auto, in turns with SpeedTorch", direction,
                   timed[("speedtorch", direction)])
            record(threads, "spread", "float32", SEED_ROW, direction, timed[("seed", direction)])
            seed_ratios.append({"threads": threads, "dir": direction,
                                "speedup": timed[("seed", direction)] / timed[("speedtorch", direction)]})

    def auto_against_uva(threads, idx_gpu):
        """`auto` and UVA alone in turns, per dtype and direction (the item-4 check's own figures)."""
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            view, view_src = table.view(dtype), src.view(dtype)
            name = str(dtype).replace("torch.", "")

            def uva_gather():
                with speedtorch.transfer_config_override(uva_fraction=1.0):
                    speedtorch.gather(view, idx_gpu)

            def uva_scatter():
                with speedtorch.transfer_config_override(uva_fraction=1.0):
                    speedtorch.scatter_(view, idx_gpu, view_src)

            timed = time_calls({("auto", "h2d"): lambda: speedtorch.gather(view, idx_gpu),
                                ("uva", "h2d"): uva_gather,
                                ("auto", "d2h"): lambda: speedtorch.scatter_(view, idx_gpu, view_src),
                                ("uva", "d2h"): uva_scatter}, args.reps, args.rounds)
            for direction in ("h2d", "d2h"):
                record(threads, "spread", name, AUTO_IN_TURNS, direction, timed[("auto", direction)])
                record(threads, "spread", name, UVA_IN_TURNS, direction, timed[("uva", direction)])

    def cpu_share_rate(threads, idx_cpu, when=""):
        """What the staged share's CPU threads move: one staging chunk (8 MiB) of the spread rows gathered on the CPU
        into host memory by speedtorch's CPU kernel (the staged share's: helper threads that join when they run,
        cpu/helped_parallel_for.h), and by torch.index_select (at::parallel_for, OpenMP: a split that waits for every
        thread, also one the scheduler has not run yet), at this thread count: median and slowest call."""
        chunk = idx_cpu[: (8 << 20) // row_bytes]
        staging_rows = torch.empty(chunk.numel(), dim)
        for way, fn in (("CPU gather, one 8 MiB staging chunk (helper threads)",
                         lambda: speedtorch.gather(table, chunk)),
                        ("torch.index_select of the same rows (OpenMP)",
                         lambda: torch.index_select(table, 0, chunk, out=staging_rows))):
            times = []
            for _ in range(args.reps + 3):
                start = time.perf_counter()
                fn()
                times.append(time.perf_counter() - start)
            times = times[3:]
            seconds = statistics.median(times)
            results.append({"threads": threads, "rows": "spread", "dtype": "float32", "way": way + when, "dir": "cpu",
                            "ms": seconds * 1e3, "max ms": max(times) * 1e3,
                            "GB/s": gbps(chunk.numel() * row_bytes, seconds), "load": os.getloadavg()[0],
                            "torch threads": torch.get_num_threads()})

    seed_ratios: list[dict] = []
    staging = torch.empty(batch, dim, pin_memory=True)
    for threads in args.threads:
        torch.set_num_threads(threads)
        for locality, idx_cpu in index_sets.items():
            if args.quick and locality != "spread":
                continue
            measure_limit()
            idx_gpu = idx_cpu.cuda()
            for fraction in args.fractions:
                with speedtorch.transfer_config_override(uva_fraction=fraction):
                    for direction, fn in (
                        ("h2d", lambda: speedtorch.gather(table, idx_gpu)),
                        ("d2h", lambda: speedtorch.scatter_(table, idx_gpu, src)),
                    ):
                        record(threads, locality, "float32", f"speedtorch {fraction_label(fraction)}", direction,
                               median_seconds(fn, args.reps))
            if locality == "spread":  # the UVA path without sorting its share, for comparison
                with speedtorch.transfer_config_override(uva_fraction=1.0, sort_uva_indices=0):
                    record(threads, locality, "float32", "speedtorch uva=1.00 unsorted", "h2d",
                           median_seconds(lambda: speedtorch.gather(table, idx_gpu), args.reps))
                    record(threads, locality, "float32", "speedtorch uva=1.00 unsorted", "d2h",
                           median_seconds(lambda: speedtorch.scatter_(table, idx_gpu, src), args.reps))
            # No SM: CPU helper threads in stream order and the copy engines (transfer/stream_ordered_staging.h);
            # a step's write-back scatters sorted distinct ids.
            with speedtorch.transfer_config_override(stream_ordered_staging=1):
                way = "speedtorch stream-ordered staging"
                record(threads, locality, "float32", way, "h2d",
                       median_seconds(lambda: speedtorch.gather(table, idx_gpu), args.reps))
                record(threads, locality, "float32", way, "d2h",
                       median_seconds(lambda: speedtorch.scatter_(table, idx_gpu, src), args.reps))
                idx_sorted = idx_gpu.sort().values
                record(threads, locality, "float32", way + ", sorted ids", "d2h",
                       median_seconds(lambda: speedtorch.scatter_(table, idx_sorted, src), args.reps))
            # From here on the process's settings (the automatic plan).
            # Same call with host indices (the data loader's usual output).
            record(threads, locality, "float32", "speedtorch auto, CPU indices", "h2d",
                   median_seconds(lambda: speedtorch.gather(table, idx_cpu, "cuda"), args.reps))
            if locality == "spread":
                cpu_share_rate(threads, idx_cpu)
                busy_threads(f"at {threads} threads")
                auto_against_uva(threads, idx_gpu)
            if args.quick:
                continue

            torch_staged_gather, torch_staged_scatter = torch_staged_calls(table, idx_cpu, out, src, staging)
            record(threads, locality, "float32", "torch index_select + pinned staging", "h2d",
                   median_seconds(torch_staged_gather, args.reps))
            record(threads, locality, "float32", "torch pinned staging + index_copy_", "d2h",
                   median_seconds(torch_staged_scatter, args.reps))
            if locality == "spread":
                record(threads, locality, "float32", "naive host[idx].cuda()", "h2d",
                       median_seconds(lambda: table[idx_cpu].cuda(), max(3, args.reps // 3)))

                def naive_scatter():
                    table[idx_cpu] = src.cpu()

                record(threads, locality, "float32", "naive host[idx] = var.cpu()", "d2h",
                       median_seconds(naive_scatter, max(3, args.reps // 3)))
                cp = cupy_take(table, idx_gpu, out)
                if cp is not None:
                    record(threads, locality, "float32", "CuPy over pinned table (SpeedTorch)", "h2d",
                           median_seconds(cp[0], args.reps))
                    record(threads, locality, "float32", "CuPy over pinned table (SpeedTorch)", "d2h",
                           median_seconds(cp[1], args.reps))
                if seed is not None:
                    seed_rows(threads, seed, idx_gpu)
                    # Again after SpeedTorch's turns: issue 30's collapse of auto began there.
                    cpu_share_rate(threads, idx_cpu, ", after SpeedTorch's turns")
                    busy_threads(f"at {threads} threads, after SpeedTorch's turns")
            # Half-precision tables: the same bytes seen as (rows, 2 * dim) 16-bit values, so row bytes match.
            if locality == "spread":
                for dtype in (torch.float16, torch.bfloat16):
                    half = table.view(dtype)
                    half_src = src.view(dtype)
                    name = str(dtype).replace("torch.", "")
                    record(threads, locality, name, "speedtorch auto", "h2d",
                           median_seconds(lambda: speedtorch.gather(half, idx_gpu), args.reps))
                    record(threads, locality, name, "speedtorch auto", "d2h",
                           median_seconds(lambda: speedtorch.scatter_(half, idx_gpu, half_src), args.reps))
                    with speedtorch.transfer_config_override(uva_fraction=1.0):
                        record(threads, locality, name, "speedtorch uva=1.00", "h2d",
                               median_seconds(lambda: speedtorch.gather(half, idx_gpu), args.reps))
                        record(threads, locality, name, "speedtorch uva=1.00", "d2h",
                               median_seconds(lambda: speedtorch.scatter_(half, idx_gpu, half_src), args.reps))
        torch.cuda.synchronize()
    measure_limit()
    del seed
    if args.step:
        del emb, table
        step_benchmark(args, results)
    results.extend({"what": f"speedtorch auto vs {seed_speedtorch.LABEL}, {r['dir']}, {r['threads']} threads "
                            f"(times faster)", "value": r["speedup"]} for r in seed_ratios)
    return results, limits_seen


def auto_checks(rows: list[dict]) -> list[dict]:
    """`auto` against UVA alone in the same run: the in-turns pairs, then every other `auto` row against the
    UVA-alone row of its thread count, rows, dtype and direction. One dict per comparison, `ok` False when `auto`'s
    median is more than AUTO_TOLERANCE slower."""
    checks = []
    uva = {(r["threads"], r["rows"], r["dtype"], r["dir"], r["way"] == UVA_IN_TURNS): r for r in rows
           if r.get("way") in ("speedtorch uva=1.00", UVA_IN_TURNS)}
    for r in rows:
        way = r.get("way", "")
        if not way.startswith("speedtorch auto") or "CPU indices" in way:  # no UVA-alone row with CPU indices
            continue
        in_turns = way == AUTO_IN_TURNS
        base = uva.get((r["threads"], r["rows"], r["dtype"], r["dir"], in_turns))
        if base is None:
            continue
        ratio = r["ms"] / base["ms"]
        checks.append({"threads": r["threads"], "rows": r["rows"], "dtype": r["dtype"], "dir": r["dir"], "way": way,
                       "auto ms": r["ms"], "uva ms": base["ms"], "auto / uva time": ratio,
                       "ok": ratio <= AUTO_TOLERANCE})
    return checks


def print_checks(checks: list[dict]) -> None:
    for c in checks:
        print(f"check auto <= UVA alone: {c['threads']:2d} threads, {c['rows']}, {c['dtype']}, {c['dir']}, "
              f"{c['way']}: {c['auto ms']:.3f} ms vs {c['uva ms']:.3f} ms ({c['auto / uva time']:.3f}x) "
              f"{'ok' if c['ok'] else 'FAIL'}")
    failed = sum(not c["ok"] for c in checks)
    print(f"check auto <= UVA alone: {len(checks) - failed} ok, {failed} FAIL (tolerance {AUTO_TOLERANCE:.2f}x)",
          flush=True)


def print_calibrations() -> list[dict]:
    """The split each kind of call measured, the share in force (the guard's) and its window of recent calls."""
    calibrations = speedtorch.transfer_calibrations()
    for c in calibrations:
        k = c["key"]
        tried = ", ".join(f"{share:.2f}: {ms:.2f}" for share, ms in c["tried"].items())
        recent = ", ".join(f"{ms:.2f}" for ms in c["recent_ms"])
        print(f"split of {k['direction']}, {'CPU' if k['host_indices'] else 'GPU'} indices, {k['threads']} threads, "
              f"rows 2^{k['rows_log2']} of {k['row_bytes']} B: measured {c['calibrated_share']:.2f}, in force "
              f"{c['uva_share']:.2f}; tried (UVA share: ms) {tried}; recent calls (ms) [{recent}]")
    return calibrations


def duplex_seconds(nbytes: int, reps: int) -> tuple[float, float, float]:
    """Pinned memcpy of `nbytes` host->GPU alone, GPU->host alone, and both at once on two streams."""
    n = nbytes // 4
    host_in, host_out = torch.empty(n, pin_memory=True).uniform_(), torch.empty(n, pin_memory=True)
    dev_in, dev_out = torch.empty(n, device="cuda"), torch.randn(n, device="cuda")
    down, up = torch.cuda.Stream(), torch.cuda.Stream()

    def both():
        down.wait_stream(torch.cuda.current_stream())
        up.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(down):
            dev_in.copy_(host_in, non_blocking=True)
        with torch.cuda.stream(up):
            host_out.copy_(dev_out, non_blocking=True)
        torch.cuda.current_stream().wait_stream(down)
        torch.cuda.current_stream().wait_stream(up)

    return (median_seconds(lambda: dev_in.copy_(host_in, non_blocking=True), reps),
            median_seconds(lambda: host_out.copy_(dev_out, non_blocking=True), reps), median_seconds(both, reps))


def step_benchmark(args, results: list[dict]) -> None:
    """The fused step on the batch's distinct rows of a `--rows` table, as a share of the duplex memcpy time of the
    bytes it reads and writes (row and state each way), at each thread count."""
    gen = torch.Generator().manual_seed(3)
    ids = torch.unique(torch.randperm(args.rows, generator=gen)[: args.batch]).cuda()
    grad = torch.randn(ids.numel(), args.dim, device="cuda")
    for kind, options in (("adam", {"lr": 1e-3}), ("rowwise_adagrad", {"lr": 0.01}),
                          ("sgd", {"lr": 0.01, "momentum": 0.9})):
        emb = speedtorch.PinnedEmbedding(args.rows, args.dim)
        emb.uniform_(-0.1, 0.1, 0)
        emb.set_optimizer(kind, options, True)
        record = (args.dim + emb.state().shape[1]) * 4
        h2d, d2h, both = duplex_seconds(ids.numel() * record, args.reps)
        for threads in args.threads:
            torch.set_num_threads(threads)
            seconds = median_seconds(lambda: emb.apply_gradients(ids, grad, True), args.reps)
            results.append({"threads": threads, "rows": "spread", "dtype": "float32", "way": f"fused step {kind}",
                            "dir": "both", "ms": seconds * 1e3, "GB/s": gbps(ids.numel() * record * 2, seconds),
                            "memcpy GB/s": gbps(ids.numel() * record * 2, both), "of memcpy": both / seconds})
        print(f"fused step {kind}: {record} bytes a row each way; memcpy of them {h2d * 1e3:.2f} ms host->GPU, "
              f"{d2h * 1e3:.2f} ms GPU->host, {both * 1e3:.2f} ms both at once (duplex)", flush=True)
        del emb


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--batch", type=int, default=131_072)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--threads", type=lambda s: [int(x) for x in s.split(",")], default=None,
                        help="CPU thread counts, comma-separated (default: all cores, then 2)")
    parser.add_argument("--fractions", type=lambda s: [float(x) for x in s.split(",")],
                        default=[-1.0, 0.0, 1.0, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8],
                        help="UVA shares to time; -1 is the automatic split")
    parser.add_argument("--local-bytes", type=int, default=512 << 20)
    parser.add_argument("--torch-pinned-rss", action="store_true", help="also measure torch's pinned allocator")
    parser.add_argument("--no-seed", dest="seed", action="store_false",
                        help=f"leave out {seed_speedtorch.LABEL} (bench/seed_speedtorch.py)")
    parser.add_argument("--rounds", type=int, default=5,
                        help=f"turns in which speedtorch and {seed_speedtorch.LABEL} are timed")
    parser.add_argument("--no-step", dest="step", action="store_false",
                        help="leave out the fused optimizer step (it needs ~16 GB of host RAM for Adam)")
    parser.add_argument("--quick", action="store_true",
                        help="issue 30 item 4's figures only: spread rows, the shares -1,1,0.9,0.8, the in-turns "
                             "check, no SpeedTorch 0.1.6 / CuPy / torch rows, no fused step; --reference on")
    parser.add_argument("--reference", action=argparse.BooleanOptionalAction, default=None,
                        help="run bench/uva_reference.py (CuPy) in this process afterwards (default: with --quick)")
    parser.add_argument("--json", type=Path, help="write all results here")
    args = parser.parse_args()
    if args.quick:
        if "--fractions" not in " ".join(sys.argv):
            args.fractions = [-1.0, 1.0, 0.9, 0.8]
        args.seed = args.step = False
    if args.reference is None:
        args.reference = args.quick
    threads_given = args.threads is not None
    if args.threads is None:
        args.threads = sorted({torch.get_num_threads(), 2}, reverse=True)

    if not torch.cuda.is_available():
        print("no GPU: the CPU path instead (bench/cpu_path.py)", flush=True)
        threads = args.threads if threads_given else [1, 2]
        return cpu_path.main(["--threads", ",".join(map(str, threads)), "--no-demo"]
                             + (["--json", str(args.json)] if args.json else []))

    results, limits = gpu_benchmark(args)
    rows = [r for r in results if "way" in r]
    print(format_table(rows, ["threads", "rows", "dtype", "way", "dir", "ms", "GB/s", "memcpy GB/s", "of memcpy"]))
    print("memcpy limits measured during the run (GB/s): "
          + ", ".join(f"{x['h2d']:.1f}/{x['d2h']:.1f}" for x in limits))
    for r in results:
        if "value" in r:
            print(f"{r['what']}: {r['value']:.3f}")
    for r in rows:
        if r["dir"] == "cpu":
            print(f"{r['way']}, {r['threads']} threads: {r['GB/s']:.1f} GB/s ({r['ms']:.3f} ms median, "
                  f"{r['max ms']:.3f} ms the slowest; load average {r['load']:.1f}, torch threads "
                  f"{r['torch threads']})")
    calibrations = print_calibrations()
    checks = auto_checks(rows)
    print_checks(checks)
    report = {"limits": limits, "results": results, "checks": checks, "calibrations": calibrations, "reference": []}
    if args.json:  # written now too: a failing reference below must not lose the run's figures
        args.json.write_text(json.dumps(report, indent=1))
    if args.reference:
        try:
            import uva_reference
            report["reference"] = uva_reference.run(args.threads)
        except ImportError as e:
            print(f"reference (bench/uva_reference.py): skipped ({e})", flush=True)
        except Exception:  # noqa: BLE001 - the yardstick's failure is reported, the run's figures stand
            traceback.print_exc()
            print("reference (bench/uva_reference.py): failed (above)", flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
