"""Tables that grow (issue 33; docs/dynamic_tables.md): what mapping raw int64 ids to rows costs.

CPU section (runs anywhere): a batch of power-law raw ids, 90% already in the table, mapped to slots by
speedtorch's IdIndex (find: lookup only; assign: with counts, recency, admission and eviction), beside a Python dict
and a torch-only remap (torch.unique of the batch, then searchsorted into the sorted known keys). Target: >= 10x.

Lookup section (needs CUDA; for the GPU machine): the lookup of 65,536 raw ids (power law, 90% present) as mapping +
gather against the gather of the same rows with slot ids given (target >= 0.80), and the rows per second against
HierarchicalKV's published host-tier rate for 256-byte values (0.069-0.12 billion/s on an A100; target >= 2x).

Training section (on the GPU if there is one, else the CPU with small sizes): bench/train.py's recommender step
(user table, item table, dot product, BCE) over a DynamicHostEmbedding of raw user ids (90% known, power law; 10%
new, admitted as they come) against the same step over a fixed-range HostEmbedding given the slots the growing table
assigns (the same rows), each as the plain loop and through speedtorch.TrainPipeline(prefetch=True) (batch t+1's
ids mapped and its rows read while step t computes): four ways trained in turns in one process, ratios dynamic /
fixed for each loop (target <= 1.15x). On a GPU also: the plain loop with the user ids left on the host, the fixed
table's pipeline with UVA row kernels and without prefetch, and both tables under TrainPipeline's default,
prefetch='auto' (its trial run first, untimed, on 27 batches of its own; its choice printed). With --trace-steps N, each way is then profiled for N steps: per stream busy and idle time, the
host's waits and the operators they wait in (bench/trace_summary.py), and the host operators that took most of a step.

Memory section (--memory, runs anywhere): an IdIndex filled with --keys raw ids (10M by default; capacity = keys),
its resident bytes per key (RSS growth, and the index's own count of its allocations) beside the issue's target of
16 bytes a key (a key and its slot), and the insert rate.

Billion section (--billion, for the GPU machine: 128 GiB RAM, 16 cores): a DynamicHostEmbedding of --keys rows
(1e9 by default; dim 32, bfloat16, row-wise Adagrad) built by admitting --keys raw ids, then trained --steps steps
(batches of --batch power-law ids, 90% present, the next batch prefetched), printing RSS against the raw bytes (the
table's rows and state as laid out, and 16 bytes a key; target: RSS <= 1.15x) and the build rate. Test it small with
--keys 10000000.

    python bench/dynamic_table.py [--rows 1000000] [--batch 65536] [--dim 64] [--reps 10] [--cpu-only]
                                  [--threads N] [--sections mapping,lookup,training]
    python bench/dynamic_table.py --sections training [--train-device cpu] [--train-rows N] [--train-batch N]
                                  [--train-capacity grow|full] [--rounds 7] [--turn 8] [--trace-steps 3]
    python bench/dynamic_table.py --memory [--keys 10000000] [--policy lru]
    python bench/dynamic_table.py --billion [--keys 1000000000] [--steps 300]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import speedtorch  # noqa: E402
from speedtorch.cli.benchmarking import format_table, median_seconds, positive_int  # noqa: E402
from speedtorch.nn.dynamic_embedding import IdIndex  # noqa: E402
from speedtorch.nn import HostEmbedding  # noqa: E402
from speedtorch.pipeline import move_batch, prefetch_trial_steps  # noqa: E402
from trace_summary import format_summary, profile_trace, summarize_trace  # noqa: E402 (bench/trace_summary.py)

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

    # The same keys in a map of twice the buckets (load about 0.45, as after the map doubles; the bench's index is at
    # 0.9, the most it holds): robin_set's probes compare about 1.5 keys instead of 5.
    roomy = IdIndex.from_state(index.state())
    roomy.reserve(min(2 * args.rows, roomy.capacity()))

    expected = index.find(ids)
    assert torch.equal(roomy.find(ids), expected)
    assert torch.equal(torch.tensor([table.get(k, -1) for k in ids.tolist()]), expected)
    assert torch.equal(torch_remap(sorted_keys, slot_of_sorted, ids), expected)

    fresh = [power_law_batch(keys, args.batch, 0.9, generator) for _ in range(args.reps + 3)]
    # Timing one batch again and again finds its keys in cache from the second call on; training maps a new batch
    # each step, so the new-batch rows time each call on a batch of its own.
    others = itertools.cycle([power_law_batch(keys, args.batch, 0.9, generator) for _ in range(args.reps + 3)])

    def assign():
        index.advance_step()
        index.assign(fresh.pop())

    times = {
        "IdIndex.find": median_seconds(lambda: index.find(ids), args.reps),
        "IdIndex.find, map at load 0.45": median_seconds(lambda: roomy.find(ids), args.reps),
        "IdIndex.find, a new batch each call": median_seconds(lambda: index.find(next(others)), args.reps),
        "IdIndex.assign (admits the 10% new)": median_seconds(assign, args.reps),
        "Python dict": median_seconds(lambda: torch.tensor([table.get(k, -1) for k in ids.tolist()]), args.reps),
        "torch unique + searchsorted": median_seconds(lambda: torch_remap(sorted_keys, slot_of_sorted, ids),
                                                      args.reps),
        "torch unique + searchsorted, a new batch each call": median_seconds(
            lambda: torch_remap(sorted_keys, slot_of_sorted, next(others)), args.reps),
    }
    base = times["IdIndex.find"]
    rows = [{"way": way, "ms": t * 1e3, "Mids/s": args.batch / t / 1e6, "x IdIndex.find's time": t / base}
            for way, t in times.items()]
    print(f"CPU: mapping {args.batch:,} power-law raw ids (90% present) against {args.rows:,} keys, "
          f"{torch.get_num_threads()} threads")
    print(format_table(rows, ["way", "ms", "Mids/s", "x IdIndex.find's time"]))
    new = "a new batch each call"
    print(f"IdIndex.find vs Python dict: {times['Python dict'] / base:.1f}x, vs torch unique remap: "
          f"{times['torch unique + searchsorted'] / base:.1f}x the same batch again, "
          f"{times['torch unique + searchsorted, ' + new] / times['IdIndex.find, ' + new]:.1f}x {new} "
          f"(target >= 10x)\n")


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


# --- training: the recommender step over a growing table against a fixed-range one, plain and pipelined ----------


class RawUserRecommender(torch.nn.Module):
    """bench/train.py's recommender (speedtorch.models.recommender, its ``speedtorch_both_tables`` way): a user table,
    an item table (a HostEmbedding in GPU memory, or host RAM on the CPU, fused Adam), a dot product and binary
    cross-entropy. ``users`` is a fixed-range HostEmbedding (ids in [0, N)) or a DynamicHostEmbedding (raw ids);
    ``forward(batch)`` returns the loss, and ``sparse_inputs`` names the user table's input, as
    speedtorch.TrainPipeline wants."""

    def __init__(self, users: HostEmbedding, num_items: int, device: torch.device):
        super().__init__()
        self.users = users
        self.items = HostEmbedding(num_items, users.embedding_dim, optimizer="adam", optimizer_options={"lr": 0.01},
                                   init_std=0.1, seed=1, device=device,
                                   placement="gpu" if device.type == "cuda" else "host")

    def forward(self, batch):
        users, items, labels = batch
        scores = (self.users(users) * self.items(items)).sum(-1)
        return torch.nn.functional.binary_cross_entropy_with_logits(scores, labels)

    def sparse_inputs(self, batch) -> list:
        return [(self.users, batch[0])]


class PlainLoop:
    """The loop a user writes (TrainPipeline's docstring): batch to the device, forward, backward, the tables'
    steps. One call of step() per batch of ``batches``, in order."""

    def __init__(self, model: RawUserRecommender, batches: list, device: torch.device, host_ids: bool = False):
        self.model, self.device, self.host_ids = model, device, host_ids
        self._batches = iter(batches)

    def step(self):
        batch = next(self._batches)
        # host_ids: the user ids stay on the host, where a growing table maps them (no copy back from the GPU)
        batch = (batch[0],) + move_batch(batch[1:], self.device, non_blocking=True) if self.host_ids else \
            move_batch(batch, self.device, non_blocking=True)
        loss = self.model(batch)
        loss.backward()
        self.model.users.step()
        self.model.items.step()
        return loss


class PipelinedLoop:
    """The same step through speedtorch.TrainPipeline (prefetch=True unless given): batch t+1's ids mapped (a dynamic
    table) and its rows read while step t computes."""

    def __init__(self, model: RawUserRecommender, batches: list, device: torch.device, **pipeline_args):
        pipeline_args.setdefault("prefetch", True)  # "auto" (the default) is timed as a way of its own
        self.pipeline = speedtorch.TrainPipeline(model, None, batches, device=device, **pipeline_args)

    def step(self):
        return self.pipeline.progress()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_in_turns(ways: dict, warmup: int, rounds: int, turn: int, device: torch.device) -> dict:
    """Median ms per step of each way: ``turn`` steps in a row per turn (as a user trains: no wait between steps, so
    a pipeline overlaps them), the ways taking turns for ``rounds`` rounds after ``warmup`` steps each; the machine's
    drift falls on every way alike."""
    for way in ways.values():
        for _ in range(warmup):
            way.step()
    times = {label: [] for label in ways}
    for _ in range(rounds):
        for label, way in ways.items():
            _sync(device)
            start = time.perf_counter()
            for _ in range(turn):
                way.step()
            _sync(device)
            times[label].append((time.perf_counter() - start) / turn)
    return {label: statistics.median(t) * 1e3 for label, t in times.items()}


def training_section(args, generator) -> None:
    """The recommender step (--train-batch raw user ids, 90% among --train-rows known ones with a power-law skew,
    10% new) over a DynamicHostEmbedding against the same step over a fixed-range HostEmbedding given the slots the
    growing table assigns (the same rows read and updated), each as a plain loop and through TrainPipeline; the four
    ways train in turns in one process. Target: dynamic <= 1.15x fixed."""
    device = torch.device(args.train_device)
    cuda = device.type == "cuda"
    rows = args.train_rows or (1_000_000 if cuda else 100_000)
    batch = args.train_batch or (65_536 if cuda else 4_096)
    steps = args.warmup + args.rounds * args.turn + args.trace_steps + 2  # + the two a pipeline stages ahead
    # The prefetch='auto' ways (on a GPU) run their trial first, on batches of their own.
    trial = prefetch_trial_steps(device) if cuda else 0
    total = steps + trial
    new_ids = int(batch * 0.1 * total * 1.2) + 64
    capacity = rows + new_ids if args.train_capacity == "grow" else rows  # "full": each new id evicts a row
    keys = raw_keys(rows, generator)
    index = filled_index(keys, capacity)
    user_batches = [power_law_batch(keys, batch, 0.9, generator) for _ in range(total)]
    # The fixed-range table's ids: the slots the growing table gives these batches, step by step (a replay on a
    # copy of its index), so both tables read and update the same rows.
    replay = IdIndex.from_state(index.state())
    slot_batches = []
    for ids in user_batches:
        replay.advance_step()
        slot_batches.append(replay.assign(ids)[0].clamp(min=0))
    items = [torch.randint(0, args.items, (batch,), generator=generator) for _ in range(total)]
    labels = [torch.randint(0, 2, (batch,), generator=generator).float() for _ in range(total)]

    def batches(user_ids):
        out = list(zip(user_ids, items, labels))
        return [tuple(t.pin_memory() for t in b) for b in out] if cuda else out

    options = {"optimizer": args.optimizer, "optimizer_options": {"lr": 0.01}, "device": device, "seed": 0}

    def model(dynamic: bool) -> RawUserRecommender:
        torch.manual_seed(0)
        if dynamic:
            users = HostEmbedding(None, args.dim, capacity=capacity, index=IdIndex.from_state(index.state()),
                                  **options)
        else:
            users = HostEmbedding(capacity, args.dim, **options)
        return RawUserRecommender(users, args.items, device)

    # The other ways take the first `steps` batches; an auto way all of them, in the same order (the slots replayed
    # for the fixed table are the growing one's in that order): its trial the first, its timed steps the next.
    fixed_all, raw_all = batches(slot_batches), batches(user_batches)
    fixed_batches, raw_batches = fixed_all[:steps], raw_all[:steps]
    ways = {
        "fixed, plain loop": PlainLoop(model(False), fixed_batches, device),
        "dynamic, plain loop": PlainLoop(model(True), raw_batches, device),
        "fixed, TrainPipeline": PipelinedLoop(model(False), fixed_batches, device),
        "dynamic, TrainPipeline": PipelinedLoop(model(True), raw_batches, device),
    }
    if device.type == "cuda":  # what the pipeline's parts cost on the fixed table: its UVA way, and no prefetch
        ways["dynamic, plain loop, user ids left on the host"] = PlainLoop(model(True), raw_batches, device,
                                                                           host_ids=True)
        ways["fixed, TrainPipeline, UVA row kernels (copy_engines=False)"] = PipelinedLoop(
            model(False), fixed_batches, device, copy_engines=False)
        ways["fixed, TrainPipeline, no prefetch"] = PipelinedLoop(model(False), fixed_batches, device, prefetch=False)
        ways["fixed, TrainPipeline, prefetch='auto'"] = PipelinedLoop(model(False), fixed_all, device, prefetch="auto")
        ways["dynamic, TrainPipeline, prefetch='auto'"] = PipelinedLoop(model(True), raw_all, device, prefetch="auto")
    autos = {label: way for label, way in ways.items() if "'auto'" in label}
    for way in autos.values():
        while way.pipeline.prefetch == "auto":  # its trial first, untimed
            way.step()
    ms = time_in_turns(ways, args.warmup, args.rounds, args.turn, device)
    for label, way in autos.items():
        print(f"{label}: kept prefetch={way.pipeline.prefetch} after its trial ({way.pipeline.prefetch_trial}; ms a "
              f"step with and without)")
    print(f"Training on {device} ({torch.get_num_threads()} threads): the recommender step, batch {batch:,} raw user "
          f"ids (power law over {rows:,} known, 10% new), dim {args.dim}, {args.optimizer}, {args.items:,} items "
          f"(Adam); "
          f"capacity {capacity:,} ({args.train_capacity}); {args.rounds} rounds of {args.turn} steps a way")
    table = []
    for label, value in ms.items():
        kind = label.split(",")[1]
        fixed = ms["fixed," + kind]
        table.append({"way": label, "ms/step": value, "x fixed (same loop)": value / fixed})
    print(format_table(table, ["way", "ms/step", "x fixed (same loop)"]))
    plain = ms["dynamic, plain loop"] / ms["fixed, plain loop"]
    piped = ms["dynamic, TrainPipeline"] / ms["fixed, TrainPipeline"]
    print(f"dynamic / fixed: plain loop {plain:.3f}x, TrainPipeline {piped:.3f}x (target <= 1.15x); TrainPipeline / "
          f"plain: fixed {ms['fixed, TrainPipeline'] / ms['fixed, plain loop']:.3f}, dynamic "
          f"{ms['dynamic, TrainPipeline'] / ms['dynamic, plain loop']:.3f}\n")
    if args.trace_steps:
        for label, way in ways.items():
            trace_way(label, way, args.trace_steps, device)


def trace_way(label: str, way, steps: int, device: torch.device) -> None:
    """Profiles ``steps`` steps of ``way`` and prints, per step, the GPU's streams and the host's waits (on a GPU),
    and the host operators with the most time (inclusive; top-level ones first among equals): where a step goes."""
    events, wall_ms = profile_trace(lambda n: [way.step() for _ in range(n)], steps)
    if device.type == "cuda":
        print(format_summary(label, summarize_trace(events, steps)))
    spent: dict = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation") and "dur" in e:
            name = e["name"]
            spent[name] = spent.get(name, 0.0) + float(e["dur"])
    top = sorted(((us / 1e3 / steps, name) for name, us in spent.items() if name != "speedtorch.phase: steps"),
                 reverse=True)[:12]
    print(f"  host [{label}]: {wall_ms:.2f} ms a step under the profiler; operators (ms a step, inclusive): " +
          ", ".join(f"{name} {ms:.2f}" for ms, name in top), flush=True)


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
          f"allocated in {allocated:.1f} s", flush=True)
    start = time.perf_counter()
    emb.index.advance_step()
    admitted, shown = 0, 0
    for chunk in distinct_raw_keys(keys, 1):
        emb.index.assign(chunk)  # admits every id of the chunk, into slots in order
        admitted += chunk.numel()
        if admitted * 20 // keys > shown:  # progress: every 5%
            shown = admitted * 20 // keys
            elapsed = time.perf_counter() - start
            print(f"  admitted {admitted:,} of {keys:,} ids in {elapsed:.1f} s "
                  f"({admitted / elapsed / 1e6:.2f}M ids/s), RSS {resident_bytes() / 2**30:.1f} GiB", flush=True)
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
    parser.add_argument("--cpu-only", action="store_true",
                        help="no GPU: the mapping section, and the training section on the CPU")
    parser.add_argument("--sections", default="mapping,lookup,training",
                        help="comma-separated: mapping (CPU), lookup (GPU), training (--train-device)")
    parser.add_argument("--train-device", default=None,
                        help="where the training section computes (default: cuda if there is one, else cpu)")
    parser.add_argument("--train-rows", type=positive_int, default=None,
                        help="training: ids already in the table (default 1,000,000 on a GPU, 100,000 on the CPU)")
    parser.add_argument("--train-batch", type=positive_int, default=None,
                        help="training: ids a batch (default 65,536 on a GPU, 4,096 on the CPU)")
    parser.add_argument("--train-capacity", choices=("grow", "full"), default="grow",
                        help="training: grow (room for every new id) or full (each new id evicts a row, LRU)")
    parser.add_argument("--optimizer", default="rowwise_adagrad", help="training: the user table's optimizer")
    parser.add_argument("--items", type=positive_int, default=100_000, help="training: rows of the item table")
    parser.add_argument("--warmup", type=positive_int, default=5, help="training: untimed steps of each way first")
    parser.add_argument("--rounds", type=positive_int, default=7, help="training: turns of each way")
    parser.add_argument("--turn", type=positive_int, default=8, help="training: steps in a row a turn")
    parser.add_argument("--trace-steps", type=int, default=0,
                        help="training: then profile each way for this many steps and print where a step goes")
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
    sections = set(args.sections.split(","))
    unknown = sections - {"mapping", "lookup", "training"}
    if unknown:
        parser.error(f"--sections: unknown {sorted(unknown)}; mapping, lookup, training")
    cuda = torch.cuda.is_available() and not args.cpu_only
    args.train_device = args.train_device or ("cuda" if cuda else "cpu")
    if "mapping" in sections:
        cpu_section(args, generator)
    if "lookup" in sections:
        if cuda:
            gpu_section(args, generator)
        else:
            print("GPU lookup section skipped: no CUDA device (or --cpu-only)\n")
    if "training" in sections:
        training_section(args, generator)


if __name__ == "__main__":
    main()
