"""Tables that grow (issue 33; docs/dynamic_tables.md): what mapping raw int64 ids to rows costs.

CPU section (runs anywhere): a batch of power-law raw ids, 90% already in the table, mapped to slots by
speedtorch's IdIndex (find: lookup only; assign: with counts, recency, admission and eviction), beside a Python dict
and a torch-only remap (torch.unique of the batch, then searchsorted into the sorted known keys). Target: >= 10x.

GPU section (needs CUDA; for the GPU machine): the lookup of 65,536 raw ids (power law, 90% present) as mapping +
gather against the gather of the same rows with slot ids given (target >= 0.80), the rows per second against
HierarchicalKV's published host-tier rate for 256-byte values (0.069-0.12 billion/s on an A100; target >= 2x), and
one training step (forward, backward, fused row-wise Adagrad step) of a DynamicHostEmbedding against a fixed-range
HostEmbedding of the same rows (target <= 1.15x).

Memory section (--memory, runs anywhere): an IdIndex filled with --keys raw ids (10M by default; capacity = keys),
its resident bytes per key (RSS growth, and the index's own count of its allocations) beside the issue's target of
16 bytes a key (a key and its slot), and the insert rate.

Billion section (--billion, for the GPU machine: 128 GiB RAM, 16 cores): a DynamicHostEmbedding of --keys rows
(1e9 by default; dim 32, bfloat16, row-wise Adagrad) built by admitting --keys raw ids, then trained --steps steps
(batches of --batch power-law ids, 90% present, the next batch prefetched), printing RSS against the raw bytes (the
table's rows and state as laid out, and 16 bytes a key; target: RSS <= 1.15x) and the build rate. Test it small with
--keys 10000000.

    python bench/dynamic_table.py [--rows 1000000] [--batch 65536] [--dim 64] [--reps 10] [--cpu-only]
                                  [--threads N]
    python bench/dynamic_table.py --memory [--keys 10000000] [--policy lru]
    python bench/dynamic_table.py --billion [--keys 1000000000] [--steps 300]
"""

from __future__ import annotations

import argparse
import sys
import time
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


