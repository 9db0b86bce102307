"""The distributed table on the recommender workload (bench/BASELINES.md) at several world sizes in one call: every
rank trains its own `--batch` Zipf(1.2) user ids per step against one `--rows` x `--dim` user table trained with Adam
(speedtorch.distributed.DistributedHostEmbedding: one copy per host in shared memory), dot product + BCE against a
per-rank item table (the dense part; not synchronized here, so that each world size does the same work per rank).

Per world size it prints steps/s per rank (median step after warm-up) and its ratio to world size 1 (weak scaling:
the target at 2 GPUs is >= 0.9x), host RAM taken by the table (the resident pages of the shared files the host's
ranks map, each file once, over the bytes of its rows + Adam state: target <= 1.01x whatever the number of ranks),
the bytes each rank sent per step, and the time each rank spent in collective calls per step.

    python bench/distributed.py                      # NCCL, one GPU per rank, the full workload (needs 2 GPUs)
    python bench/distributed.py --backend gloo       # Gloo on the CPU; small default sizes
    python bench/distributed.py --worlds 1,2 --hosts 2   # world 2 as two simulated hosts of one rank each
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))


def mapped_table_files() -> dict:
    """The shared table files this process maps (they are unlinked once mapped): (device, inode) -> resident bytes,
    from /proc/self/smaps. Ranks that map the same inode share its pages: the host holds one copy."""
    out, key = {}, None
    with open("/proc/self/smaps") as f:
        for line in f:
            fields = line.split()
            if "-" in fields[0] and len(fields) >= 5 and ":" in fields[3]:  # a mapping's header line
                path = " ".join(fields[5:])
                key = (fields[3], fields[4]) if "/speedtorch-" in path and ".npy" in path else None
            elif key is not None and fields[0] == "Rss:":
                out[key] = out.get(key, 0) + int(fields[1]) * 1024
    return out


def rank_main(rank: int, world: int, local_world: int, port: int, args, out_dir: str) -> None:
    import torch.distributed as dist
    import torch.nn.functional as F

    from speedtorch.distributed import DistributedHostEmbedding
    from speedtorch.models.recommender import zipf_batches

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_WORLD_SIZE=str(local_world))
    if args.backend == "nccl":
        torch.cuda.set_device(rank % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
        torch.set_num_threads(args.threads)
    dist.init_process_group(args.backend, rank=rank, world_size=world)
    control = dist.new_group(backend="gloo")
    users = DistributedHostEmbedding(args.rows, args.dim, optimizer="adam", optimizer_options={"lr": 1e-3},
                                     device=device, init_std=0.1, seed=0)
    items = torch.nn.Embedding(args.items, args.dim, sparse=True, device=device)
    item_opt = torch.optim.SparseAdam(items.parameters(), lr=1e-3)
    batches = zipf_batches(args.rows, args.batch, min(args.steps + args.warmup, 16), num_items=args.items,
                           seed=1000 + rank)

    def step(i):
        u, it, labels = batches[i % len(batches)]
        scores = (users(u) * items(it.to(device))).sum(-1)
        loss = F.binary_cross_entropy_with_logits(scores, labels.to(device))
        item_opt.zero_grad()
        loss.backward()
        users.step()
        item_opt.step()

    for i in range(args.warmup):
        step(i)
    sharding = users.table.sharding
    sent0, coll0 = sharding.bytes_sent, sharding.collective_seconds
    times = []
    for i in range(args.steps):
        dist.barrier(group=control)  # every rank starts the step together: the time is the slowest rank's
        start = time.perf_counter()
        step(args.warmup + i)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    dist.barrier(group=control)
    files = [None] * world  # every rank's mapped files: the host's RAM is each distinct file once
    dist.all_gather_object(files, mapped_table_files(), group=control)
    host_files = {}
    for ranks_files in files[:local_world]:  # host 0's ranks
        for key, resident in ranks_files.items():
            host_files[key] = max(host_files.get(key, 0), resident)
    table_bytes = args.rows * args.dim * 4 + users.table.state().shape[1] * args.rows * 4
    result = {
        "ms_per_step": statistics.median(times) * 1e3,
        "bytes_sent_per_step": (sharding.bytes_sent - sent0) / args.steps,
        "collective_ms_per_step": (sharding.collective_seconds - coll0) / args.steps * 1e3,
        # Host 0's copy over the bytes of the rows and state of the rows it holds.
        "host_ram_ratio": sum(host_files.values()) / (table_bytes * local_world / world),
        "files_per_host": len(host_files),
        "table_gb": table_bytes / 1e9,
    }
    torch.save(result, os.path.join(out_dir, f"{rank}.pt"))
    dist.barrier(group=control)
    dist.destroy_process_group()


def run_world(world: int, hosts: int, args) -> list[dict]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out_dir = tempfile.mkdtemp(prefix="speedtorch-bench-dist-")
    mp.spawn(rank_main, args=(world, world // hosts, port, args, out_dir), nprocs=world)
    return [torch.load(os.path.join(out_dir, f"{r}.pt")) for r in range(world)]


def main(argv=None) -> dict:
    gpus = torch.cuda.device_count()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--backend", choices=("nccl", "gloo"), default="nccl" if gpus >= 2 else "gloo",
                        help="nccl: one GPU per rank; gloo: ranks on the CPU (the default without 2 GPUs)")
    parser.add_argument("--worlds", default="1,2", help="world sizes, each run in turn in this call")
    parser.add_argument("--hosts", type=int, default=1, help="simulated hosts per world (LOCAL_WORLD_SIZE)")
    parser.add_argument("--rows", type=int, default=None, help="user rows (default 10M with NCCL, 200k with gloo)")
    parser.add_argument("--dim", type=int, default=None, help="row width (default 128 with NCCL, 32 with gloo)")
    parser.add_argument("--batch", type=int, default=None, help="ids per rank per step (65,536 / 4,096)")
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads per rank with gloo (default: the cores over the largest world size, so "
                             "every world size gets the same threads per rank)")
    args = parser.parse_args(argv)
    big = args.backend == "nccl"
    args.threads = args.threads or max(1, (os.cpu_count() or 1) // max(int(w) for w in args.worlds.split(",")))
    args.rows = args.rows or (10_000_000 if big else 200_000)
    args.dim = args.dim or (128 if big else 32)
    args.batch = args.batch or (65_536 if big else 4_096)
    if big and gpus < max(int(w) for w in args.worlds.split(",")):
        parser.error(f"--backend nccl needs a GPU per rank; this machine has {gpus}")

    report = {"backend": args.backend, "rows": args.rows, "dim": args.dim, "batch": args.batch, "worlds": {}}
    for world in (int(w) for w in args.worlds.split(",")):
        if world % args.hosts:
            parser.error(f"world size {world} is not a multiple of --hosts {args.hosts}")
        ranks = run_world(world, min(args.hosts, world), args)
        report["worlds"][world] = {
            "steps_per_s_per_rank": 1e3 / max(r["ms_per_step"] for r in ranks),
            "ms_per_step": [round(r["ms_per_step"], 3) for r in ranks],
            "mb_sent_per_rank_per_step": [round(r["bytes_sent_per_step"] / 1e6, 3) for r in ranks],
            "collective_ms_per_step": [round(r["collective_ms_per_step"], 3) for r in ranks],
            "host_ram_ratio": ranks[0]["host_ram_ratio"],
            "table_gb": ranks[0]["table_gb"],
        }
    base = report["worlds"][min(report["worlds"])]["steps_per_s_per_rank"]
    print(f"{'world':>5} {'steps/s/rank':>12} {'vs world 1':>10} {'host RAM':>9} {'MB sent/rank/step':>18} "
          f"{'collective ms/step':>19}")
    for world, w in report["worlds"].items():
        w["scaling"] = w["steps_per_s_per_rank"] / base
        print(f"{world:>5} {w['steps_per_s_per_rank']:>12.2f} {w['scaling']:>9.3f}x {w['host_ram_ratio']:>8.3f}x "
              f"{max(w['mb_sent_per_rank_per_step']):>18.3f} {max(w['collective_ms_per_step']):>19.3f}")
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    main()
