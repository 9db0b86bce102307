"""Reference figures for the row transfers, measured with small stand-alone kernels (CuPy): the yardstick that
bench/transfer.py runs in its own process (`--reference`), so its figures and speedtorch's come from one GPU call.

A copy, made importable, of the session probe ``shared/probes/uva_reference.py`` (shared/ is not carried to the GPU
machine); the kernels and the workload are the probe's, unchanged. It is a yardstick for the library's own kernels
and policy, not code to copy.

Workload: 131,072 random rows (about 130,200 unique) x 128 float32 of a 10M x 128 pinned table (5.12 GB), ids on the
GPU. Each figure is a share of a pinned memcpy measured in the same round. Round 0 is a warm-up (its memcpy figures
can be half the others). On an H100 PCIe Gen5 (2026-11-25), rounds 1-2:
  gather, sorted unique spread rows:  plain loads 0.62-0.63, __ldg/__ldcs/__ldlu loads 0.72-0.75
  gather, unsorted:                   0.33-0.35 whatever the load
  gather, sorted, rows within 0.5 GB: 0.90-0.94
  gather, streaming UVA kernel + CPU threads gathering a share into pinned staging (Python loop):
      16 threads, staged share 0.1-0.2: 0.80-0.84;  2 threads, share 0.1-0.2: 0.83-0.89
  scatter, sorted unique spread rows: plain stores 0.62, streaming loads/stores (__ldcs/__stcs) 0.92 of D2H memcpy

    python bench/uva_reference.py                  # on the GPU machine (torch + cupy)
    python bench/uva_reference.py --threads 16,2 --rounds 2
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

N, D = 10_000_000, 128
ROW = D * 4

SRC = r'''
#define LOOP(BODY) int lane = threadIdx.x & 31, warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5; \
  int nw = (gridDim.x * blockDim.x) >> 5; for (int r = warp * 4; r < B; r += nw * 4) { float4 v[4]; BODY }
__device__ __forceinline__ float4 plain(const float4* p) { return *p; }
#define GATHER(NAME, LOAD) extern "C" __global__ void NAME(const float4* __restrict__ t, \
  const long long* __restrict__ idx, float4* __restrict__ o, int B) { LOOP( \
  _Pragma("unroll") for (int u = 0; u < 4; ++u) if (r + u < B) v[u] = LOAD(&t[idx[r + u] * 32 + lane]); \
  _Pragma("unroll") for (int u = 0; u < 4; ++u) if (r + u < B) o[(long long)(r + u) * 32 + lane] = v[u];) }
GATHER(gather_plain, plain)
GATHER(gather_ldg, __ldg)
GATHER(gather_ldcs, __ldcs)
extern "C" __global__ void scatter_plain(float4* __restrict__ t, const long long* __restrict__ idx,
                                         const float4* __restrict__ s, int B) { LOOP(
  _Pragma("unroll") for (int u = 0; u < 4; ++u) if (r + u < B) v[u] = s[(long long)(r + u) * 32 + lane];
  _Pragma("unroll") for (int u = 0; u < 4; ++u) if (r + u < B) t[idx[r + u] * 32 + lane] = v[u];) }
extern "C" __global__ void scatter_cs(float4* __restrict__ t, const long long* __restrict__ idx,
                                      const float4* __restrict__ s, int B) { LOOP(
  _Pragma("unroll") for (int u = 0; u < 4; ++u) if (r + u < B) v[u] = __ldcs(&s[(long long)(r + u) * 32 + lane]);
  _Pragma("unroll") for (int u = 0; u < 4; ++u) if (r + u < B) __stcs(&t[idx[r + u] * 32 + lane], v[u]);) }
'''


def t_ms(fn, reps=9):
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts)


def run(threads=(16, 2), rounds=3, shares=(0.0, 0.1, 0.2, 0.3, 0.4, 0.5)) -> list[dict]:
    """Prints the probe's lines and returns its figures as dicts (`what`, `threads`, `value`: share of memcpy)."""
    import cupy

    dev = torch.device("cuda")
    g = torch.Generator().manual_seed(0)
    host = torch.empty(N, D, pin_memory=True)
    host.uniform_()
    raw = torch.randint(0, N, (131072,), generator=g)
    ids_cpu = torch.unique(raw)
    B = ids_cpu.numel()
    ids_gpu = ids_cpu.to(dev)
    near = torch.unique(torch.randint(0, 1_000_000, (200000,), generator=g))[:B].to(dev)
    shuffled = ids_cpu[torch.randperm(B, generator=g)].to(dev)
    out = torch.empty(B, D, device=dev)
    stage = torch.empty(B, D, pin_memory=True)
    side = torch.cuda.Stream()
    mod = cupy.RawModule(code=SRC)
    k = {n: mod.get_function(n) for n in ("gather_plain", "gather_ldg", "gather_ldcs", "scatter_plain", "scatter_cs")}
    figures: list[dict] = []

    def launch(name, table, ids, rows, n):
        k[name]((1056,), (256,), (cupy.uint64(table.data_ptr()), cupy.uint64(ids.data_ptr()),
                                  cupy.uint64(rows.data_ptr()), cupy.int32(n)))

    h2 = torch.empty(B, D, pin_memory=True)
    d2 = torch.empty(B, D, device=dev)
    MB = B * ROW
    h2d = 1.0
    for rnd in range(rounds):
        h2d = MB / t_ms(lambda: d2.copy_(h2, non_blocking=True)) / 1e6
        d2h = MB / t_ms(lambda: h2.copy_(d2, non_blocking=True)) / 1e6
        print(f"--- reference round {rnd}: pinned memcpy H2D {h2d:.1f} GB/s, D2H {d2h:.1f} GB/s", flush=True)
        for lab, ii in (("sorted spread", ids_gpu), ("unsorted spread", shuffled), ("sorted within 0.5 GB", near)):
            cells = []
            for n in ("gather_plain", "gather_ldg", "gather_ldcs"):
                share = MB / t_ms(lambda: launch(n, host, ii, out, B)) / 1e6 / h2d
                cells.append(f"{n[7:]} {share:.2f}")
                if rnd == rounds - 1:
                    figures.append({"what": f"reference gather {n[7:]}, {lab}", "threads": 0, "value": share})
            print(f"  gather  {lab:22s} " + "  ".join(cells), flush=True)
        src = torch.randn(B, D, device=dev)
        cells = []
        for n in ("scatter_plain", "scatter_cs"):
            share = MB / t_ms(lambda: launch(n, host, ids_gpu, src, B)) / 1e6 / d2h
            cells.append(f"{n[8:]} {share:.2f}")
            if rnd == rounds - 1:
                figures.append({"what": f"reference scatter {n[8:]}, sorted spread", "threads": 0, "value": share})
        print(f"  scatter {'sorted spread':22s} " + "  ".join(cells), flush=True)

    def uva(lo, hi):
        if hi > lo:
            with cupy.cuda.ExternalStream(side.cuda_stream):
                launch("gather_ldcs", host, ids_gpu[lo:], out[lo:], hi - lo)

    def staged(lo, hi, chunk=16384):
        for a in range(lo, hi, chunk):
            b = min(a + chunk, hi)
            torch.index_select(host, 0, ids_cpu[a:b], out=stage[a:b])
            out[a:b].copy_(stage[a:b], non_blocking=True)

    before = torch.get_num_threads()
    for n_threads in threads:
        torch.set_num_threads(n_threads)
        cells = []
        for share in shares:
            kk = int(B * share)

            def both():
                side.wait_stream(torch.cuda.current_stream())
                uva(kk, B)
                staged(0, kk)
                torch.cuda.current_stream().wait_stream(side)

            value = MB / t_ms(both) / 1e6 / h2d
            cells.append(f"{share:.1f}: {value:.2f}")
            figures.append({"what": f"reference split, staged share {share:.1f}", "threads": n_threads,
                            "value": value})
        print(f"  split, {n_threads:2d} CPU threads, staged share -> share of memcpy: " + "  ".join(cells), flush=True)
    torch.set_num_threads(before)
    torch.cuda.synchronize()
    print("reference gather correct:", torch.equal(out.cpu(), host[ids_cpu]), flush=True)
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=lambda s: [int(x) for x in s.split(",")], default=[16, 2])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    run(args.threads, args.rounds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