def resident_bytes() -> int:
    """The process's resident set (Linux: /proc/self/statm)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def peak_resident_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def distinct_raw_keys(n: int, seed: int, size: int = 1 << 18):
    """n distinct raw ids, in chunks (a multiplicative hash of 0..n-1: distinct, spread over the int64 range, no set
    of them held to check)."""
    odd = 0x9E3779B97F4A7C15 - 2**64  # an odd multiplier: a bijection of the 64-bit integers
    for start in range(0, n, size):
        yield (torch.arange(start, min(n, start + size), dtype=torch.int64) + seed) * odd  # wraps modulo 2^64


def memory_section(args) -> None:
    before = resident_bytes()
    index = IdIndex(args.keys, 1, args.policy, 0)
    index.advance_step()
    start = time.perf_counter()
    for chunk in distinct_raw_keys(args.keys, 1):
        index.assign(chunk)
    seconds = time.perf_counter() - start
    grown = resident_bytes() - before
    assert index.size() == args.keys
    rows = [{"what": "RSS growth", "bytes/key": grown / args.keys, "x target": grown / args.keys / 16},
            {"what": "IdIndex.memory_bytes()", "bytes/key": index.memory_bytes() / args.keys,
             "x target": index.memory_bytes() / args.keys / 16},
            {"what": "target (a key and its slot)", "bytes/key": 16.0, "x target": 1.0}]
    print(f"Memory: IdIndex of {args.keys:,} raw ids ({args.policy}, capacity = keys), built by assign in chunks of "
          f"262,144: {args.keys / seconds / 1e6:.2f}M inserts/s")
    print(format_table(rows, ["what", "bytes/key", "x target"]))
    print()


def billion_section(args) -> None:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dim, keys = 32, args.keys
    before = resident_bytes()
    start = time.perf_counter()
    emb = HostEmbedding(None, dim, capacity=keys, dtype=torch.bfloat16, optimizer="rowwise_adagrad",
                        optimizer_options={"lr": 0.05}, device=device, seed=0, init_std=0.01)
    emb.index.reserve(keys)  # room for every key now: the index never grows (and copies itself) while it fills
    allocated = time.perf_counter() - start
    table = emb.table.table()
    table_bytes = keys * table.stride(0) * table.element_size()  # rows and their optimizer state, as laid out
    raw_bytes = table_bytes + 16 * keys
    print(f"Billion: a DynamicHostEmbedding of {keys:,} rows x {dim} bfloat16, row-wise Adagrad, on {device}: "
          f"table {table_bytes / 2**30:.1f} GiB ({table.stride(0) * table.element_size()} B a row with its state), "
          f"allocated in {allocated:.1f} s")
    start = time.perf_counter()
    emb.index.advance_step()
    for chunk in distinct_raw_keys(keys, 1):
        emb.index.assign(chunk)  # admits every id of the chunk, into slots in order
    mapped = time.perf_counter() - start
    assert emb.index.size() == keys
    # The admitted rows, initialised in bulk (the module would draw them from its own generator at each admission,
    # a CPU randn of 32 billion values here; the GPU draws them, and they are copied into the pinned table). The
    # optimizer state of a new table is zero already.
    start = time.perf_counter()
    block = 1 << 22
    for begin in range(0, keys, block):
        end = min(keys, begin + block)
        table[begin:end] = (torch.randn(end - begin, dim, device=device) * emb.init_std).to(torch.bfloat16)
    initialised = time.perf_counter() - start
    after_build = resident_bytes()
    print(f"built: {keys:,} ids admitted in {mapped:.1f} s ({keys / mapped / 1e6:.2f}M ids/s, "
          f"{torch.get_num_threads()} threads), their rows initialised in {initialised:.1f} s")

    generator = torch.Generator().manual_seed(0)
    known = next(distinct_raw_keys(min(keys, 1 << 22), 1, 1 << 22))  # the first 4M keys, which the batches skew over

    def batch():
        ids = known[(torch.rand(args.batch, generator=generator) ** 3 * len(known)).long()]
        new = torch.rand(args.batch, generator=generator) >= 0.9
        ids[new] = torch.randint(-(2**62), 2**62, (int(new.sum()),), generator=generator)
        return ids.to(device)

    emb.index.advance_step()
    next_ids = batch()
    start = time.perf_counter()
    for step in range(args.steps):
        ids = next_ids
        out = emb(ids)
        if step + 1 < args.steps:
            next_ids = batch()
            emb.prefetch(next_ids)
        out.float().square().mean().backward()
        emb.step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    trained = time.perf_counter() - start
    rss = resident_bytes()
    rows = [{"what": "raw: table (rows + state) + 16 B a key", "GiB": raw_bytes / 2**30, "x raw": 1.0},
            {"what": "RSS growth after the build", "GiB": (after_build - before) / 2**30,
             "x raw": (after_build - before) / raw_bytes},
            {"what": f"RSS growth after {args.steps} steps", "GiB": (rss - before) / 2**30,
             "x raw": (rss - before) / raw_bytes},
            {"what": "peak RSS of the process", "GiB": peak_resident_bytes() / 2**30,
             "x raw": peak_resident_bytes() / raw_bytes},
            {"what": "IdIndex.memory_bytes()", "GiB": emb.index.memory_bytes() / 2**30,
             "x raw": emb.index.memory_bytes() / raw_bytes}]
    print(f"trained {args.steps} steps of {args.batch:,} ids (power law, 90% present, next batch prefetched) in "
          f"{trained:.1f} s ({trained / args.steps * 1e3:.1f} ms/step); index: {emb.index}")
    print(format_table(rows, ["what", "GiB", "x raw"]))
    print(f"RSS / raw: {(rss - before) / raw_bytes:.3f} (target <= 1.15); index {emb.index.memory_bytes() / keys:.1f} "
          f"B a key (target 16)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=positive_int, default=1_000_000, help="keys already in the table")
    parser.add_argument("--batch", type=positive_int, default=65_536)
    parser.add_argument("--dim", type=positive_int, default=64, help="row width (64 float32: 256-byte rows)")
    parser.add_argument("--reps", type=positive_int, default=10)
    parser.add_argument("--cpu-only", action="store_true", help="skip the GPU section")
    parser.add_argument("--memory", action="store_true", help="only the memory section: bytes a key of --keys ids")
    parser.add_argument("--billion", action="store_true",
                        help="only the billion section: build and train a table of --keys (default 1e9) ids")
    parser.add_argument("--keys", type=positive_int, default=None,
                        help="ids of --memory (default 10,000,000) or --billion (default 1,000,000,000)")
    parser.add_argument("--policy", choices=("lru", "lfu"), default="lru", help="--memory's eviction policy")
    parser.add_argument("--steps", type=positive_int, default=300, help="--billion's training steps")
    parser.add_argument("--threads", type=positive_int, default=None,
                        help="torch.set_num_threads for the run (default: torch's); on a loaded machine OpenMP's "
                        "joins make torch's CPU ops slower with more threads, so compare at 1 there too")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    print(f"speedtorch {speedtorch.__version__} ({speedtorch.build_info()}), torch {torch.__version__}\n")
    if args.memory:
        args.keys = args.keys or 10_000_000
        memory_section(args)
        return
    if args.billion:
        args.keys = args.keys or 1_000_000_000
        billion_section(args)
        return
    cpu_section(args, generator)
    if args.cpu_only:
        return
    if not torch.cuda.is_available():
        print("GPU section skipped: no CUDA device")
        return
    gpu_section(args, generator)


if __name__ == "__main__":
    main()
