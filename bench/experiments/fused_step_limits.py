"""What limits the fused optimizer step on host rows? One process, side by side:

- the link: pinned memcpy host->GPU alone, GPU->host alone, and both at once on two streams (the step reads and
  writes every row, so "both at once" is its real ceiling; the target is set against one direction's rate);
- the step (Adam, 131,072 distinct rows x 128, state beside each row, UVA only) over rows spread across the 10M-row
  table (15.5 GB), rows within its first 0.5 GB, and rows 0..131,071 (contiguous: no page translation to speak of);
- the state beside each row (the default) against the state in its own table, for the step and for the gather;
- the same step on a GPU-resident copy of the rows' table (no PCIe: the step's own fixed costs);
- a profile of the spread case: which kernels take the GPU's time.

If contiguous rows come close to the duplex ceiling and spread rows do not, the host-page translation is what is
left; if contiguous rows fall short too, the kernel or the link's read/write mix is.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
import speedtorch  # noqa: E402
from speedtorch.cli.benchmarking import format_table, gbps, median_seconds  # noqa: E402


def main() -> int:
    if not torch.cuda.is_available():
        print("needs a GPU")
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=10_000_000, help="rows of the pinned table")
    parser.add_argument("--no-profile", action="store_true")
    args = parser.parse_args()
    rows_total, dim, batch = args.rows, 128, 131_072
    emb = speedtorch.PinnedEmbedding(rows_total, dim)
    emb.uniform_(-0.1, 0.1, 0)
    emb.set_optimizer("adam", {"lr": 1e-3}, True)
    speedtorch.set_transfer_config(uva_fraction=1.0)
    row_bytes = dim * 4 + emb.state().shape[1] * 4
    nbytes = batch * row_bytes

    host_in = torch.empty(nbytes // 4, pin_memory=True)
    host_out = torch.empty(nbytes // 4, pin_memory=True)
    dev_in = torch.empty_like(host_in, device="cuda")
    dev_out = torch.randn_like(dev_in)
    down, up = torch.cuda.Stream(), torch.cuda.Stream()

    def duplex() -> None:
        with torch.cuda.stream(down):
            dev_in.copy_(host_in, non_blocking=True)
        with torch.cuda.stream(up):
            host_out.copy_(dev_out, non_blocking=True)

    h2d_s = median_seconds(lambda: dev_in.copy_(host_in, non_blocking=True), 20)
    d2h_s = median_seconds(lambda: host_out.copy_(dev_out, non_blocking=True), 20)
    duplex_s = median_seconds(duplex, 20)
    bound_ms = h2d_s * 1e3  # the target's bound: the row bytes at one direction's memcpy rate
    print(f"memcpy h2d {gbps(nbytes, h2d_s):.1f} GB/s, d2h {gbps(nbytes, d2h_s):.1f} GB/s, both at once "
          f"{gbps(nbytes, duplex_s):.1f} GB/s each way ({duplex_s * 1e3:.3f} ms for {nbytes >> 20} MiB each way)")

    local_rows = (512 << 20) // row_bytes
    cases = {
        f"spread ({rows_total * row_bytes / 1e9:.1f} GB)": torch.randperm(rows_total)[:batch],
        f"within 0.5 GB ({local_rows:,} rows)": torch.randperm(local_rows)[:batch],
        "contiguous rows": torch.arange(batch),
    }
    grad = torch.randn(batch, dim, device="cuda")
    results = []
    for name, rows in cases.items():
        rows = rows.cuda()
        ms = median_seconds(lambda: emb.apply_gradients(rows, grad), 20) * 1e3
        results.append({"rows": name, "ms": ms, "of bound": bound_ms / ms, "of duplex": duplex_s * 1e3 / ms})
        # The forward's gather of the same rows' weights (512 bytes of each 1,552-byte record), all over UVA too.
        gather_s = median_seconds(lambda: emb.gather(rows, "cuda"), 20)
        results[-1]["gather GB/s"] = gbps(batch * dim * 4, gather_s)
        results[-1]["gather of h2d"] = batch * dim * 4 / gather_s / (nbytes / h2d_s)

    # The other layout: the state in a table of its own (two places per row for the step, weights and state; the
    # weights packed 8 to a 4 KiB page for the gather instead of 2.6). Spread rows; the two layouts are timed in turn, round after round, so drifts of the link
    # fall on both alike.
    separate = speedtorch.PinnedEmbedding(rows_total, dim)
    separate.uniform_(-0.1, 0.1, 0)
    separate.set_optimizer("adam", {"lr": 1e-3}, False)
    rows = next(iter(cases.values())).cuda()
    layouts = {"state beside each row": emb, "state in its own table": separate}
    rounds = {(name, what): [] for name in layouts for what in ("step", "gather")}
    for _ in range(7):
        for name, table in layouts.items():
            rounds[(name, "step")].append(median_seconds(lambda: table.apply_gradients(rows, grad), 5))
            rounds[(name, "gather")].append(median_seconds(lambda: table.gather(rows, "cuda"), 5))
    layout_results = []
    for name in layouts:
        step_s = statistics.median(rounds[(name, "step")])
        gather_s = statistics.median(rounds[(name, "gather")])
        layout_results.append({"layout (spread rows)": name, "step ms": step_s * 1e3, "step of bound": h2d_s / step_s,
                               "gather ms": gather_s * 1e3, "gather GB/s": gbps(batch * dim * 4, gather_s)})
    del separate, layouts

    gpu_weights = torch.randn(batch, dim, device="cuda") * 0.1  # a table of the batch's size in GPU memory
    gpu_state = torch.zeros(batch, emb.state().shape[1], device="cuda")
    rows = torch.randperm(batch, device="cuda")
    ms = median_seconds(lambda: torch.ops.speedtorch.row_optimizer_step_(
        gpu_weights, gpu_state, rows, grad, "adam", {"lr": 1e-3}, 1), 20) * 1e3
    results.append({"rows": "GPU-resident table (no PCIe)", "ms": ms, "of bound": bound_ms / ms,
                    "of duplex": duplex_s * 1e3 / ms})

    print(f"PCIe bound {bound_ms:.3f} ms (one direction), duplex {duplex_s * 1e3:.3f} ms; {row_bytes} bytes per row "
          "each way")
    print(format_table(results, ["rows", "ms", "of bound", "of duplex", "gather GB/s", "gather of h2d"]))
    print(format_table(layout_results, list(layout_results[0])))
    if args.no_profile:
        return 0

    # Where a step's time goes: GPU kernels of the spread case, summed over 10 steps.
    rows = next(iter(cases.values())).cuda()
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(10):
            emb.apply_gradients(rows, grad)
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=60))
    return 0


if __name__ == "__main__":
    sys.exit(main())
