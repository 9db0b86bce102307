"""Tables that grow (issue 33; docs/dynamic_tables.md): what mapping raw int64 ids to rows costs.

CPU section (runs anywhere): a batch of power-law raw ids, 90% already in the table, mapped to slots by
speedtorch's IdIndex (find: lookup only; assign: with counts, recency, admission and eviction), beside a Python dict
and a torch-only remap (torch.unique of the batch, then searchsorted into the sorted known keys). Target: >= 10x.

GPU section (needs CUDA; for the GPU machine): the lookup of 65,536 raw ids (power law, 90% present) as mapping +
gather against the gather of the same rows with slot ids given (target >= 0.80), the rows per second against
HierarchicalKV's published host-tier rate for 256-byte values (0.069-0.12 billion/s on an A100; target >= 2x), and
one training step (forward, backward, fused row-wise Adagrad step) of a DynamicHostEmbedding against a fixed-range
HostEmbedding of the same rows (target <= 1.15x).

    python bench/dynamic_table.py [--rows 1000000] [--batch 65536] [--dim 64] [--reps 10] [--cpu-only]
                                  [--threads N]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

import speedtorch  # noqa: E402
from speedtorch.cli.benchmarking import format_table, median_seconds, positive_int  # noqa: E402
from speedtorch.nn.dynamic_embedding import IdIndex  # noqa: E402
from speedtorch.nn import HostEmbedding  # noqa: E402

HKV_HOST_TIER_VALUES_PER_S = (0.069e9, 0.12e9)  # A100-80GB, 256-byte values, keys in HBM, values in HBM + host


def raw_keys(n: int, generator: torch.Generator) -> torch.Tensor:
    """n distinct raw ids spread over the int64 range (negative ones included), in random order."""
    keys = torch.unique(torch.randint(-(2**62), 2**62, (n + n // 8 + 16,), generator=generator))
    return keys[torch.randperm(len(keys), generator=generator)[:n]]


def power_law_batch(keys: torch.Tensor, batch: int, present: float, generator: torch.Generator) -> torch.Tensor:
    """A batch of ids: `present` of them drawn from `keys` with a power-law skew, the rest new raw ids."""
    ranks = (torch.rand(batch, generator=generator) ** 3 * len(keys)).long()
    ids = keys[ranks]
    new = torch.rand(batch, generator=generator) >= present
    ids[new] = torch.randint(-(2**62), 2**62, (int(new.sum()),), generator=generator)
    return ids


def filled_index(keys: torch.Tensor, capacity: int) -> IdIndex:
    index = IdIndex(capacity, 1, "lru", 0)
    index.advance_step()
    for chunk in keys.split(1 << 20):
        index.assign(chunk)
    index.advance_step()
    return index


def torch_remap(sorted_keys: torch.Tensor, slot_of_sorted: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The torch-only way: the batch's distinct ids, found by searchsorted in the sorted known keys."""
    unique, inverse = torch.unique(ids, return_inverse=True)
    at = torch.searchsorted(sorted_keys, unique).clamp(max=len(sorted_keys) - 1)
    slots = torch.where(sorted_keys[at] == unique, slot_of_sorted[at], -1)
    return slots[inverse]


def cpu_section(args, generator) -> None:
    keys = raw_keys(args.rows, generator)
    index = filled_index(keys, args.rows + args.batch * (args.reps + 8))
    table = {int(k): i for i, k in enumerate(index.keys().tolist())}
    known = index.keys()
    sorted_keys, order = torch.sort(known)
    slot_of_sorted = order  # slot i holds known[i]
    ids = power_law_batch(keys, args.batch, 0.9, generator)

    expected = index.find(ids)
    assert torch.equal(torch.tensor([table.get(k, -1) for k in ids.tolist()]), expected)
    assert torch.equal(torch_remap(sorted_keys, slot_of_sorted, ids), expected)

    fresh = [power_law_batch(keys, args.batch, 0.9, generator) for _ in range(args.reps + 3)]

    def assign():
        index.advance_step()
        index.assign(fresh.pop())

    times = {
        "IdIndex.find": median_seconds(lambda: index.find(ids), args.reps),
        "IdIndex.assign (admits the 10% new)": median_seconds(assign, args.reps),
        "Python dict": median_seconds(lambda: torch.tensor([table.get(k, -1) for k in ids.tolist()]), args.reps),
        "torch unique + searchsorted": median_seconds(lambda: torch_remap(sorted_keys, slot_of_sorted, ids),
                                                      args.reps),
    }
    base = times["IdIndex.find"]
    rows = [{"way": way, "ms": t * 1e3, "Mids/s": args.batch / t / 1e6, "x IdIndex.find's time": t / base}
            for way, t in times.items()]
    print(f"CPU: mapping {args.batch:,} power-law raw ids (90% present) against {args.rows:,} keys, "
          f"{torch.get_num_threads()} threads")
    print(format_table(rows, ["way", "ms", "Mids/s", "x IdIndex.find's time"]))
    print(f"IdIndex.find vs Python dict: {times['Python dict'] / base:.1f}x, vs torch unique remap: "
          f"{times['torch unique + searchsorted'] / base:.1f}x (target >= 10x)\n")


