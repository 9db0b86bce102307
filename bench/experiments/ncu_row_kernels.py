"""A short program for Nsight Compute: the row kernels on issue 23's workload, each launched a few times after a
warm-up, all over UVA (no staged share, no calibration), so that `ncu -k regex:...` profiles exactly them.

    ncu --clock-control none -k regex:'row_(gather|scatter)_kernel|row_optimizer_vec4' --launch-skip 3 -c 3 \\
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats \\
        python bench/experiments/ncu_row_kernels.py
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
import speedtorch  # noqa: E402

ROWS, DIM, BATCH = 10_000_000, 128, 131_072


def main() -> int:
    speedtorch.set_transfer_config(uva_fraction=1.0)
    emb = speedtorch.PinnedEmbedding(ROWS, DIM)
    emb.uniform_(-0.1, 0.1, 0)
    emb.set_optimizer("adam", {"lr": 1e-3}, True)
    ids = torch.randperm(ROWS, generator=torch.Generator().manual_seed(1))[:BATCH].cuda()
    unique = torch.unique(ids)
    src = torch.randn(BATCH, DIM, device="cuda")
    grad = torch.randn(unique.numel(), DIM, device="cuda")
    for _ in range(3):  # the first round warms up (--launch-skip 3 -c 3 takes the second round: one of each kind)
        emb.gather(ids, "cuda")
        torch.ops.speedtorch.scatter_(emb.table(), ids, src)
        emb.apply_gradients(unique, grad, True)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
