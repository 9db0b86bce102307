"""DLRM benchmark (issue 24): the model of speedtorch.models.DLRM on synthetic Criteo-shaped batches (power-law ids per
table), trained by speedtorch.TrainPipeline, each way timed in alternating rounds in one run, with ratios.

Sections (``--sections``, comma-separated; the default: ``cpu,loop`` without a GPU, ``loop,gpu`` with one):

- ``cpu``: the DLRM CPU size: the Criteo 1TB tables capped at ``--cap`` rows (1M: 7.1M rows), dim 16, the MLPs and
  batch (128) of the DLRM reference's Criteo Kaggle configuration (512-256-64-16, 512-256-1); speedtorch's tables
  against ``nn.EmbeddingBag(sparse=True)`` with torch's sparse Adagrad and SparseAdam (same dense part and
  optimizer), the whole step and the tables' part alone (lookup, backward, update); row-wise Adagrad beside them.
- ``loop``: the collection's one lookup and one fused step for 26 tables against a loop over 26 HostEmbeddings.
- ``gpu``: at a size every way fits (``--cap``, default 5M rows a table: 29.2M rows, 15 GB at dim 128), the tables in
  host RAM (pipelined and not), hybrid (a GPU row cache of ``--hot-fraction`` of the rows, pipelined), all on the GPU
  (speedtorch's placement="gpu", and torch's nn.EmbeddingBag + sparse Adagrad); same model, same batches. On a GPU
  the host tables' pipelined way is TrainPipeline's default (the copy engines, CPU copy threads); the same model is
  also timed with UVA row kernels (``copy_engines=False``), with ``--copy-threads`` counts, and under
  ``prefetch='auto'`` (its trial run first, its choice printed).
  ``--phases``: each way's step cut into phases (ids, de-duplication, gather, pooling, interaction, MLPs, loss,
  backward, table update, dense optimizer, copies, other) from a trace of ``--trace-steps`` steps, with samples/s
  against MLPerf's per-GPU rate and the largest phase (bench/trace_summary.py's summarize_phases; on the CPU too).
- ``criteo1tb``: the Criteo 1TB tables capped at 40M rows (MLPerf's: 204,184,588 rows; 108 GB of host RAM with
  row-wise Adagrad at dim 128), host RAM, pipelined and not, samples/s, init time, host RSS, and a profile of a few
  steps (where the GPU time goes).

    python bench/dlrm.py                                 # CPU: sections cpu, loop (about a minute on 2 cores)
    python bench/dlrm.py --sections gpu                  # GPU: the all-on-GPU comparison (~3 min)
    python bench/dlrm.py --sections criteo1tb --state-apart   # GPU: the 104 GB configuration (~5 min with its init)
    python bench/dlrm.py --sections gpu --json out.json  # results as JSON too (bench/report.py reads it)
    python bench/dlrm.py --sections gpu --multi-hot --interaction dcn --no-torch --batch 16384 --phases
                                                         # GPU: MLPerf's model, each way's step by phase

With ``--interaction dcn`` the tables start as MLPerf's DLRM-DCNv2 reference's, each U(-sqrt(1/rows), +sqrt(1/rows))
(TableConfig.init_range); with ``dot`` N(0, 0.01^2).
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import math
import os
import re
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
import speedtorch  # noqa: E402
from speedtorch import HostEmbeddingBagCollection, TableConfig, TrainPipeline  # noqa: E402
from speedtorch.cli.benchmarking import format_table  # noqa: E402
from speedtorch.models import (DLRM, MLPERF_POOLING_FACTORS, DLRMTrain, TorchEmbeddingBags, criteo_rows,  # noqa: E402
                               synthetic_batches)
from speedtorch.nn import HostEmbedding  # noqa: E402
from trace_summary import (format_phases, format_summary, profile_trace, summarize_phases,  # noqa: E402
                           summarize_trace)  # (bench/trace_summary.py)

# The DLRM MLPs (MLPerf's), and the CPU size's: those of the DLRM reference's Criteo Kaggle run (dim 16).
FULL_MLPS = dict(bottom=(512, 256, 128), top=(1024, 1024, 512, 256, 1))
CPU_MLPS = dict(bottom=(512, 256, 64, 16), top=(512, 256, 1))
# MLPerf Training's DLRM-DCNv2 rate per GPU (H100, FBGEMM, every table in HBM; issue 30), the yardstick of --phases.
MLPERF_SAMPLES_PER_S_PER_GPU = 1.73e6


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def rss_gb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e9


def tables_of(rows, dim, interaction="dot"):
    """The tables; with DCN each starts U(-sqrt(1/rows), +sqrt(1/rows)) (its rows), as in MLPerf's DLRM-DCNv2
    reference (TorchRec's default), else the collection's N(0, 0.01^2) (host_tables' init_std)."""
    return [TableConfig(f"t{i}", n, dim, init_range=math.sqrt(1 / n) if interaction == "dcn" else None)
            for i, n in enumerate(rows)]


def host_tables(rows, args, device, optimizer, placement="host", lr=None):
    return HostEmbeddingBagCollection(tables_of(rows, args.dim, args.interaction), optimizer=optimizer,
                                      optimizer_options={"lr": lr or args.lr, "eps": args.eps}, device=device,
                                      placement=placement,
                                      hot_fraction=args.hot_fraction, init_std=0.01, seed=0,
                                      state_beside_rows=not args.state_apart)


def dlrm(embeddings, args, device, mlps):
    torch.manual_seed(0)
    bottom = (*mlps["bottom"][:-1], args.dim)  # the bottom MLP ends at the tables' dim
    model = DLRMTrain(DLRM(embeddings, 26, args.dim, bottom=bottom, top=mlps["top"], interaction=args.interaction,
                           amp=args.amp))
    return model.to(device)


def dense_params(model):
    return [p for name, p in model.named_parameters() if "embeddings" not in name]


UVA = "host RAM, pipelined, UVA row kernels (copy_engines=False)"
AUTO = "host RAM, pipelined, prefetch='auto', copy_engines='auto' (its choice after its trial)"
COPY_COUNTERS = ("stream_ordered_gather_microseconds", "stream_ordered_scatter_microseconds", "staged_gather_bytes",
                 "staged_scatter_bytes")


class Way:
    """A model trained by its own TrainPipeline over the batches, cycled."""

    def __init__(self, model, optimizers, batches, device, prefetch=True, max_sms=None, tables_step=None,
                 copy_engines=True):
        self.model, self.device = model, device
        self.pipeline = TrainPipeline(model, optimizers, itertools.cycle(batches), device=device, prefetch=prefetch,
                                      max_sms=max_sms, copy_engines=copy_engines)
        self.tables_step = tables_step

    def run(self, steps: int) -> float:
        for _ in range(steps):
            loss = self.pipeline.progress()[0]
        return float(loss.detach())

    def run_trial(self, marks=None) -> None:
        """Steps until prefetch='auto' has chosen, the loss read at the end only (as a timed turn does: reading it
        every step, which waits for each step's forward, made the copy engines' steps 20.3 ms where turns ran them at
        15.3; bench/RESULTS.md, sixteenth session). ``marks``: a list that gets (the step's way, an event of the
        training stream before it) for every step."""
        while self.pipeline.prefetch == "auto":
            if marks is not None:
                marks.append((self.pipeline._trial.way(self.pipeline.steps), torch.cuda.Event(enable_timing=True)))
                marks[-1][1].record()
            self.pipeline.progress()


class WithLaunch:
    """A way run with other launch settings for the row kernels beside its model (a point of --sweep-launch): SMs
    (TrainPipeline's max_sms), blocks a SM and rows in flight a thread (the transfer options uva_blocks_per_sm,
    uva_rows_in_flight, for the pipeline's thread)."""

    def __init__(self, way: Way, point: str):
        self.way = way
        self.max_sms, self.blocks, self.rows = (int(v) for v in point.split("x"))

    def run(self, steps: int) -> float:
        kept, self.way.pipeline.max_sms = self.way.pipeline.max_sms, self.max_sms
        try:
            with speedtorch.transfer_config_override(uva_blocks_per_sm=self.blocks, uva_rows_in_flight=self.rows):
                return self.way.run(steps)
        finally:
            self.way.pipeline.max_sms = kept


class WithTransferOptions:
    """A way run with transfer options in force on the pipeline's thread (speedtorch.transfer_config_override) and
    TrainPipeline's ``copy_engines`` set: the same model, turns in between with the settings it was built with."""

    def __init__(self, way: Way, copy_engines: bool = False, **options):
        self.way, self.copy_engines, self.options = way, copy_engines, options
        self.model, self.pipeline = way.model, way.pipeline
        self.copies: dict = {}

    def run(self, steps: int) -> float:
        kept, self.pipeline.copy_engines = self.pipeline.copy_engines, self.copy_engines
        before = speedtorch.stats()
        try:
            with speedtorch.transfer_config_override(**self.options):
                return self.way.run(steps)
        finally:
            self.pipeline.copy_engines = kept
            after = speedtorch.stats()  # host functions still queued count in the next turn
            for key in COPY_COUNTERS:
                self.copies[key] = self.copies.get(key, 0) + after[key] - before[key]
            self.copies["steps"] = self.copies.get("steps", 0) + steps

    def copy_rates(self) -> str:
        """The CPU side of the copy engines' way: ms a step and GB/s of the stream-ordered gathers and write-backs."""
        c, parts = self.copies, []
        for what, us, nbytes in (("gathers", "stream_ordered_gather_microseconds", "staged_gather_bytes"),
                                 ("write-backs", "stream_ordered_scatter_microseconds", "staged_scatter_bytes")):
            if c.get(us, 0) > 0:
                parts.append(f"{what} {c[us] / 1e3 / c['steps']:.2f} ms a step at {c[nbytes] / c[us] / 1e3:.1f} GB/s")
        return "CPU copies in stream order: " + ("; ".join(parts) or "none")


def time_ways(ways: dict, steps: int, rounds: int, warmup: int, device) -> dict:
    """Median ms per step of each way over ``rounds`` turns of ``steps // rounds`` steps (the ways alternating; a
    turn is timed whole, so the pipeline's overlap across steps counts), with the loss of each way's first step and
    of its last. The first step of a new model has a loss near 0.69 (its logits start near 0); a way that shares its
    model with one before it (not pipelined, copy engines) starts where that one stopped."""
    losses = {}
    for label, way in ways.items():
        losses[label] = [way.run(1)]  # the first step's loss, before the way has changed anything
        if warmup > 1:
            way.run(warmup - 1)
    times = {label: [] for label in ways}
    per_round = max(1, steps // rounds)
    for _ in range(rounds):
        for label, way in ways.items():
            way.run(1)  # the turn starts warm
            sync(device)
            start = time.perf_counter()
            losses[label].append(way.run(per_round))
            sync(device)
            times[label].append((time.perf_counter() - start) / per_round)
    return {label: (statistics.median(t) * 1e3, losses[label][0], losses[label][-1]) for label, t in times.items()}


def distinct_rows(batches, rows) -> float:
    """Distinct rows per batch over all tables (what one gather moves), averaged over the batches."""
    offsets = torch.tensor([0, *itertools.accumulate(rows)][:-1])

    def ids(sparse):
        if isinstance(sparse, torch.Tensor):
            return sparse + offsets
        per_feature = sparse.lengths.view(len(rows), -1).sum(1)
        return sparse.values + offsets.repeat_interleave(per_feature)

    return statistics.mean(torch.unique(ids(b.sparse)).numel() for b in batches)


def make_batches(rows, args, seed, pin_memory=False):
    return synthetic_batches(rows, args.batch, args.batches, exponent=args.exponent, seed=seed, pin_memory=pin_memory,
                             pooling_factors=MLPERF_POOLING_FACTORS if args.multi_hot else None)


def ids_words(args) -> str:
    return (f"ids ~ power law {args.exponent}, " +
            ("multi-hot (MLPerf's pooling factors, 214 a sample)" if args.multi_hot else "one-hot"))


# --- sections ---------------------------------------------------------------------------------------------------

def section_cpu(args) -> dict:
    device = torch.device("cpu")
    rows = criteo_rows(args.cap)
    batches = make_batches(rows, args, seed=1)
    print(f"\n== cpu: DLRM CPU size: 26 tables, {sum(rows):,} rows x {args.dim} ({args.cap:,} a table at most), "
          f"MLPs {CPU_MLPS['bottom']} / {CPU_MLPS['top']}, batch {args.batch:,}, {ids_words(args)}: "
          f"{distinct_rows(batches, rows):,.0f} distinct rows a batch; {torch.get_num_threads()} threads", flush=True)
    ways, parts = {}, {}
    for opt_name in ("adagrad", "adam"):
        model = dlrm(host_tables(rows, args, device, opt_name), args, device, CPU_MLPS)
        dense = (torch.optim.Adagrad if opt_name == "adagrad" else torch.optim.Adam)(dense_params(model), lr=args.lr,
                                                                                     foreach=True)
        label = f"speedtorch tables, {opt_name}"
        ways[label] = Way(model, dense, batches, device)
        parts[label] = _tables_part(model.model.embeddings, None)
        torch_tables = TorchEmbeddingBags(tables_of(rows, args.dim, args.interaction), sparse=True)
        if args.interaction != "dcn":  # as host_tables' rows start
            with torch.no_grad():
                for bag in torch_tables.bags:
                    bag.weight.normal_(0, 0.01)
        model = dlrm(torch_tables, args, device, CPU_MLPS)
        table_params = list(torch_tables.parameters())
        if opt_name == "adagrad":
            table_opt = torch.optim.Adagrad(table_params, lr=args.lr)
            dense = torch.optim.Adagrad(dense_params(model), lr=args.lr, foreach=True)
            label = "nn.EmbeddingBag(sparse) + torch Adagrad"
        else:
            table_opt = torch.optim.SparseAdam(table_params, lr=args.lr)
            dense = torch.optim.Adam(dense_params(model), lr=args.lr, foreach=True)
            label = "nn.EmbeddingBag(sparse) + SparseAdam"
        ways[label] = Way(model, [table_opt, dense], batches, device)
        parts[label] = _tables_part(torch_tables, table_opt)
    model = dlrm(host_tables(rows, args, device, "rowwise_adagrad"), args, device, CPU_MLPS)
    ways["speedtorch tables, rowwise_adagrad"] = Way(model, torch.optim.Adagrad(dense_params(model), lr=args.lr,
                                                                                 foreach=True), batches, device)
    parts["speedtorch tables, rowwise_adagrad"] = _tables_part(model.model.embeddings, None)
    timed = time_ways(ways, args.steps, args.rounds, args.warmup, device)
    part_times = _time_parts(parts, batches, args)
    results = [{"way": label, "ms/step": ms, "tables ms": part_times[label], "first loss": first, "last loss": last}
               for label, (ms, first, last) in timed.items()]
    print(format_table(results, ["way", "ms/step", "tables ms", "first loss", "last loss"]))
    ratios = {}
    for ours, theirs in (("speedtorch tables, adagrad", "nn.EmbeddingBag(sparse) + torch Adagrad"),
                         ("speedtorch tables, adam", "nn.EmbeddingBag(sparse) + SparseAdam")):
        ratios[f"{ours} vs {theirs}"] = {"step": timed[theirs][0] / timed[ours][0],
                                         "tables": part_times[theirs] / part_times[ours]}
        print(f"{ours}: {ratios[f'{ours} vs {theirs}']['step']:.2f}x faster a DLRM step than {theirs}, "
              f"{ratios[f'{ours} vs {theirs}']['tables']:.2f}x the tables' part alone")
    return {"config": {"rows": sum(rows), "cap": args.cap, "dim": args.dim, "batch": args.batch,
                       "threads": torch.get_num_threads(), "mlps": CPU_MLPS},
            "ways": results, "ratios": ratios}


def _tables_part(tables, table_opt):
    """One lookup, backward from a fixed gradient, and the tables' update: the part of a step the tables own."""
    grad = {}

    def step(batch):
        out = tables(batch.sparse)
        if "g" not in grad:
            grad["g"] = torch.randn(out.shape, generator=torch.Generator().manual_seed(0)).to(out.device) * 1e-3
        out.backward(grad["g"])
        if table_opt is None:
            tables.step()
        else:
            table_opt.step()
            table_opt.zero_grad(set_to_none=True)

    return step


def _time_parts(parts, batches, args) -> dict:
    times = {label: [] for label in parts}
    for label, step in parts.items():
        step(batches[0])
    for r in range(args.rounds):
        for label, step in parts.items():
            for i in range(max(1, args.steps // args.rounds)):
                start = time.perf_counter()
                step(batches[(r + i) % len(batches)])
                times[label].append(time.perf_counter() - start)
    return {label: statistics.median(t) * 1e3 for label, t in times.items()}


def section_loop(args, device) -> dict:
    rows = criteo_rows(args.loop_cap)
    batches = synthetic_batches(rows, args.loop_batch, args.batches, exponent=args.exponent, seed=2)
    batches = [b.sparse.to(device) for b in batches]
    print(f"\n== loop: 26 tables ({sum(rows):,} rows x {args.dim}, rowwise_adagrad), batch {args.loop_batch:,}: "
          f"lookup + backward + fused step, one collection against 26 HostEmbeddings on {device}", flush=True)
    collection = host_tables(rows, args, device, "rowwise_adagrad")
    singles = torch.nn.ModuleList(HostEmbedding(n, args.dim, optimizer="rowwise_adagrad",
                                                optimizer_options={"lr": args.lr}, device=device, init_std=0.01,
                                                seed=t) for t, n in enumerate(rows))

    def one_collection(ids):
        collection(ids).sum().backward()
        collection.step()

    def loop(ids):
        torch.cat([m(ids[:, t]) for t, m in enumerate(singles)], dim=1).sum().backward()
        for m in singles:
            m.step()

    from interleaved_timing import time_calls

    it = {"i": 0}

    def cycled(fn):
        def call():
            it["i"] += 1
            fn(batches[it["i"] % len(batches)])
        return call

    timed = time_calls({"collection": cycled(one_collection), "26 HostEmbeddings": cycled(loop)},
                       reps=args.steps, rounds=args.rounds)
    results = [{"way": label, "ms": s * 1e3} for label, s in timed.items()]
    ratio = timed["26 HostEmbeddings"] / timed["collection"]
    print(format_table(results, ["way", "ms"]))
    print(f"the collection's one lookup and step: {ratio:.2f}x faster than the loop over 26 HostEmbeddings")
    return {"config": {"rows": sum(rows), "dim": args.dim, "batch": args.loop_batch, "device": str(device)},
            "ways": results, "speedup": ratio}


def section_gpu(args, device) -> dict:
    rows = criteo_rows(args.cap)
    batches = make_batches(rows, args, seed=3, pin_memory=device.type == "cuda")
    print(f"\n== gpu: 26 tables, {sum(rows):,} rows x {args.dim} ({args.cap:,} a table at most), batch "
          f"{args.batch:,}, {distinct_rows(batches, rows):,.0f} distinct rows a batch ({ids_words(args)}), "
          f"{args.optimizer}, interaction {args.interaction}, amp={args.amp}", flush=True)
    ways = {}
    for label, placement in (("host RAM, pipelined", "host"), ("host RAM, not pipelined", "host"),
                             (f"hybrid ({args.hot_fraction:.0%} cached), pipelined", "hybrid"),
                             ("GPU memory (speedtorch placement='gpu'), pipelined", "gpu"),
                             ("GPU memory (speedtorch placement='gpu'), not pipelined", "gpu")):
        if "not pipelined" in label:  # the same model as the pipelined way before it, without prefetch
            pipelined = ways[label.replace("not pipelined", "pipelined")]
            ways[label] = Way(pipelined.model, pipelined.pipeline.optimizers, batches, device, prefetch=False)
            continue
        print(f"building {label}", flush=True)
        start = time.perf_counter()
        model = dlrm(host_tables(rows, args, device, args.optimizer, placement), args, device, FULL_MLPS)
        print(f"  {time.perf_counter() - start:.1f} s", flush=True)
        # The yardstick runs unbounded: its rows are in GPU memory and its step is on the main stream.
        ways[label] = Way(model, torch.optim.Adagrad(dense_params(model), lr=args.lr, eps=args.eps), batches, device,
                          max_sms=None if placement == "gpu" else args.max_sms)
        if placement == "host" and device.type == "cuda":
            # TrainPipeline's default: rows moved by CPU threads in stream order and the copy engines (no SM); the
            # same model with UVA row kernels (on --max-sms SMs) and with other counts of CPU copy threads.
            base = ways[label] = WithTransferOptions(ways[label], copy_engines=True)
            ways[UVA] = WithTransferOptions(base.way, copy_engines=False)
            for threads in args.copy_threads:
                ways[f"{label}, {threads} CPU copy threads"] = WithTransferOptions(
                    base.way, copy_engines=True, stream_ordered_threads=threads)
            # TrainPipeline's defaults, prefetch='auto' and copy_engines='auto', on the same model: its trial (with
            # prefetch by the copy engines, with prefetch over UVA row kernels, without) runs untimed first;
            # --auto-trials N: N trials in a row, each a new pipeline, the last one's way timed.
            for trial in range(args.auto_trials):
                ways[AUTO] = Way(model, base.pipeline.optimizers, batches, device, prefetch="auto",
                                 max_sms=args.max_sms, copy_engines="auto")
                marks = []  # --auto-step-times: an event of the training stream before each step of the trial
                ways[AUTO].run_trial(marks if args.auto_step_times else None)
                pipeline = ways[AUTO].pipeline
                if marks:
                    torch.cuda.synchronize(device)
                    print("  the trial's steps, ms on the training stream, (prefetch, copy engines): " + ", ".join(
                        f"{i}{'P' if way[0] else '-'}{'C' if way[1] else 'U'} {a.elapsed_time(b):.1f}"
                        for i, ((way, a), (_, b)) in enumerate(zip(marks, marks[1:]))), flush=True)
                print(f"  prefetch='auto' trial {trial + 1}: kept prefetch={pipeline.prefetch}, copy_engines="
                      f"{pipeline.copy_engines} ({pipeline.prefetch_trial}; ms a step)", flush=True)
    if not args.no_torch:
        print("building torch nn.EmbeddingBag on the GPU", flush=True)
        torch_tables = TorchEmbeddingBags(tables_of(rows, args.dim, args.interaction), sparse=True, device=device)
        model = dlrm(torch_tables, args, device, FULL_MLPS)
        ways["GPU memory (nn.EmbeddingBag + sparse Adagrad)"] = Way(
            model, [torch.optim.Adagrad(torch_tables.parameters(), lr=args.lr, eps=args.eps),
                    torch.optim.Adagrad(dense_params(model), lr=args.lr, eps=args.eps)], batches, device)
    timed = time_ways(ways, args.steps, args.rounds, args.warmup, device)
    gpu = timed["GPU memory (speedtorch placement='gpu'), pipelined"][0]
    results = [{"way": label, "ms/step": ms, "samples/s": args.batch / ms * 1e3, "vs all on GPU": ms / gpu,
                "first loss": first, "last loss": last} for label, (ms, first, last) in timed.items()]
    if args.sweep_launch and device.type == "cuda":
        sweep_launch(ways, args, device)
    traces = trace_ways(ways, args.trace_steps, device, args.trace_dir, phases=args.phases,
                        step_ms={label: ms for label, (ms, _, _) in timed.items()}, batch=args.batch)
    for r in results:
        r["trace"] = traces.get(r["way"])
    print(format_table(results, ["way", "ms/step", "samples/s", "vs all on GPU", "first loss", "last loss"]))
    host = timed["host RAM, pipelined"][0]
    if UVA in timed:
        print(f"{UVA}: {timed[UVA][0] / gpu:.3f}x the step time of every table on the GPU")
        for label, way in ways.items():
            if isinstance(way, WithTransferOptions) and way.copy_engines:
                print(f"  {label}: {way.copy_rates()}")
    if AUTO in ways:
        print(f"prefetch='auto' kept prefetch={ways[AUTO].pipeline.prefetch} and "
              f"copy_engines={ways[AUTO].pipeline.copy_engines} after its trial "
              f"({ways[AUTO].pipeline.prefetch_trial}; ms a step of each way)")
    print(f"host RAM, pipelined: {host / gpu:.3f}x the step time of every table on the GPU (target <= 1.05); "
          f"hybrid {timed[f'hybrid ({args.hot_fraction:.0%} cached), pipelined'][0] / gpu:.3f}x; the pipeline "
          f"saves {timed['host RAM, not pipelined'][0] / host:.2f}x")
    return {"config": {"rows": sum(rows), "cap": args.cap, "dim": args.dim, "batch": args.batch,
                       "optimizer": args.optimizer, "hot_fraction": args.hot_fraction, "max_sms": args.max_sms},
            "ways": results}


def sweep_launch(ways: dict, args, device) -> None:
    """The host tables' pipelined way with UVA row kernels under each launch setting of --sweep-launch, in turns
    with the yardstick."""
    yardstick = "GPU memory (speedtorch placement='gpu'), pipelined"
    sweep = {yardstick: ways[yardstick]}
    for point in args.sweep_launch:
        sweep[f"host RAM, pipelined, {point} (SMs x blocks a SM x rows in flight)"] = \
            WithLaunch(ways[UVA], point)
    timed = time_ways(sweep, args.steps, args.rounds, args.warmup, device)
    gpu = timed[yardstick][0]
    print(format_table([{"way": label, "ms/step": ms, "vs all on GPU": ms / gpu} for label, (ms, _, _) in
                        timed.items()], ["way", "ms/step", "vs all on GPU"]), flush=True)


def trace_ways(ways: dict, steps: int, device, keep_in: str | None = None, phases: bool = False,
               step_ms: dict | None = None, batch: int | None = None) -> dict:
    """Each way's trace summary over ``steps`` steps (bench/trace_summary.py): per stream busy and overlapped time,
    GPU idle time and host waits, printed and returned by way; with ``keep_in``, each way's raw trace is written
    there too (``<way>.json.gz``). With ``phases`` (on the CPU too), from the same trace, the table of where a step's
    time goes by phase (trace_summary.summarize_phases, under the key "phases"), and the way's samples/s (``batch``
    samples in its timed ``step_ms[label]``) against MLPerf's per-GPU rate."""
    if steps <= 0 or (device.type != "cuda" and not phases):
        return {}
    out = {}
    for label, way in ways.items():
        way.run(1)
        keep = None
        if keep_in:
            os.makedirs(keep_in, exist_ok=True)
            keep = os.path.join(keep_in, re.sub(r"[^A-Za-z0-9]+", "_", label).strip("_") + ".json.gz")
        events, wall_ms = profile_trace(way.run, steps, keep)
        out[label] = {}
        if device.type == "cuda":
            out[label] = summarize_trace(events, steps)
            print(format_summary(label, out[label]), flush=True)
        if phases:
            out[label]["phases"] = summarize_phases(events, steps, wall_ms)
            print(format_phases(label, out[label]["phases"]), flush=True)
            if step_ms and label in step_ms and batch:
                print(mlperf_line(batch, step_ms[label]), flush=True)
    return out


def mlperf_line(batch: int, ms: float) -> str:
    """Samples/s of a step of ``batch`` samples timed at ``ms``, against MLPerf's DLRM-DCNv2 rate per GPU."""
    rate = batch / ms * 1e3
    return (f"samples/s: {rate:,.0f} ({batch:,} samples in {ms:.2f} ms, the timed step) = "
            f"{rate / MLPERF_SAMPLES_PER_S_PER_GPU:.2f} of MLPerf's {MLPERF_SAMPLES_PER_S_PER_GPU / 1e6:.2f}M a GPU "
            f"(DLRM-DCNv2, H100, tables in HBM)")


def section_criteo1tb(args, device) -> dict:
    rows = criteo_rows(args.criteo_cap)
    batches = make_batches(rows, args, seed=4, pin_memory=device.type == "cuda")
    raw = sum(rows) * args.dim * 4
    print(f"\n== criteo1tb: 26 tables, {sum(rows):,} rows x {args.dim} float32 ({raw / 1e9:.1f} GB of rows), "
          f"{args.optimizer} (state {'apart' if args.state_apart else 'beside the rows'}), batch {args.batch:,}, "
          f"{distinct_rows(batches, rows):,.0f} distinct rows a batch ({ids_words(args)})", flush=True)
    rss0 = rss_gb()
    start = time.perf_counter()
    tables = host_tables(rows, args, device, args.optimizer)
    init_s = time.perf_counter() - start
    nbytes = tables.groups[0].table.nbytes()
    print(f"init: {init_s:.1f} s for {nbytes / 1e9:.1f} GB ({nbytes / 1e9 / init_s:.2f} GB/s: map, pin, fill); "
          f"host RSS +{rss_gb() - rss0:.1f} GB", flush=True)
    model = dlrm(tables, args, device, FULL_MLPS)
    dense = torch.optim.Adagrad(dense_params(model), lr=args.lr, eps=args.eps)
    ways = {"host RAM, pipelined": Way(model, dense, batches, device, max_sms=args.max_sms),
            "host RAM, not pipelined": Way(model, dense, batches, device, prefetch=False)}
    timed = time_ways(ways, args.steps, args.rounds, args.warmup, device)
    results = [{"way": label, "ms/step": ms, "samples/s": args.batch / ms * 1e3, "first loss": first,
                "last loss": last} for label, (ms, first, last) in timed.items()]
    print(format_table(results, ["way", "ms/step", "samples/s", "first loss", "last loss"]))
    profile = profile_steps(ways["host RAM, pipelined"], device, args.profile_steps)
    return {"config": {"rows": sum(rows), "dim": args.dim, "batch": args.batch, "optimizer": args.optimizer,
                       "host_bytes": nbytes, "raw_row_bytes": raw},
            "init_s": init_s, "rss_gb": rss_gb() - rss0, "ways": results, "profile": profile}


def profile_steps(way: Way, device, steps: int) -> dict:
    """Where the GPU time of ``steps`` pipelined steps goes: the kernels, summed by name, largest first."""
    from torch.profiler import ProfilerActivity, profile

    sync(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        way.run(steps)
        sync(device)
    rows = []
    for event in prof.key_averages():
        gpu_us = getattr(event, "device_time_total", None) or getattr(event, "cuda_time_total", 0)
        if event.device_type == torch.autograd.DeviceType.CUDA and gpu_us > 0:
            rows.append({"kernel": event.key[:70], "calls": event.count, "GPU ms a step": gpu_us / 1e3 / steps})
    rows.sort(key=lambda r: -r["GPU ms a step"])
    kinds: dict[str, float] = {}
    for r in rows:
        kinds[kernel_kind(r["kernel"])] = kinds.get(kernel_kind(r["kernel"]), 0.0) + r["GPU ms a step"]
    summary = [{"kind": k, "GPU ms a step": ms} for k, ms in sorted(kinds.items(), key=lambda kv: -kv[1])]
    print(f"profile: GPU time of {steps} pipelined steps (streams overlap: the sum may exceed the step), by kind")
    print(format_table(summary, ["kind", "GPU ms a step"]))
    print(format_table(rows[:15], ["kernel", "calls", "GPU ms a step"]))
    return {"by_kind": summary, "kernels": rows[:30]}


def kernel_kind(name: str) -> str:
    """What a kernel does, from its name, for the profile's summary."""
    lower = name.lower()
    for kind, words in (("speedtorch rows: gather, fused update, row cache", ("speedtorch",)),
                        ("copies (memcpy: batches, staged rows, refresh)", ("memcpy", "memset")),
                        ("GEMM: MLPs, interaction", ("gemm", "cutlass", "xmma", "cublas", "nvjet", "sm90_")),
                        ("sort / unique: de-duplication, embedding backward", ("sort", "radix", "unique", "cub::")),
                        ("embedding lookups and their backward", ("embedding",))):
        if any(w in lower for w in words):
            return kind
    return "other: elementwise, reductions, optimizer of the MLPs"


def training_defaults(args) -> None:
    """The tables' optimizer and the learning rate left unset: with DCN, MLPerf's DLRM-DCNv2 reference's (exact
    Adagrad on tables and MLPs, lr 0.005, no warmup or decay); row-wise Adagrad let the model memorise the cycled
    batches within ~10 steps, its losses then swinging to 10-30 (bench/RESULTS.md, issue 30 item 6)."""
    if args.optimizer is None:
        args.optimizer = "adagrad" if args.interaction == "dcn" else "rowwise_adagrad"
    if args.lr is None:
        args.lr = 0.005 if args.interaction == "dcn" else 0.01


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sections", type=lambda s: s.split(","), default=None,
                        help="cpu, loop, gpu, criteo1tb (default: cpu,loop without a GPU, loop,gpu with one)")
    parser.add_argument("--cap", type=int, default=None, help="rows a table at most (cpu: 1M; gpu: 5M)")
    parser.add_argument("--dim", type=int, default=None, help="(cpu: 16; gpu, criteo1tb: 128)")
    parser.add_argument("--batch", type=int, default=None, help="(cpu: 128, the DLRM reference's; gpu: 65,536)")
    parser.add_argument("--batches", type=int, default=6, help="distinct batches, cycled")
    parser.add_argument("--exponent", type=float, default=1.1, help="power law of the ids (larger: more skewed)")
    parser.add_argument("--multi-hot", action="store_true",
                        help="bags of ids as MLPerf's multi-hot Criteo (214 ids a sample; cpu, gpu, criteo1tb)")
    parser.add_argument("--optimizer", default=None,
                        help="the tables' optimizer (gpu, criteo1tb; default rowwise_adagrad, with --interaction dcn "
                             "adagrad: MLPerf's DLRM-DCNv2 reference trains its tables by exact Adagrad)")
    parser.add_argument("--lr", type=float, default=None,
                        help="Adagrad's learning rate, tables and MLPs (default 0.01; 0.005 with --interaction dcn, "
                             "MLPerf's reference, with no warmup or decay; 0.01 diverges at once there: losses 0.70, "
                             "232, 18, 24, 54, 2707 over the first steps on MLPerf's multi-hot batches)")
    parser.add_argument("--eps", type=float, default=1e-8,
                        help="Adagrad's eps, tables and MLPs (MLPerf's reference: 1e-8)")
    parser.add_argument("--interaction", default="dot", choices=("dot", "dcn"))
    parser.add_argument("--no-amp", dest="amp", action="store_false", help="fp32 MLPs (default: bf16 autocast on GPU)")
    parser.add_argument("--hot-fraction", type=float, default=0.2, help="hybrid: the GPU cache's share of the rows")
    parser.add_argument("--max-sms", type=lambda v: v if v == "auto" else int(v), default="auto",
                        help="SMs the host ways' gathers ahead and updates beside the model may use (TrainPipeline's "
                             "max_sms; default auto: a quarter of the GPU's)")
    parser.add_argument("--sweep-launch", type=lambda t: t.split(","), default=None,
                        help="gpu: also time the host tables' pipelined way at these launch settings of its row "
                             "kernels, SMSxBLOCKSxROWS each (e.g. 32x1x4,16x2x4), in turns with the yardstick")
    parser.add_argument("--copy-threads", type=lambda t: [int(v) for v in t.split(",")], default=[],
                        help="gpu: also time the copy engines' way with these CPU thread counts for its copies "
                             "(the transfer option stream_ordered_threads; default: torch's threads)")
    parser.add_argument("--state-apart", action="store_true",
                        help="optimizer state in a table of its own (no re-layout of the rows at setup: one pin)")
    parser.add_argument("--no-torch", action="store_true", help="gpu: leave out torch's nn.EmbeddingBag way")
    parser.add_argument("--auto-trials", type=int, default=1,
                        help="gpu: run the prefetch='auto' way's trial this many times in a row (a new pipeline each), "
                             "printing each one's times; the last one's way is timed")
    parser.add_argument("--auto-step-times", action="store_true",
                        help="gpu: print each step of the prefetch='auto' way's trial, ms on the training stream")
    parser.add_argument("--criteo-cap", type=int, default=40_000_000,
                        help="criteo1tb: rows a table at most (40M: MLPerf's sizes, 108 GB of host RAM)")
    parser.add_argument("--loop-cap", type=int, default=None, help="loop: rows a table at most (cpu 100k; gpu 1M)")
    parser.add_argument("--loop-batch", type=int, default=None, help="loop: batch (cpu: 1,024; gpu: 16,384)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--profile-steps", type=int, default=5)
    parser.add_argument("--trace-steps", type=int, default=5,
                        help="gpu: steps each way is traced for its per-stream summary (0: none)")
    parser.add_argument("--phases", action="store_true",
                        help="gpu: from each way's trace (--trace-steps steps), where a step's time goes by phase "
                             "(ids, de-duplication, gather, pooling, interaction, MLPs, loss, backward, table update, "
                             "dense optimizer, copies, other; bench/trace_summary.py says the rules), its idle share, "
                             "samples/s against MLPerf's 1.73M a GPU and what bounds it; on the CPU too")
    parser.add_argument("--trace-as-run", action="store_true",
                        help="gpu: the traced steps keep the prefetch on its own thread as untraced steps do (by "
                        "default a profiler moves it back onto the calling thread, whose ranges name every phase); "
                        "its kernels then count as no phase")
    parser.add_argument("--trace-dir", default=None,
                        help="gpu: also write each way's raw trace there (<way>.json.gz, for Perfetto)")
    parser.add_argument("--threads", type=int, default=0, help="CPU intra-op threads (default: torch's)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    training_defaults(args)
    if args.trace_as_run:
        from speedtorch._prefetch_thread import PrefetchThread

        PrefetchThread.under_profiler = True
    if args.threads:
        torch.set_num_threads(args.threads)
    has_gpu = torch.cuda.is_available() and "cuda=none" not in speedtorch.build_info()
    device = torch.device("cuda" if has_gpu else "cpu")
    sections = args.sections or (["loop", "gpu"] if has_gpu else ["cpu", "loop"])
    for name in sections:
        if name not in ("cpu", "loop", "gpu", "criteo1tb"):
            parser.error(f"unknown section {name!r}")
        if name in ("gpu", "criteo1tb") and not has_gpu:  # runs (tests do, at tiny sizes), but means little
            print(f"section {name} without a GPU: every placement in host memory, give small sizes", flush=True)
    on_gpu = any(name in ("gpu", "criteo1tb") for name in sections)
    defaults = {"cap": 5_000_000 if on_gpu else 1_000_000, "dim": 128 if on_gpu else 16,
                "batch": 65_536 if on_gpu else 128, "loop_cap": 1_000_000 if has_gpu else 100_000,
                "loop_batch": 16_384 if has_gpu else 1_024}
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if not has_gpu:
        args.amp = False  # bf16 autocast on the CPU is slower than fp32 there
    print(f"speedtorch {speedtorch.__version__}, {speedtorch.build_info()}, torch {torch.__version__}, device {device}",
          flush=True)
    out = {}
    for name in sections:
        if name == "cpu":
            out[name] = section_cpu(args)
        elif name == "loop":
            out[name] = section_loop(args, device)
        elif name == "gpu":
            out[name] = section_gpu(args, device)
        else:
            out[name] = section_criteo1tb(args, device)
        gc.collect()
        if has_gpu:
            torch.cuda.empty_cache()
    if args.json:
        args.json.write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main())
