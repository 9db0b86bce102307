"""Do CUDA host functions (cudaLaunchHostFunc) of different streams run at the same time? Stream-ordered staging
(csrc/transfer/stream_ordered_staging.h) does its CPU copies in host functions: if the driver runs them one at a time,
a step's write-back and the next gather cannot overlap on the CPU however their streams are ordered.

Each of N streams gets a host function that sleeps S seconds (the GIL released); all done in ~S: concurrent, ~N*S:
one at a time.

    python bench/experiments/host_function_concurrency.py [--streams 4] [--sleep 0.2]
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import os
import time

import torch


def cudart() -> ctypes.CDLL:
    here = os.path.dirname(torch.__file__)
    patterns = ("../nvidia/cu13/lib/libcudart.so*", "../nvidia/cuda_runtime/lib/libcudart.so*", "lib/libcudart*.so*")
    for pattern in patterns:
        found = sorted(glob.glob(os.path.join(here, pattern)))
        if found:
            return ctypes.CDLL(found[0])
    return ctypes.CDLL("libcudart.so")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--sleep", type=float, default=0.2)
    args = parser.parse_args()
    torch.cuda.init()
    lib = cudart()
    callback_type = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
    seen = []

    def sleeper(_):
        seen.append(time.perf_counter())
        time.sleep(args.sleep)

    callback = callback_type(sleeper)
    lib.cudaLaunchHostFunc.argtypes = [ctypes.c_void_p, callback_type, ctypes.c_void_p]
    streams = [torch.cuda.Stream() for _ in range(args.streams)]
    torch.cuda.synchronize()
    start = time.perf_counter()
    for s in streams:
        assert lib.cudaLaunchHostFunc(ctypes.c_void_p(s.cuda_stream), callback, None) == 0
    torch.cuda.synchronize()
    total = time.perf_counter() - start
    starts = ", ".join(f"{t - start:.3f}" for t in sorted(seen))
    verdict = "concurrent" if total < 1.5 * args.sleep else "one at a time"
    print(f"{args.streams} streams x a host function sleeping {args.sleep} s: {total:.3f} s in all ({verdict}); "
          f"started at {starts} s")


if __name__ == "__main__":
    main()