def gpu_section(args, generator) -> None:
    device = torch.device("cuda")
    keys = raw_keys(args.rows, generator)
    ids = power_law_batch(keys, args.batch, 0.9, generator)
    row_bytes = args.dim * 4

    # Lookup: the dynamic table's mapping + gather against the gather with slot ids given.
    dynamic = HostEmbedding(None, args.dim, capacity=args.rows, optimizer="rowwise_adagrad", device=device, seed=0)
    dynamic.index = filled_index(keys, args.rows)
    slots_given = dynamic.index.find(ids).clamp(min=0).to(device)
    cuda_ids = ids.to(device)
    table = dynamic.table
    gather_only = median_seconds(lambda: table.gather(slots_given, device), args.reps)
    with torch.no_grad():
        dynamic.eval()
        mapped = median_seconds(lambda: dynamic(cuda_ids), args.reps)
        dynamic.train()
    host_ids = ids.clone()
    mapped_host_ids = median_seconds(lambda: table.gather(dynamic.index.find(host_ids).clamp(min=0).to(device),
                                                          device), args.reps)
    rows = [
        {"way": "gather, slot ids given (fixed-range table)", "us": gather_only * 1e6, "ratio": 1.0},
        {"way": "DynamicHostEmbedding lookup, CUDA raw ids", "us": mapped * 1e6, "ratio": gather_only / mapped},
        {"way": "IdIndex.find of CPU ids + gather", "us": mapped_host_ids * 1e6,
         "ratio": gather_only / mapped_host_ids},
    ]
    print(f"GPU lookup: {args.batch:,} raw ids (power law, 90% present), {args.rows:,} rows x {args.dim} float32 "
          f"({row_bytes} B)")
    print(format_table(rows, ["way", "us", "ratio"]))
    rate = args.batch / mapped
    print(f"rows/s with mapping: {rate / 1e9:.3f} billion ({rate * row_bytes / 1e9:.1f} GB/s); HKV's host tier "
          f"(A100, 256 B): {HKV_HOST_TIER_VALUES_PER_S[0] / 1e9:.3f}-{HKV_HOST_TIER_VALUES_PER_S[1] / 1e9:.3f} "
          f"billion/s -> {rate / HKV_HOST_TIER_VALUES_PER_S[1]:.2f}x-{rate / HKV_HOST_TIER_VALUES_PER_S[0]:.2f}x "
          f"(target >= 0.80 of the gather, >= 2x HKV)\n")

    # Training step: the dynamic table against the fixed-range one (slot ids given), the same rows.
    fixed = HostEmbedding(args.rows, args.dim, optimizer="rowwise_adagrad", device=device, seed=0)
    batches = [power_law_batch(keys, args.batch, 0.9, generator) for _ in range(args.reps + 3)]
    fixed_batches = [dynamic.index.find(b).clamp(min=0).to(device) for b in batches]

    def stepper(module, inputs):
        turn = iter(range(10**9))

        def step():
            module(inputs[next(turn) % len(inputs)]).square().mean().backward()
            module.step()
        return step

    fixed_time = median_seconds(stepper(fixed, fixed_batches), args.reps)
    dynamic_time = median_seconds(stepper(dynamic, [b.to(device) for b in batches]), args.reps)
    rows = [{"table": "HostEmbedding, ids in [0, N)", "ms/step": fixed_time * 1e3, "x fixed": 1.0},
            {"table": "DynamicHostEmbedding, raw ids (admits 10% new)", "ms/step": dynamic_time * 1e3,
             "x fixed": dynamic_time / fixed_time}]
    print(f"GPU training step: batch {args.batch:,}, dim {args.dim}, row-wise Adagrad (target <= 1.15x)")
    print(format_table(rows, ["table", "ms/step", "x fixed"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=positive_int, default=1_000_000, help="keys already in the table")
    parser.add_argument("--batch", type=positive_int, default=65_536)
    parser.add_argument("--dim", type=positive_int, default=64, help="row width (64 float32: 256-byte rows)")
    parser.add_argument("--reps", type=positive_int, default=10)
    parser.add_argument("--cpu-only", action="store_true", help="skip the GPU section")
    parser.add_argument("--threads", type=positive_int, default=None,
                        help="torch.set_num_threads for the run (default: torch's); on a loaded machine OpenMP's "
                        "joins make torch's CPU ops slower with more threads, so compare at 1 there too")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    print(f"speedtorch {speedtorch.__version__} ({speedtorch.build_info()}), torch {torch.__version__}\n")
    cpu_section(args, generator)
    if args.cpu_only:
        return
    if not torch.cuda.is_available():
        print("GPU section skipped: no CUDA device")
        return
    gpu_section(args, generator)


if __name__ == "__main__":
    main()
