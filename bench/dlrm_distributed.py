"""DLRM over many GPUs (issue 32), launched by torchrun: the 26 Criteo tables in a
speedtorch.distributed.DistributedHostEmbeddingBagCollection (one copy per host in shared memory, rows sharded over
hosts), the dense part under DistributedDataParallel, speedtorch.TrainPipeline on (each next batch's rows gathered
while the step computes), every rank its own synthetic Criteo batches (power-law ids).

One torchrun call measures one world size; rank 0 appends its record to ``--results`` (JSON lines) and prints the
table of every record there: samples/s (all ranks), per GPU, weak scaling per GPU against the one-GPU record of the
same configuration (target >= 0.90), the bytes each rank sends a step (per stage, and to other hosts), host RAM
against the tables' bytes (target <= 1.01x), and a model of weak scaling at 8 hosts x 8 GPUs from the measured
records (docs/distributed.md, "Past one host"):

    torchrun --nproc-per-node 1 bench/dlrm_distributed.py --results r.jsonl
    torchrun --nproc-per-node 2 bench/dlrm_distributed.py --results r.jsonl
    torchrun --nproc-per-node 4 bench/dlrm_distributed.py --results r.jsonl
    torchrun --nproc-per-node 4 bench/dlrm_distributed.py --results r.jsonl --hosts 2   # 2 simulated hosts x 2
    python bench/dlrm_distributed.py --report r.jsonl                                   # the table again
    torchrun --nproc-per-node 2 bench/dlrm_distributed.py --backend gloo --tiny         # CPU, a few seconds

``--hosts H`` simulates H hosts on one machine (LOCAL_WORLD_SIZE = world / H): each host has its own copy of its
rows, and rows of the other host travel through the collection's all_to_all stages over NCCL, as between machines.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent / "python"))
sys.path.insert(0, str(BENCH))

NIC_GBIT = 400.0  # per host, each way: the model's network (docs/distributed.md)
MODEL_HOSTS, MODEL_GPUS = 8, 8


def measure(args) -> dict:
    """This rank's part of one run (every rank of the torchrun job calls it); rank 0's return is the record."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from distributed import mapped_table_files  # bench/distributed.py: the shared files this process maps
    from speedtorch import TableConfig, TrainPipeline
    from speedtorch.distributed import DistributedHostEmbeddingBagCollection
    from speedtorch.models import DLRM, MLPERF_POOLING_FACTORS, DLRMTrain, criteo_rows, synthetic_batches

    dist.init_process_group(args.backend, timeout=datetime.timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    if world % args.hosts:
        raise SystemExit(f"--hosts {args.hosts} does not divide the world size {world}")
    local_world = world // args.hosts
    if args.backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
        torch.set_num_threads(args.threads)
    rows = criteo_rows(args.cap)
    start = time.perf_counter()
    tables = DistributedHostEmbeddingBagCollection(
        [TableConfig(f"t{i}", n, args.dim) for i, n in enumerate(rows)], optimizer=args.optimizer,
        optimizer_options={"lr": args.lr}, device=device, init_std=0.01, seed=0, local_world_size=local_world)
    init_s = time.perf_counter() - start
    torch.manual_seed(0)
    bottom, top = (args.bottom[:-1] + [args.dim]), args.top
    model = DLRMTrain(DLRM(tables, len(rows), args.dim, bottom=bottom, top=top, amp=device.type == "cuda"))
    model = model.to(device)
    ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    batches = synthetic_batches(rows, args.batch, args.batches, exponent=args.exponent, seed=1000 + rank,
                                pin_memory=device.type == "cuda",
                                pooling_factors=MLPERF_POOLING_FACTORS if args.multi_hot else None)
    pipeline = TrainPipeline(ddp, torch.optim.Adagrad(ddp.parameters(), lr=args.lr), itertools.cycle(batches),
                             device=device, prefetch=True)  # timed from the first steps: no trial among them
    control = tables.groups[0].table.control_group  # Gloo, every rank
    sharding = tables.sharding
    for _ in range(args.warmup):
        loss = pipeline.progress()[0]
    if device.type == "cuda":
        torch.cuda.synchronize()
    dist.barrier(group=control)
    sent0, stage0, other0 = sharding.bytes_sent, dict(sharding.bytes_by_stage), sharding.bytes_to_other_hosts
    start = time.perf_counter()
    for _ in range(args.steps):
        loss = pipeline.progress()[0]
    if device.type == "cuda":
        torch.cuda.synchronize()
    dist.barrier(group=control)  # the slowest rank's time
    seconds = (time.perf_counter() - start) / args.steps
    mine = {"ms_per_step": seconds * 1e3, "bytes_sent": (sharding.bytes_sent - sent0) / args.steps,
            "bytes_to_other_hosts": (sharding.bytes_to_other_hosts - other0) / args.steps,
            "by_stage": {k: (v - stage0[k]) / args.steps for k, v in sharding.bytes_by_stage.items()},
            "files": mapped_table_files(), "loss": float(loss.detach()),
            "table_bytes": sum(g.table.table().nbytes + g.table.state().nbytes for g in tables.groups)}
    everyone = [None] * world
    dist.all_gather_object(everyone, mine, group=control)
    dist.barrier(group=control)
    dist.destroy_process_group()
    if rank != 0:
        return {}
    host_files: dict = {}
    for r in range(local_world):  # host 0's ranks: its RAM holds each distinct file once
        for key, resident in everyone[r]["files"].items():
            host_files[key] = max(host_files.get(key, 0), resident)
    ms = max(e["ms_per_step"] for e in everyone)
    return {
        "config": {"backend": args.backend, "cap": args.cap, "dim": args.dim, "batch": args.batch,
                   "optimizer": args.optimizer, "multi_hot": args.multi_hot, "exponent": args.exponent},
        "world": world, "hosts": args.hosts, "ms_per_step": ms, "samples_per_s": args.batch * world / ms * 1e3,
        "bytes_sent_per_rank_step": [e["bytes_sent"] for e in everyone],
        "bytes_to_other_hosts_per_rank_step": [e["bytes_to_other_hosts"] for e in everyone],
        "bytes_by_stage_rank0": everyone[0]["by_stage"],
        "host_ram_ratio": sum(host_files.values()) / everyone[0]["table_bytes"],
        "table_gb_per_host": everyone[0]["table_bytes"] / 1e9, "init_s": init_s,
        "loss": everyone[0]["loss"],
    }


def report(records: list[dict]) -> dict:
    """The table of ``records`` (weak scaling against the one-GPU record of the same configuration) and the model of
    8 hosts x 8 GPUs; returns what it printed, as a dict."""
    out = {"runs": [], "model": None}
    for config in {json.dumps(r["config"], sort_keys=True) for r in records}:
        runs = [r for r in records if json.dumps(r["config"], sort_keys=True) == config]
        one = next((r for r in runs if r["world"] == 1), None)
        print(f"\nDLRM, {json.loads(config)}")
        print(f"{'GPUs':>5} {'hosts':>5} {'ms/step':>8} {'samples/s':>12} {'/GPU':>11} {'weak scaling':>12} "
              f"{'MB sent/rank/step':>17} {'to other hosts':>14} {'host RAM / tables':>17}")
        for r in sorted(runs, key=lambda r: (r["world"], r["hosts"])):
            per_gpu = r["samples_per_s"] / r["world"]
            weak = per_gpu / one["samples_per_s"] if one else None
            row = dict(r, per_gpu=per_gpu, weak_scaling=weak)
            out["runs"].append(row)
            print(f"{r['world']:>5} {r['hosts']:>5} {r['ms_per_step']:>8.2f} {r['samples_per_s']:>12,.0f} "
                  f"{per_gpu:>11,.0f} {'' if weak is None else f'{weak:.3f}':>12} "
                  f"{max(r['bytes_sent_per_rank_step']) / 1e6:>17.2f} "
                  f"{max(r['bytes_to_other_hosts_per_rank_step']) / 1e6:>14.2f} {r['host_ram_ratio']:>17.3f}")
            print(f"{'':>11} bytes by stage (rank 0): " + ", ".join(
                f"{k} {v / 1e6:.3f} MB" for k, v in r["bytes_by_stage_rank0"].items()))
        model = scaling_model(runs)
        if model is not None:
            out["model"] = model
            print(f"\nModel, {MODEL_HOSTS} hosts x {MODEL_GPUS} GPUs at {NIC_GBIT:.0f} Gb/s per host: step = "
                  f"{model['one_host_ms']:.2f} ms (measured, {model['one_host_world']} GPUs of one host) + "
                  f"{model['network_ms']:.2f} ms (each GPU sends {model['cross_mb_per_gpu']:.2f} MB to other hosts a "
                  f"step: {model['measured_cross_mb']:.2f} MB measured at {model['measured_hosts']} hosts, scaled "
                  f"by the share of rows on other hosts, {MODEL_GPUS} GPUs sharing the NIC, no overlap) -> weak "
                  f"scaling {model['weak_scaling']:.3f} per GPU ({model['samples_per_s']:,.0f} samples/s)")
    return out


def scaling_model(runs: list[dict]):
    """Weak scaling at MODEL_HOSTS x MODEL_GPUS from measured runs: the one-GPU step, the step of the largest
    one-host run (the host's own costs: RAM, PCIe, the fence), and the bytes a rank sent to other hosts in the
    largest several-host run, scaled from that run's share of rows on other hosts ((H-1)/H) to the model's, all
    MODEL_GPUS GPUs of a host sending through one NIC of NIC_GBIT each way, with no overlap with compute."""
    one = next((r for r in runs if r["world"] == 1), None)
    hosts1 = [r for r in runs if r["hosts"] == 1]
    several = [r for r in runs if r["hosts"] > 1]
    if one is None or not hosts1 or not several:
        return None
    host = max(hosts1, key=lambda r: r["world"])
    far = max(several, key=lambda r: (r["hosts"], r["world"]))
    measured = max(far["bytes_to_other_hosts_per_rank_step"])
    share = lambda h: (h - 1) / h  # noqa: E731 (the share of uniformly spread rows that are on other hosts)
    cross = measured * share(MODEL_HOSTS) / share(far["hosts"])
    network_ms = MODEL_GPUS * cross / (NIC_GBIT * 1e9 / 8) * 1e3
    step = host["ms_per_step"] + network_ms
    batch = host["samples_per_s"] * host["ms_per_step"] / 1e3 / host["world"]
    return {"one_host_ms": host["ms_per_step"], "one_host_world": host["world"], "network_ms": network_ms,
            "measured_cross_mb": measured / 1e6, "measured_hosts": far["hosts"], "cross_mb_per_gpu": cross / 1e6,
            "weak_scaling": one["ms_per_step"] / step,
            "samples_per_s": batch * MODEL_HOSTS * MODEL_GPUS / step * 1e3}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--backend", choices=("nccl", "gloo"),
                        default="nccl" if torch.cuda.is_available() else "gloo")
    parser.add_argument("--hosts", type=int, default=1, help="simulated hosts (LOCAL_WORLD_SIZE = world / hosts)")
    parser.add_argument("--tiny", action="store_true", help="a CPU-sized run (a smoke test: seconds)")
    parser.add_argument("--cap", type=int, default=None, help="rows a table at most (5M: 29.2M rows; tiny: 2,000)")
    parser.add_argument("--dim", type=int, default=None, help="(128; tiny: 8)")
    parser.add_argument("--batch", type=int, default=None, help="samples per GPU per step (65,536; tiny: 64)")
    parser.add_argument("--batches", type=int, default=6, help="distinct batches per rank, cycled")
    parser.add_argument("--exponent", type=float, default=1.1, help="power law of the ids")
    parser.add_argument("--multi-hot", action="store_true", help="MLPerf's DLRM-DCNv2 pooling factors (1-100 ids)")
    parser.add_argument("--optimizer", default="rowwise_adagrad")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--steps", type=int, default=None, help="timed steps (30; tiny: 3)")
    parser.add_argument("--warmup", type=int, default=None, help="(5; tiny: 1)")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads per rank with gloo")
    parser.add_argument("--timeout", type=float, default=300, help="the process group's timeout, seconds")
    parser.add_argument("--results", type=Path, default=None, help="JSON lines file the record is appended to")
    parser.add_argument("--report", type=Path, default=None, help="only print the table of this results file")
    args = parser.parse_args(argv)
    if args.report is not None:
        report([json.loads(line) for line in args.report.read_text().splitlines() if line.strip()])
        return 0
    tiny = args.tiny
    args.cap = args.cap or (2_000 if tiny else 5_000_000)
    args.dim = args.dim or (8 if tiny else 128)
    args.batch = args.batch or (64 if tiny else 65_536)
    args.steps = args.steps or (3 if tiny else 30)
    args.warmup = args.warmup or (1 if tiny else 5)
    args.bottom, args.top = ([32, 8], [32, 1]) if tiny else ([512, 256, 128], [1024, 1024, 512, 256, 1])
    record = measure(args)
    if not record:
        return 0
    records = [record]
    if args.results is not None:
        with args.results.open("a") as f:
            f.write(json.dumps(record) + "\n")
        records = [json.loads(line) for line in args.results.read_text().splitlines() if line.strip()]
    printed = report(records)
    print(json.dumps({"record": record, "report": printed}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
