"""Fused optimizer step (Adam, 131,072 distinct random rows x 128 of a 10M-row pinned table, state beside each row)
under kernel variants, side by side in one process: the scalar kernel vs the vec4 kernel (transfer setting optimizer_vec4),
UVA blocks per SM, and UVA-only vs the engine's UVA + CPU split. Prints ms and the share of the PCIe bound."""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
import speedtorch  # noqa: E402
from speedtorch.cli.benchmarking import format_table, gbps, median_seconds  # noqa: E402


def main() -> int:
    rows_total, dim, batch = 10_000_000, 128, 131_072
    emb = speedtorch.PinnedEmbedding(rows_total, dim)
    emb.uniform_(-0.1, 0.1, 0)
    emb.set_optimizer("adam", {"lr": 1e-3}, True)
    rows = torch.randperm(rows_total)[:batch].cuda()
    grad = torch.randn(batch, dim, device="cuda")
    row_bytes = dim * 4 + emb.state().shape[1] * 4
    host = torch.empty(batch * row_bytes // 4, pin_memory=True)
    dev = torch.empty_like(host, device="cuda")
    h2d = gbps(host.numel() * 4, median_seconds(lambda: dev.copy_(host, non_blocking=True), 10))
    bound_ms = batch * row_bytes / (h2d * 1e9) * 1e3
    results = []
    for vec in ("0", "1"):
        for blocks in (1, 2, 4, 8):
            for uva_fraction in (-1.0, 1.0):
                speedtorch.set_transfer_config(optimizer_vec4=int(vec), uva_blocks_per_sm=blocks,
                                               uva_fraction=uva_fraction)
                ms = median_seconds(lambda: emb.apply_gradients(rows, grad), 10) * 1e3
                results.append({"kernel": "vec4" if vec == "1" else "scalar", "blocks/SM": blocks,
                                "split": "auto" if uva_fraction < 0 else "uva only", "ms": ms,
                                "of bound": bound_ms / ms})
                print(results[-1], flush=True)
    print(f"PCIe bound {bound_ms:.3f} ms ({row_bytes} bytes per row each way, memcpy {h2d:.1f} GB/s)")
    print(format_table(results, ["kernel", "blocks/SM", "split", "ms", "of bound"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
