"""Experiment: does the host page size behind a pinned table change the UVA gather rate for rows spread over a
large table (bench/BASELINES.md: 35% of the link at 10M x 128 float32, attributed to address translation)?

Backs the same table three ways, registers each with cudaHostRegister(Portable | Mapped), and times a UVA-only
speedtorch.gather of random rows (and of the same rows sorted): 4 KiB pages, transparent huge pages (madvise), and
explicit 2 MiB hugetlbfs pages (needs vm.nr_hugepages reserved; skipped otherwise).

    python bench/experiments/host_page_size_uva.py --rows 10000000
"""

from __future__ import annotations

import argparse
import ctypes
import mmap
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
import speedtorch  # noqa: E402
from speedtorch.cli.benchmarking import gbps, median_seconds  # noqa: E402

MAP_HUGETLB = 0x40000
CUDA_HOST_REGISTER_PORTABLE_MAPPED = 0x01 | 0x02


def anon_huge_kib() -> int:
    total = 0
    with open("/proc/self/smaps") as f:
        for line in f:
            if line.startswith("AnonHugePages:"):
                total += int(line.split()[1])
    return total


def make_table(rows: int, dim: int, kind: str):
    nbytes = rows * dim * 4
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
    if kind == "hugetlb":
        nbytes = (nbytes + (2 << 20) - 1) // (2 << 20) * (2 << 20)
        flags |= MAP_HUGETLB
    mm = mmap.mmap(-1, nbytes, flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    if kind == "thp":
        mm.madvise(mmap.MADV_HUGEPAGE)
    table = torch.frombuffer(mm, dtype=torch.float32, count=rows * dim).view(rows, dim)
    table.uniform_(-1, 1)  # touch every page before pinning
    ptr = ctypes.addressof(ctypes.c_char.from_buffer(mm))
    err = torch.cuda.cudart().cudaHostRegister(ptr, nbytes, CUDA_HOST_REGISTER_PORTABLE_MAPPED)
    if int(err) != 0:
        raise RuntimeError(f"cudaHostRegister failed: {err}")
    return mm, table, ptr


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--batch", type=int, default=131_072)
    args = parser.parse_args()
    torch.cuda.init()
    speedtorch.set_transfer_config(uva_fraction=1.0)
    idx = torch.randperm(args.rows)[: args.batch].cuda()
    idx_sorted = idx.sort().values
    nbytes = args.batch * args.dim * 4
    for kind in ("4k", "thp", "hugetlb"):
        before = anon_huge_kib()
        try:
            mm, table, ptr = make_table(args.rows, args.dim, kind)
        except (OSError, RuntimeError) as e:
            print(f"{kind:8s} unavailable: {e}")
            continue
        huge = (anon_huge_kib() - before) / 2**20
        assert table.is_pinned(), kind
        t = median_seconds(lambda: speedtorch.gather(table, idx), 10)
        ts = median_seconds(lambda: speedtorch.gather(table, idx_sorted), 10)
        ok = torch.equal(speedtorch.gather(table, idx).cpu(), table[idx.cpu()])
        print(f"{kind:8s} THP-backed {huge:6.2f} GiB  UVA gather {gbps(nbytes, t):5.1f} GB/s, sorted ids "
              f"{gbps(nbytes, ts):5.1f} GB/s, correct: {ok}", flush=True)
        torch.cuda.cudart().cudaHostUnregister(ptr)
        del table  # the mapping goes with the last reference
    return 0


if __name__ == "__main__":
    sys.exit(main())
