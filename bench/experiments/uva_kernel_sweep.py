"""Issue 23's measurements of the row kernels, in one process (run it beside ../shared/probes/uva_reference.py in
the same GPU call): which launch shape and which split reach the link, for gather, scatter_ and the fused step.

Workload: 131,072 random distinct rows (unsorted, as a data loader gives them) x 128 float32 of a 10M-row pinned
table (5.12 GB), indices on the GPU unless a row says otherwise. Every figure is a share of a pinned memcpy of the
same bytes measured in the same run (one direction; "duplex" is both directions at once on two streams, the fused
step's bound).

Sections (all by default; `--only a,b`):
  shape    UVA alone over the launch shapes (blocks per SM x rows in flight), gather and scatter_
  split    the UVA / staged split at 16 and 2 CPU threads, GPU and CPU indices, gather and scatter_
  local    rows within 0.5 GB; float16 / bfloat16 views of the same bytes
  step     the fused step (Adam, row-wise Adagrad, SGD), state beside each row, over launch shapes
  small    a 1,024-row lookup (bfloat16, 256-byte rows): eager, deferred checks, CUDA graph replay
  budget   a gather on a side stream under max_sms beside a bf16 matmul loop on the main stream

Settings the loaded library does not know (an older build) are skipped with a line saying so.

    SPEEDTORCH_LIBRARY=build/libspeedtorch_ops.so python bench/experiments/uva_kernel_sweep.py
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
import speedtorch  # noqa: E402

ROWS, DIM, BATCH = 10_000_000, 128, 131_072


def median_ms(fn, reps: int = 10, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def known(option: str) -> bool:
    return option in speedtorch.transfer_config()


def settings(**options):
    """transfer_config_override with only the options this build knows."""
    usable = {k: v for k, v in options.items() if known(k)}
    return speedtorch.transfer_config_override(**usable)


class Link:
    """Pinned memcpy of `nbytes` one way and both ways at once, re-measured on demand."""

    def __init__(self, nbytes: int):
        n = nbytes // 4
        self.nbytes = nbytes
        self.host_in = torch.empty(n, pin_memory=True).uniform_()
        self.host_out = torch.empty(n, pin_memory=True)
        self.dev_in = torch.empty(n, device="cuda")
        self.dev_out = torch.randn(n, device="cuda")
        self.down, self.up = torch.cuda.Stream(), torch.cuda.Stream()

    def measure(self) -> dict:
        def duplex():
            self.down.wait_stream(torch.cuda.current_stream())
            self.up.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(self.down):
                self.dev_in.copy_(self.host_in, non_blocking=True)
            with torch.cuda.stream(self.up):
                self.host_out.copy_(self.dev_out, non_blocking=True)
            torch.cuda.current_stream().wait_stream(self.down)
            torch.cuda.current_stream().wait_stream(self.up)

        h2d = median_ms(lambda: self.dev_in.copy_(self.host_in, non_blocking=True), 15)
        d2h = median_ms(lambda: self.host_out.copy_(self.dev_out, non_blocking=True), 15)
        both = median_ms(duplex, 15)
        return {"h2d_ms": h2d, "d2h_ms": d2h, "duplex_ms": both,
                "h2d_gbps": self.nbytes / h2d / 1e6, "d2h_gbps": self.nbytes / d2h / 1e6}


def section_shape(table, idx, src, link):
    lim = link.measure()
    print(f"\n[shape] UVA alone, spread rows; memcpy h2d {lim['h2d_gbps']:.1f} GB/s, d2h {lim['d2h_gbps']:.1f} GB/s")
    if not known("uva_rows_in_flight"):
        print("  (this build has no uva_rows_in_flight: blocks per SM only)")
    best = (0.0, None)
    for rows_in_flight in ((1, 2, 4, 8) if known("uva_rows_in_flight") else (None,)):
        cells = []
        for blocks in (1, 2, 4, 8):
            with settings(uva_fraction=1.0, uva_blocks_per_sm=blocks, uva_rows_in_flight=rows_in_flight or 4):
                g = lim["h2d_ms"] / median_ms(lambda: speedtorch.gather(table, idx))
                s = lim["d2h_ms"] / median_ms(lambda: speedtorch.scatter_(table, idx, src))
            cells.append(f"{blocks}/SM {g:.2f}/{s:.2f}")
            if g + s > best[0]:
                best = (g + s, (blocks, rows_in_flight))
        print(f"  rows in flight {rows_in_flight}: gather/scatter of memcpy: " + "  ".join(cells), flush=True)
    print(f"  best shape (blocks per SM, rows in flight): {best[1]}")
    blocks, rows_in_flight = best[1]
    if known("uva_sort_bucket_bytes"):
        cells = []
        best_bucket = (0.0, 2 << 20)
        for bucket in (2 << 20, 256 << 10, 32 << 10, 4 << 10, 1):
            with settings(uva_fraction=1.0, uva_blocks_per_sm=blocks, uva_rows_in_flight=rows_in_flight or 4,
                          uva_sort_bucket_bytes=bucket):
                g = lim["h2d_ms"] / median_ms(lambda: speedtorch.gather(table, idx))
                s = lim["d2h_ms"] / median_ms(lambda: speedtorch.scatter_(table, idx, src))
            cells.append(f"{bucket}: {g:.2f}/{s:.2f}")
            if g + s > best_bucket[0]:
                best_bucket = (g + s, bucket)
        print("  sort bucket bytes -> gather/scatter of memcpy: " + "  ".join(cells))
        speedtorch.set_transfer_config(uva_sort_bucket_bytes=best_bucket[1])
        print(f"  best sort bucket: {best_bucket[1]} (kept for the rest of the run)")
    # Where one call's time goes on the GPU: every kernel of a UVA gather and scatter_, against the memcpy.
    with settings(uva_fraction=1.0, uva_blocks_per_sm=blocks, uva_rows_in_flight=rows_in_flight or 4):
        acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=acts) as prof:
            for _ in range(5):
                speedtorch.gather(table, idx)
                speedtorch.scatter_(table, idx, src)
            torch.cuda.synchronize()
    for e in sorted(prof.key_averages(), key=lambda e: -e.self_device_time_total)[:12]:
        if e.self_device_time_total > 0:
            print(f"    {e.key[:70]:70s} {e.self_device_time_total / max(e.count, 1):9.1f} us x{e.count}")
    print(f"    (memcpy of the batch: {lim['h2d_ms'] * 1e3:.0f} us host->GPU, {lim['d2h_ms'] * 1e3:.0f} us GPU->host)")
    print("    host side of the same 5 gathers + 5 scatters, by self CPU time:")
    for e in sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:14]:
        print(f"    {e.key[:70]:70s} {e.self_cpu_time_total / max(e.count, 1):9.1f} us x{e.count}")
    return best[1]


def section_split(table, idx, idx_cpu, src, link, shape):
    blocks, rows_in_flight = shape
    lim = link.measure()
    print(f"\n[split] shape {shape}; memcpy h2d {lim['h2d_gbps']:.1f} GB/s, d2h {lim['d2h_gbps']:.1f} GB/s")
    for threads in (16, 2):
        torch.set_num_threads(threads)
        for label, ids, ways in (("GPU ids", idx, ("gather", "scatter")), ("CPU ids", idx_cpu, ("gather",))):
            for way in ways:
                cells = []
                for fraction in (-1.0, 1.0, 0.95, 0.9, 0.85, 0.8, 0.7, 0.6, 0.5, 0.0):
                    with settings(uva_fraction=fraction, uva_blocks_per_sm=blocks,
                                  uva_rows_in_flight=rows_in_flight or 4):
                        if way == "gather":
                            r = lim["h2d_ms"] / median_ms(lambda: speedtorch.gather(table, ids, "cuda"))
                        else:
                            r = lim["d2h_ms"] / median_ms(lambda: speedtorch.scatter_(table, ids, src))
                    cells.append(f"{'auto' if fraction < 0 else f'{fraction:.2f}'}:{r:.2f}")
                print(f"  {threads:2d} threads {label} {way:7s} uva share -> of memcpy: " + " ".join(cells),
                      flush=True)
    torch.set_num_threads(16)


def section_local(table, idx, src, link, shape):
    blocks, rows_in_flight = shape
    lim = link.measure()
    print(f"\n[local] shape {shape}")
    gen = torch.Generator().manual_seed(2)
    local = torch.randperm((512 << 20) // (DIM * 4), generator=gen)[:BATCH].cuda()
    with settings(uva_blocks_per_sm=blocks, uva_rows_in_flight=rows_in_flight or 4):
        for label, ids in (("within 0.5 GB", local),):
            g = lim["h2d_ms"] / median_ms(lambda: speedtorch.gather(table, ids))
            s = lim["d2h_ms"] / median_ms(lambda: speedtorch.scatter_(table, ids, src))
            print(f"  auto, {label}: gather {g:.2f}, scatter {s:.2f} of memcpy")
        for dtype in (torch.float16, torch.bfloat16):
            half, half_src = table.view(dtype), src.view(dtype)
            g = lim["h2d_ms"] / median_ms(lambda: speedtorch.gather(half, idx))
            s = lim["d2h_ms"] / median_ms(lambda: speedtorch.scatter_(half, idx, half_src))
            print(f"  auto, spread, {dtype} view (same bytes): gather {g:.2f}, scatter {s:.2f} of memcpy")


def section_step(idx, shape_hint):
    print("\n[step] fused step, 131,072 distinct rows x 128, state beside each row, UVA")
    grad = torch.randn(BATCH, DIM, device="cuda")
    for kind, options in (("adam", {"lr": 1e-3}), ("rowwise_adagrad", {"lr": 0.01}), ("sgd", {"lr": 0.01})):
        emb = speedtorch.PinnedEmbedding(ROWS, DIM)
        emb.uniform_(-0.1, 0.1, 0)
        emb.set_optimizer(kind, options, True)
        record = DIM * 4 + emb.state().shape[1] * 4
        link = Link(BATCH * record)
        lim = link.measure()
        ids = torch.unique(idx)
        cells = []
        for rows_in_flight in ((1, 2, 4) if known("uva_rows_in_flight") else (None,)):
            for blocks in (1, 2, 4):
                with settings(uva_fraction=-1.0, uva_blocks_per_sm=blocks, uva_rows_in_flight=rows_in_flight or 4):
                    ms = median_ms(lambda: emb.apply_gradients(ids, grad, True))
                cells.append(f"{blocks}/SM x{rows_in_flight}: {ms:.2f} ms {lim['duplex_ms'] / ms:.2f}")
        print(f"  {kind}: {record} bytes a row each way; memcpy one way {lim['h2d_ms']:.2f} ms, duplex "
              f"{lim['duplex_ms']:.2f} ms; step ms and share of duplex: " + ", ".join(cells), flush=True)
        acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=acts) as prof:
            for _ in range(3):
                emb.apply_gradients(ids, grad, True)
            torch.cuda.synchronize()
        for e in sorted(prof.key_averages(), key=lambda e: -e.self_device_time_total)[:4]:
            if e.self_device_time_total > 0:
                print(f"    {e.key[:70]:70s} {e.self_device_time_total / max(e.count, 1):9.1f} us x{e.count}")
        del emb, link


def section_small(link):
    print("\n[small] 1,024-row lookups, bfloat16 rows of 128 (256 bytes), 10M-row table")
    emb = speedtorch.PinnedEmbedding(ROWS, DIM, torch.bfloat16)
    emb.uniform_(-1.0, 1.0, 0)
    table = emb.table()
    ids = torch.randint(0, ROWS, (1024,), device="cuda")
    eager = median_ms(lambda: speedtorch.gather(table, ids), 200, 20)
    aminmax = median_ms(lambda: torch.aminmax(ids)[0].item(), 200, 20)
    with speedtorch.deferred_index_checks():
        deferred = median_ms(lambda: speedtorch.gather(table, ids), 200, 20)
        out = speedtorch.gather(table, ids)
        graph = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                out = speedtorch.gather(table, ids)
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(graph):
            out = speedtorch.gather(table, ids)
        replay = median_ms(graph.replay, 200, 20)
    speedtorch.check_index_errors()
    ok = torch.equal(out.cpu(), table[ids.cpu()])
    print(f"  eager {eager * 1e3:.1f} us (aminmax + item alone {aminmax * 1e3:.1f} us), deferred checks "
          f"{deferred * 1e3:.1f} us, CUDA graph replay {replay * 1e3:.1f} us; graph output correct: {ok}")
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(20):
            speedtorch.gather(table, ids)
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12, max_name_column_width=50))


def section_budget(table, idx):
    if not known("max_sms"):
        print("\n[budget] this build has no max_sms: skipped")
        return
    print("\n[budget] gather (side stream) beside 20 bf16 4096^3 matmuls (main stream)")
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    side = torch.cuda.Stream()

    def matmuls():
        for _ in range(20):
            torch.mm(a, b)

    def gathers():
        for _ in range(4):
            speedtorch.gather(table, idx)

    mm_alone = median_ms(matmuls, 5)
    for sms in (0, 8, 16, 33, 66):
        with settings(uva_fraction=1.0, max_sms=sms):
            g_alone = median_ms(gathers, 5)

            def both():
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    gathers()
                matmuls()
                torch.cuda.current_stream().wait_stream(side)

            together = median_ms(both, 5)
        print(f"  max_sms {sms:3d}: matmuls alone {mm_alone:.2f} ms, 4 gathers alone {g_alone:.2f} ms, together "
              f"{together:.2f} ms (sum {mm_alone + g_alone:.2f})", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="shape,split,local,step,small,budget")
    args = parser.parse_args()
    only = set(args.only.split(","))
    print(f"library {speedtorch.library_path()}; options {sorted(speedtorch.transfer_config())}")
    torch.set_num_threads(16)
    emb = speedtorch.PinnedEmbedding(ROWS, DIM)
    emb.uniform_(-1.0, 1.0, 0)
    table = emb.table()
    gen = torch.Generator().manual_seed(1)
    idx_cpu = torch.randperm(ROWS, generator=gen)[:BATCH]
    idx = idx_cpu.cuda()
    src = torch.randn(BATCH, DIM, device="cuda")
    link = Link(BATCH * DIM * 4)
    shape = (1, 4)
    if "shape" in only:
        shape = section_shape(table, idx, src, link)
    if "split" in only:
        section_split(table, idx, idx_cpu, src, link, shape)
    if "local" in only:
        section_local(table, idx, src, link, shape)
    if "budget" in only:
        section_budget(table, idx)
    got = speedtorch.gather(table, idx)
    print("\ngather correct:", torch.equal(got.cpu(), table[idx_cpu]))
    del emb, table
    if "step" in only:
        section_step(idx, shape)
    if "small" in only:
        section_small(link)
    return 0


if __name__ == "__main__":
    sys.exit(main())
