"""UVA kernel tuning sweep: resident blocks per SM x sorted/unsorted indices x row locality, both directions,
UVA path alone (no CPU threads), with the contiguous memcpy limit measured alongside.

Sorting the UVA share makes warps that run together touch nearby host pages; fewer resident blocks shrink that
window further (fewer pages in flight) while keeping enough bytes in flight for the link's latency.

    python bench/uva_tuning.py --rows 10000000
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
import speedtorch  # noqa: E402
from speedtorch.cli.benchmarking import format_table, gbps, median_seconds  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--batch", type=int, default=131_072)
    parser.add_argument("--blocks", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 4, 8])
    parser.add_argument("--reps", type=int, default=10)
    args = parser.parse_args()

    emb = speedtorch.PinnedEmbedding(args.rows, args.dim)
    emb.uniform_(-1.0, 1.0, 0)
    table = emb.table()
    nbytes = args.batch * args.dim * 4
    gen = torch.Generator().manual_seed(3)
    local_rows = min(args.rows, (512 << 20) // (args.dim * 4))
    index_sets = {
        "spread": torch.randperm(args.rows, generator=gen)[: args.batch].cuda(),
        "local": torch.randperm(local_rows, generator=gen)[: args.batch].cuda(),
    }
    src = torch.randn(args.batch, args.dim, device="cuda")
    host = torch.empty(args.batch, args.dim, pin_memory=True)
    out = torch.empty_like(src)
    limit = gbps(nbytes, median_seconds(lambda: out.copy_(host, non_blocking=True), args.reps))
    rows = []
    for locality, idx in index_sets.items():
        for sort in (1, 0):
            for blocks in args.blocks:
                with speedtorch.transfer_config_override(
                    uva_fraction=1.0, uva_reach_bytes=0, sort_uva_indices=sort, uva_blocks_per_sm=blocks
                ):
                    h2d = gbps(nbytes, median_seconds(lambda: speedtorch.gather(table, idx), args.reps))
                    d2h = gbps(nbytes, median_seconds(lambda: speedtorch.scatter_(table, idx, src), args.reps))
                rows.append({"rows": locality, "sorted": bool(sort), "blocks/SM": blocks, "h2d GB/s": h2d,
                             "h2d of memcpy": h2d / limit, "d2h GB/s": d2h, "d2h of memcpy": d2h / limit})
                print(rows[-1], flush=True)
    print(f"memcpy host->GPU {limit:.1f} GB/s")
    print(format_table(rows, list(rows[0].keys())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
