"""Engram benchmark: hashed n-gram tables in host RAM, trained and served, beside their baselines in one run.

Sections (each prints its figures and ratios; ``--json`` writes them all):
1. gather: ``speedtorch.gather_dequant`` of bf16, row-wise int8 and fp8 (e4m3 + ue8m0 per 32) rows of dim 256 from a
   pinned host table of ``--rows`` rows to the GPU, ``--batch`` distinct spread rows (ids on the GPU), in bytes per
   second against a 64 MiB pinned memcpy measured in the same run (target: fp8 and int8 >= 0.85), with the fused
   kernel alone (no CPU share; at each ``--rows-in-flight`` setting) and ``speedtorch.gather`` of the bf16 rows
   beside it.
2. decode: a 1,024-row fp8 gather captured in a CUDA graph, replayed one at a time: p50 / p90 latency (target: p50
   <= 20 us on the H100); and a decode step's whole Engram lookup (hash + gather + dequantize) of 64 sequences' newest
   token, 16 rows each.
3. training: the small GPT of speedtorch/models/engram_gpt.py on the standard library's bytes, its Engram tables in
   pinned host RAM (prefetched beside the backward, its host work on a thread of its own; asynchronous updates;
   rows moved by the copy engines, and over UVA row kernels beside it)
   against the same tables in GPU memory (the same code, the same batches): ms per step and the ratio (target <=
   1.02), and host RAM without prefetch. The ways take turns (``--rounds`` turns of ``--steps // --rounds``
   consecutive steps each, timed whole: the host runs ahead of the GPU as in training). ``--max-sms N`` bounds the
   prefetch's gather to N SMs (the transfer option ``max_sms``), so the backward it runs beside keeps the rest.
   ``--trace-steps N`` then traces N more steps of each way for a per-stream summary (0: none; ``--trace-dir`` keeps
   the raw traces); under the profiler the prefetch runs on the calling thread, before the backward, unless
   ``--trace-as-run`` keeps it on its thread.
4. scale: one Engram table of ``--big-rows`` rows (300M) of bf16 trained in the GPT on one GPU: ms per step, and the
   process's resident memory against the table's raw bytes (rows + optimizer state).

Without a GPU it trains the GPT at a CPU size (the loss falls) and times the CPU gather.

    python bench/engram.py                      # the GPU figures (bash bench/engram_gpu.sh builds and runs it)
    python bench/engram.py --skip-scale --json out.json
    python bench/engram.py --skip-scale --max-sms 16   # the prefetch's gather on at most 16 SMs
    python bench/engram.py --sections gather --rows-in-flight 2,4,8   # gather_dequant at three launch settings
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
import speedtorch  # noqa: E402
from speedtorch.cli.benchmarking import format_table, gbps, median_seconds  # noqa: E402
from speedtorch.models.engram_gpt import EngramConfig, EngramGPT, Trainer, batches, stdlib_corpus  # noqa: E402
from speedtorch.serving.quantized import format_row_bytes, gather_dequant  # noqa: E402
from trace_summary import format_summary, profile_summary  # noqa: E402  (bench/trace_summary.py)

DIM = 256


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def random_table(rows: int, format: str) -> torch.Tensor:
    """A pinned table in `format` (valid codes, moderate scales): one random block of rows, repeated (the rates do
    not depend on the values; generating gigabytes of random numbers would take longer than the benchmark)."""
    stride = format_row_bytes(format, DIM, 16) if format != "bf16" else 2 * DIM
    table = speedtorch.pinned_empty(rows, stride, dtype=torch.uint8)
    g = torch.Generator().manual_seed(0)
    block_rows = min(rows, 1 << 16)
    if format == "bf16":
        block = torch.randn(block_rows, DIM, generator=g).to(torch.bfloat16).view(torch.uint8)
    else:
        block = torch.randint(0, 0x7F, (block_rows, stride), generator=g, dtype=torch.uint8)  # no NaN codes
        if format == "int8_rowwise":
            block[:, 0:2] = torch.tensor([0.01], dtype=torch.float16).view(torch.uint8)
            block[:, 2:4] = torch.tensor([-1.0], dtype=torch.float16).view(torch.uint8)
        else:
            block[:, DIM:DIM + DIM // 32] = 120
    for begin in range(0, rows, block_rows):
        n = min(block_rows, rows - begin)
        table[begin:begin + n].copy_(block[:n])
    return table


def section_gather(args) -> dict:
    dev = torch.device("cuda")
    ids = torch.unique(torch.randint(0, args.rows, (args.batch,), generator=torch.Generator().manual_seed(1)))
    ids_gpu = ids.to(dev)
    count = ids.numel()
    # The yardstick, measured once in this run: a 64 MiB copy from pinned host memory to the GPU.
    host = speedtorch.pinned_empty(64 << 20, dtype=torch.uint8)
    device_copy = torch.empty(64 << 20, dtype=torch.uint8, device=dev)
    memcpy = gbps(64 << 20, median_seconds(lambda: device_copy.copy_(host, non_blocking=True)))
    del host, device_copy
    results, rows_out = {"memcpy_64mib_gbps": memcpy}, []

    def add(key: str, way: str, table: torch.Tensor, row_bytes: int, payload: int, fn) -> None:
        # Bytes the kernel reads over the link: whole rows of the table (fp8 and int8 rows padded to 16 bytes).
        rate = gbps(count * row_bytes, median_seconds(fn))
        rows_out.append({"way": way, "row bytes": row_bytes, "GB/s": rate, "share of memcpy": rate / memcpy,
                         "payload share": rate / memcpy * payload / row_bytes})
        results[key] = rows_out[-1]

    for format in ("fp8_e4m3_ue8m0", "int8_rowwise", "bf16"):
        table = random_table(args.rows, format)
        stride, payload = table.shape[1], format_row_bytes(format, DIM)
        out = gather_dequant(table, ids_gpu[:4096], format, DIM).cpu()
        assert torch.equal(out, gather_dequant(table, ids[:4096], format, DIM, "cpu")), format  # GPU == CPU
        add(format, f"gather_dequant {format}", table, stride, payload,
            lambda: gather_dequant(table, ids_gpu, format, DIM))
        if format != "bf16":  # the fused kernel alone, without CPU threads taking a share
            for loads in args.rows_in_flight:
                with speedtorch.transfer_config_override(uva_fraction=1.0, uva_rows_in_flight=loads):
                    add(f"{format}_uva_only_{loads}", f"gather_dequant {format}, UVA only, {loads} loads a lane",
                        table, stride, payload, lambda: gather_dequant(table, ids_gpu, format, DIM))
        else:
            as_bf16 = table.view(torch.bfloat16)
            add("gather_bf16", "speedtorch.gather bf16", table, stride, payload,
                lambda: speedtorch.gather(as_bf16, ids_gpu))
        del table
    print(f"\n[1] gather: {count} distinct spread rows of {args.rows} (dim {DIM}, ids on the GPU) from pinned host RAM "
          f"to the GPU; pinned memcpy of 64 MiB in this run: {memcpy:.2f} GB/s (target: fp8 and int8 >= 0.85 of it)")
    print(format_table(rows_out, ["way", "row bytes", "GB/s", "share of memcpy", "payload share"]))
    print("   (GB/s and shares count the row bytes read, padding included; payload share: the format's own bytes; "
          "UVA only: uva_fraction=1 at that uva_rows_in_flight)")
    return results


def graph_latency_us(fn, reps: int = 200) -> tuple[float, float]:
    """p50 and p90 of `reps` single replays of `fn` (captured in a CUDA graph), by CUDA events."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000)
    times.sort()
    return times[len(times) // 2], times[int(len(times) * 0.9)]


def section_decode(args) -> dict:
    dev = torch.device("cuda")
    table = random_table(args.rows, "fp8_e4m3_ue8m0")
    ids = torch.randint(0, args.rows, (1024,), device=dev)
    with speedtorch.deferred_index_checks():
        p50, p90 = graph_latency_us(lambda: gather_dequant(table, ids, "fp8_e4m3_ue8m0", DIM))
        # The whole lookup of a decode step: 64 sequences' last 3 tokens hashed, the newest one's 2 orders x 8 heads
        # = 16 rows gathered: 1,024 rows.
        from speedtorch.ngram import NgramHash
        from speedtorch.serving.quantized import QuantizedRows

        hasher = NgramHash(129_280, args.rows // 17, heads=8, max_order=3).to(dev)
        rows = QuantizedRows(table[:hasher.num_rows], "fp8_e4m3_ue8m0", DIM)
        from speedtorch.serving.ngram_lookup import NgramHashLookup

        lookup = NgramHashLookup(hasher, rows, dev)
        tokens = torch.randint(0, 129_280, (64, 3), device=dev)
        full50, full90 = graph_latency_us(lambda: lookup(tokens, last_only=True))
    speedtorch.check_index_errors()
    rows_out = [{"lookup": "gather_dequant fp8, 1024 rows", "p50 us": p50, "p90 us": p90},
                {"lookup": "hash + gather_dequant fp8, 64 sequences' newest token (1024 rows)", "p50 us": full50,
                 "p90 us": full90}]
    print("\n[2] decode-size lookups inside a CUDA graph, one replay at a time (target: p50 <= 20 us at 1024 rows)")
    print(format_table(rows_out, ["lookup", "p50 us", "p90 us"]))
    return {"gather_1024_p50_us": p50, "gather_1024_p90_us": p90, "lookup_1024_p50_us": full50,
            "lookup_1024_p90_us": full90}


def train_ways(ways: dict, data, device, steps: int, rounds: int, warmup: int) -> dict:
    """Median ms a step of each way over ``rounds`` turns of ``steps // rounds`` consecutive steps, the ways in turns
    (a turn is timed whole, from an idle device to an idle device: the host runs ahead of the GPU as a training loop
    does, and a step's prefetch and update overlap the next step), with each way's first and last loss. Every way
    trains on the same batches in the same order."""
    losses = {label: [] for label in ways}
    for label, trainer in ways.items():  # warm-up: the first steps allocate, compile and fill caches
        for i in range(warmup):
            losses[label].append(trainer.step(data[i], data[i + 1]))
    at = warmup
    per_round = max(1, steps // rounds)
    times = {label: [] for label in ways}
    for _ in range(rounds):
        for label, trainer in ways.items():
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            for i in range(at, at + per_round):
                losses[label].append(trainer.step(data[i], data[i + 1]))
            if device.type == "cuda":
                torch.cuda.synchronize()
            times[label].append((time.perf_counter() - start) / per_round)
        at += per_round
    return {label: {"ms/step": statistics.median(times[label]) * 1e3, "first loss": float(losses[label][0]),
                    "last loss": float(losses[label][-1])} for label in ways}


def section_training(args, device) -> dict:
    tokens, starts = stdlib_corpus()
    if device.type == "cuda":
        config = dict(layers=8, width=768, heads=12, engram_layers=(1, 5), hash_heads=8, max_order=3,
                      rows_per_head=args.rows_per_head, engram_dim=32, dtype=torch.bfloat16)
        batch, seq, steps = 16, 1024, args.steps
    else:
        config = dict(layers=2, width=64, heads=2, engram_layers=(0, 1), hash_heads=2, max_order=3,
                      rows_per_head=4096, engram_dim=16)
        batch, seq, steps = 8, 64, 12
    rounds, warmup = args.rounds, 3
    data = batches(tokens, starts, batch, seq, warmup + steps + 1)
    # (way, placement, prefetch, copy_engines): the Trainer's default moves host rows by the copy engines
    specs = [("GPU memory (prefetch)", "gpu", True, True), ("pinned host RAM (prefetch)", "host", True, True),
             ("pinned host RAM (prefetch, UVA row kernels)", "host", True, False),
             ("pinned host RAM (no prefetch)", "host", False, True)]
    trainers, tables_gb = {}, {}
    for name, placement, prefetch, copy_engines in specs:
        if device.type != "cuda" and placement == "gpu":
            continue
        torch.manual_seed(0)
        model = EngramGPT(EngramConfig(placement=placement, **config), device)
        trainers[name] = Trainer(model, lr=1e-3 if device.type == "cuda" else 1e-2, prefetch=prefetch,
                                 autocast=device.type == "cuda", max_sms=args.max_sms, copy_engines=copy_engines)
        tables_gb[name] = sum(m.rows.table.nbytes() for m in model.engram_modules()) / 1e9
    results = train_ways(trainers, data, device, steps, rounds, warmup)
    base = results.get("GPU memory (prefetch)")
    rows_out = []
    for name, r in results.items():
        r.update({"way": name, "table GB": tables_gb[name], "max_sms": args.max_sms if "(prefetch" in name else None,
                  "vs GPU memory": r["ms/step"] / base["ms/step"] if base else float("nan")})
        rows_out.append(r)
    if args.trace_steps > 0 and device.type == "cuda":  # the same batches again: what overlaps, what waits
        for name, trainer in trainers.items():
            def run(n, trainer=trainer):
                for i in range(n):
                    trainer.step(data[i], data[i + 1])
            keep = None
            if args.trace_dir:
                os.makedirs(args.trace_dir, exist_ok=True)
                keep = os.path.join(args.trace_dir, "".join(c if c.isalnum() else "_" for c in name) + ".json.gz")
            results[name]["trace"] = profile_summary(run, args.trace_steps, keep)
            print(format_summary(name, results[name]["trace"]), flush=True)
    print(f"\n[3] training the Engram GPT ({config['layers']} layers x {config['width']}, Engram at layers "
          f"{config['engram_layers']}, {2 * config['hash_heads']} rows a token per layer), batch {batch} x {seq} "
          f"bytes of the standard library, {rounds} turns of {max(1, steps // rounds)} steps a way, the ways in turns "
          "(target: host RAM <= 1.02x GPU memory); prefetch gather on "
          f"{'every SM' if not args.max_sms else f'at most {args.max_sms} SMs'}")
    print(format_table(rows_out, ["way", "ms/step", "vs GPU memory", "first loss", "last loss", "table GB"]))
    return results


def section_scale(args, device) -> dict:
    tokens, starts = stdlib_corpus()
    rows_per_head = args.big_rows // 16
    config = EngramConfig(layers=2, width=512, heads=8, engram_layers=(1,), hash_heads=8, max_order=3,
                          rows_per_head=rows_per_head, engram_dim=16, dtype=torch.bfloat16,
                          optimizer="rowwise_adam")
    before = rss_bytes()
    start = time.perf_counter()
    model = EngramGPT(config, device)
    built = time.perf_counter() - start
    memory = model.engram_modules()[0]
    raw = memory.rows.table.nbytes()
    resident = rss_bytes() - before
    trainer = Trainer(model, autocast=True, max_sms=args.max_sms)
    data = batches(tokens, starts, 8, 1024, args.steps + 1)
    times = []
    for i in range(min(args.steps, 10)):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = float(trainer.step(data[i], data[i + 1]))
        times.append(time.perf_counter() - t0)
    row = {"table rows": memory.num_rows, "row + state bytes": raw // memory.num_rows, "raw GB": raw / 1e9,
           "RSS added GB": resident / 1e9, "RSS / raw": resident / raw, "build s": built,
           "ms/step": statistics.median(times[2:]) * 1e3, "last loss": loss}
    print(f"\n[4] scale: one Engram table of {memory.num_rows:,} bf16 rows (dim 16, row-wise Adam state beside each "
          "row) in pinned host RAM, trained in the GPT on one GPU")
    print(format_table([row], list(row)))
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=8_000_000, help="rows of the gather tables (dim 256)")
    parser.add_argument("--batch", type=int, default=131_072, help="ids drawn for the gather (distinct ones kept)")
    parser.add_argument("--rows-per-head", type=int, default=1 << 20, help="rows per (order, head) column, training")
    parser.add_argument("--steps", type=int, default=30, help="training steps per way, timed (after 3 warm-up steps)")
    parser.add_argument("--rounds", type=int, default=3, help="training: turns of steps // rounds steps a way")
    parser.add_argument("--big-rows", type=int, default=300_000_000, help="rows of the scale section's table")
    parser.add_argument("--skip-scale", action="store_true", help="leave out section 4")
    parser.add_argument("--sections", type=lambda t: t.split(","), default=["gather", "decode", "training", "scale"],
                        help="which sections to run, comma-separated (default: all four)")
    parser.add_argument("--max-sms", type=int, default=None,
                        help="bound the training prefetch's gather to this many SMs (default: no bound)")
    parser.add_argument("--trace-steps", type=int, default=5,
                        help="training: steps each way is traced for its per-stream summary (0: none)")
    parser.add_argument("--rows-in-flight", type=lambda t: [int(x) for x in t.split(",")], default=[4],
                        help="gather: uva_rows_in_flight values (16-byte loads a lane) at which the fp8 and int8 "
                        "kernels are also timed over UVA alone, e.g. 2,4,8 (default: 4)")
    parser.add_argument("--trace-dir",
                        help="training: keep each way's raw trace here (bench/trace_timeline.py reads it)")
    parser.add_argument("--trace-as-run", action="store_true",
                        help="training: the prefetch stays on its thread while traced (else it runs on the calling "
                             "thread under the profiler): the schedule as it runs untraced")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    if args.max_sms is not None and args.max_sms < 0:
        parser.error("--max-sms must be >= 0 (0: every SM)")
    if args.trace_as_run:
        from speedtorch._prefetch_thread import PrefetchThread

        PrefetchThread.under_profiler = True
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    print(f"speedtorch {speedtorch.__version__} ({speedtorch.build_info()}), torch {torch.__version__}, "
          f"{torch.cuda.get_device_name() if device.type == 'cuda' else 'no GPU: CPU sizes'}")
    sections = []
    if device.type == "cuda":
        sections += [("gather", lambda: section_gather(args)), ("decode", lambda: section_decode(args))]
    sections.append(("training", lambda: section_training(args, device)))
    if device.type == "cuda" and not args.skip_scale:
        sections.append(("scale", lambda: section_scale(args, device)))
    sections = [(name, run) for name, run in sections if name in args.sections]
    results, failed = {}, []
    for name, run in sections:  # one section's failure is reported and the others still run
        try:
            results[name] = run()
        except Exception as e:  # noqa: BLE001
            failed.append(name)
            print(f"\n[{name}] FAILED: {type(e).__name__}: {e}", flush=True)
            import traceback

            traceback.print_exc()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
