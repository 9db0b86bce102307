"""One report of every figure the README quotes: runs the benchmarks themselves (bench/transfer.py, train.py,
cache.py, dlrm.py, billion_rows.py), each writing its JSON, and gathers their figures side by side with their
baselines, ratios and targets into ``report.json`` and ``report.md`` under ``--out``.

A GPU call of the device tool lasts at most 10 minutes, so the sections are chosen per call and the reports of
several calls merged afterwards (``--merge``) on any machine:

    python bench/report.py --sections transfer,train --out $OUT      # call 1 (~6 min)
    python bench/report.py --sections dlrm,cache --out $OUT          # call 2 (~5 min)
    python bench/report.py --sections criteo1tb --out $OUT           # call 3 (~5 min; 108 GB of host RAM)
    python bench/report.py --sections billion --out $OUT             # call 4 (~5 min; 80 GB of host RAM)
    python bench/report.py --merge a/report.json b/report.json ... --out bench/report   # here: one table
    python bench/report.py --sections cpu --out /tmp/report          # the CPU machine's figures

Each section runs in a process of its own (its memory is returned before the next), under ``--section-timeout``;
one that fails or times out is reported as such and the others still run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent

# section -> (script and arguments; the section's JSON path is appended as --json <path>)
SECTIONS = {
    "transfer": ["transfer.py", "--fractions=-1,0,1", "--torch-pinned-rss"],
    "train": ["train.py", "--ways", "speedtorch,speedtorch_gpu,speedtorch_hybrid,gpu_sparse_adam,speedtorch_2019"],
    "scale": ["train.py", "--ways", "speedtorch", "--scale-rows", "56000000"],
    "cache": ["cache.py"],
    "dlrm": ["dlrm.py", "--sections", "loop,gpu"],
    # The two largest with the optimizer state in a table of its own: setting up 80-108 GB pins once, not twice.
    "criteo1tb": ["dlrm.py", "--sections", "criteo1tb", "--state-apart"],
    "billion": ["billion_rows.py", "--state-apart"],
    "cpu": ["dlrm.py", "--sections", "cpu,loop"],
}


def figure(section, name, value, unit="", baseline=None, baseline_value=None, ratio=None, target="", note=""):
    return {"section": section, "figure": name, "value": value, "unit": unit, "baseline": baseline,
            "baseline_value": baseline_value, "ratio": ratio, "target": target, "note": note}


# --- what each section's JSON says ---------------------------------------------------------------------------------

def transfer_figures(data: dict) -> list:
    out = []
    records = [r for r in data.get("results", []) if "way" in r]
    threads = sorted({r["threads"] for r in records}, reverse=True)
    for t in threads:
        for rows, direction, what in (("spread", "h2d", "gather"), ("spread", "d2h", "scatter_"),
                                      ("local", "h2d", "gather"), ("local", "d2h", "scatter_")):
            match = [r for r in records if r["threads"] == t and r["rows"] == rows and r["dir"] == direction and
                     r["way"] == "speedtorch auto" and r["dtype"] == "float32"]
            if match:
                r = match[0]
                target = ("0.85 (16 threads), 0.65 (2)" if rows == "spread" else "0.90")
                out.append(figure("transfer", f"{what}, 131,072 rows x 128 {rows}, {t} threads", r["GB/s"], "GB/s",
                                  "pinned memcpy", r["memcpy GB/s"], r["of memcpy"], target))
    for r in records:
        if r["way"].startswith("fused step"):
            out.append(figure("transfer", f"{r['way']}, 131,072 rows x 128, {r['threads']} threads", r["GB/s"],
                              "GB/s", "duplex pinned memcpy", r["memcpy GB/s"], r["of memcpy"], ">= 0.95"))
    for r in data.get("results", []):
        if "what" in r:
            out.append(figure("transfer", r["what"], r["value"], "x"))
    return out


def train_figures(data: dict) -> list:
    out = []
    rows = {r["way"]: r for r in data.get("train", [])}
    ours = rows.get("speedtorch")
    if ours:
        for way, target in (("gpu_sparse_adam", "<= 1.0"), ("speedtorch_gpu", "<= 1.15"),
                            ("speedtorch_2019", "")):
            if way in rows:
                out.append(figure("train", f"training step, table in host RAM, vs {way}", ours["ms/step"], "ms",
                                  way, rows[way]["ms/step"], ours["ms/step"] / rows[way]["ms/step"], target,
                                  "ratio: step time, ours / theirs"))
        if "speedtorch_hybrid" in rows:
            out.append(figure("train", "training step, hybrid (row cache on the GPU)", rows["speedtorch_hybrid"]
                              ["ms/step"], "ms", "speedtorch (host)", ours["ms/step"],
                              rows["speedtorch_hybrid"]["ms/step"] / ours["ms/step"]))
        if "speedtorch (scale)" in rows:
            big = rows["speedtorch (scale)"]
            out.append(figure("scale", f"training step, {big['rows']:,} rows vs {ours['rows']:,}", big["ms/step"],
                              "ms", f"{ours['rows']:,} rows", ours["ms/step"], big["ms/step"] / ours["ms/step"],
                              "<= 1.10"))
    fused = data.get("fused_step")
    if isinstance(fused, dict) and "of bound" in fused:
        out.append(figure("train", "fused Adam step, 131,072 rows x 128", fused["ms"], "ms", "PCIe bound",
                          fused["pcie bound ms"], fused["of bound"], ">= 0.95 of the duplex rate"))
    return out


def cache_figures(data: dict) -> list:
    out = []
    by = {(r["mode"], r["placement"]): r["ms/step"] for r in data.get("results", [])}
    for mode in ("train", "serve"):
        for placement in ("hybrid", "gpu"):
            if (mode, placement) in by and (mode, "host") in by:
                out.append(figure("cache", f"{mode}, placement={placement} ({data.get('cache_fraction', 0):.0%} "
                                           f"cached)" if placement == "hybrid" else f"{mode}, placement=gpu",
                                  by[(mode, placement)], "ms", "placement=host", by[(mode, "host")],
                                  by[(mode, placement)] / by[(mode, "host")]))
    return out


def dlrm_figures(data: dict) -> list:
    out = []
    if "loop" in data:
        loop = data["loop"]
        ways = {w["way"]: w["ms"] for w in loop["ways"]}
        out.append(figure("dlrm", f"26 tables, lookup + step, one collection ({loop['config']['device']})",
                          ways["collection"], "ms", "26 HostEmbeddings", ways["26 HostEmbeddings"],
                          loop["speedup"], ">= 3", "ratio: speedup"))
    if "cpu" in data:
        cpu = data["cpu"]
        for name, r in cpu["ratios"].items():
            out.append(figure("dlrm-cpu", f"{name}: DLRM step", None, "", None, None, r["step"], ">= 1.5",
                              "ratio: speedup"))
            out.append(figure("dlrm-cpu", f"{name}: tables' part", None, "", None, None, r["tables"], "",
                              "ratio: speedup"))
    if "gpu" in data:
        ways = {w["way"]: w for w in data["gpu"]["ways"]}
        gpu = next(w for label, w in ways.items() if label.startswith("GPU memory (speedtorch"))
        for label, w in ways.items():
            if w is not gpu:
                out.append(figure("dlrm", f"DLRM step, {label}", w["ms/step"], "ms", "every table on the GPU",
                                  gpu["ms/step"], w["ms/step"] / gpu["ms/step"],
                                  "<= 1.05" if label.startswith(("host RAM, pipelined", "hybrid")) else "",
                                  f"{w['samples/s']:,.0f} samples/s"))
        for label, w in ways.items():  # the overlap, not only the step time (bench/trace_summary.py)
            t = w.get("trace")
            if t and "streams" in t:  # a CPU run's trace has the phases only (--phases)
                beside = sum(s["overlapped_ms"] for s in t["streams"])
                out.append(figure("dlrm-trace", f"{label}: GPU idle / window, a step", t["gpu_idle_ms"], "ms", "window",
                                  t["window_ms"], t["gpu_idle_ms"] / t["window_ms"] if t["window_ms"] else None, "",
                                  f"host waits {t['host_wait_ms']:.2f} ms in {t['host_waits']:.1f} calls; "
                                  f"{beside:.2f} ms of stream time beside another stream"))
    if "criteo1tb" in data:
        c = data["criteo1tb"]
        for w in c["ways"]:
            out.append(figure("criteo1tb", f"DLRM, Criteo 1TB tables ({c['config']['rows']:,} rows x "
                                           f"{c['config']['dim']}), batch {c['config']['batch']:,}, {w['way']}",
                              w["samples/s"],
                              "samples/s", "published, 1 A100 + host tables", 768_000, w["samples/s"] / 768_000,
                              ">= 1.0M samples/s"))
        for kind in c.get("profile", {}).get("by_kind", [])[:4]:
            out.append(figure("criteo1tb", f"profile, GPU time a step: {kind['kind']}", kind["GPU ms a step"], "ms"))
        out.append(figure("criteo1tb", "init of the tables (map, pin, fill)", c["init_s"], "s"))
        out.append(figure("criteo1tb", "host RSS / the tables' bytes", c["rss_gb"] * 1e9 / c["config"]["host_bytes"],
                          "x"))
    return out


def billion_figures(data: dict) -> list:
    return [figure("billion", f"{data['rows']:,} rows x {data['dim']} {data['dtype']}, rowwise Adagrad: step",
                   data["ms_per_step"], "ms", note=f"{data['samples_per_s']:,.0f} samples/s"),
            figure("billion", "host RSS after training / raw bytes (rows + 4 B state)",
                   data["rss_after_training"] / data["raw_bytes"], "x", "layout bytes / raw",
                   data["layout_bytes"] / data["raw_bytes"]),
            figure("billion", "init (map, pin, optimizer layout, fill)", data["init_s"], "s")]


PARSERS = {"transfer": transfer_figures, "train": train_figures, "scale": train_figures, "cache": cache_figures,
           "dlrm": dlrm_figures, "criteo1tb": dlrm_figures, "billion": billion_figures, "cpu": dlrm_figures}


# --- running and writing ---------------------------------------------------------------------------------------------

def run_section(name: str, out_dir: Path, timeout: float, extra: list) -> dict:
    json_path = out_dir / f"{name}.json"
    log_path = out_dir / f"{name}.log"
    command = [sys.executable, str(BENCH / SECTIONS[name][0]), *SECTIONS[name][1:], *extra, "--json", str(json_path)]
    print(f"=== {name}: {' '.join(command[1:])}", flush=True)
    start = time.perf_counter()
    status = "ok"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        watchdog = threading.Timer(timeout, proc.kill)  # also when the script hangs printing nothing
        watchdog.start()
        for line in proc.stdout:  # echoed as it comes: the device tool returns the tail of the output
            sys.stdout.write(line)
            log.write(line)
        rc = proc.wait()
        timed_out = not watchdog.is_alive()
        watchdog.cancel()
        if timed_out:
            status = f"timed out after {timeout:.0f} s"
        elif rc != 0:
            status = f"exit code {rc}"
    seconds = time.perf_counter() - start
    figures = []
    if json_path.exists():
        try:
            figures = PARSERS[name](json.loads(json_path.read_text()))
        except (KeyError, ValueError, TypeError, StopIteration) as e:
            status += f"; its JSON did not hold the expected figures ({type(e).__name__}: {e})"
    elif status == "ok":
        status = "no JSON written"
    print(f"=== {name}: {status}, {seconds:.0f} s, {len(figures)} figures", flush=True)
    return {"section": name, "command": " ".join(command[1:]), "status": status, "seconds": seconds,
            "figures": figures}


def _cell(value, unit="") -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        text = f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}"
    else:
        text = str(value)
    return f"{text} {unit}".strip()


def markdown(report: dict) -> str:
    lines = [f"# speedtorch report ({report.get('when', '')})", "", report.get("machine", ""), "",
             "| section | figure | value | baseline | baseline value | ratio | target | note |",
             "|---|---|---|---|---|---|---|---|"]
    for section in report["sections"]:
        for f in section["figures"]:
            lines.append("| " + " | ".join([f["section"], f["figure"], _cell(f["value"], f["unit"]),
                                             f["baseline"] or "", _cell(f["baseline_value"], f["unit"]),
                                             _cell(f["ratio"]), f["target"], f["note"]]) + " |")
    lines += ["", "| section | status | seconds | command |", "|---|---|---|---|"]
    for section in report["sections"]:
        lines.append(f"| {section['section']} | {section['status']} | {section['seconds']:.0f} | "
                     f"`{section['command']}` |")
    return "\n".join(lines) + "\n"


def machine() -> str:
    try:
        sys.path.insert(0, str(BENCH.parent / "python"))
        import torch

        import speedtorch

        gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
        return f"{gpu}; {os.cpu_count()} CPUs; torch {torch.__version__}; {speedtorch.build_info()}"
    except Exception as e:  # noqa: BLE001 (the report still runs)
        return f"(machine unknown: {e})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sections", type=lambda s: s.split(","), default=None,
                        help=f"comma-separated, of: {', '.join(SECTIONS)}")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "bench/out")))
    parser.add_argument("--section-timeout", type=float, default=540.0, help="seconds a section may run")
    parser.add_argument("--merge", nargs="+", type=Path, help="report.json files to merge into one table")
    parser.add_argument("--extra", action="append", default=[], metavar="SECTION=ARGS",
                        help="more arguments for a section's script, e.g. --extra 'dlrm=--steps 10'")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.merge:
        reports = [json.loads(p.read_text()) for p in args.merge]
        report = {"when": ", ".join(r.get("when", "") for r in reports),
                  "machine": "; ".join(dict.fromkeys(r.get("machine", "") for r in reports)),
                  "sections": [s for r in reports for s in r["sections"]]}
    else:
        if not args.sections:
            parser.error("give --sections (or --merge)")
        unknown = [s for s in args.sections if s not in SECTIONS]
        if unknown:
            parser.error(f"unknown sections {unknown}; known: {list(SECTIONS)}")
        extra = {}
        for item in args.extra:
            name, _, rest = item.partition("=")
            extra[name] = rest.split()
        report = {"when": time.strftime("%Y-%m-%d %H:%M"), "machine": machine(),
                  "sections": [run_section(s, args.out, args.section_timeout, extra.get(s, [])) for s in args.sections]}
    (args.out / "report.json").write_text(json.dumps(report, indent=1))
    text = markdown(report)
    (args.out / "report.md").write_text(text)
    print(text)
    return 0 if all(s["status"] == "ok" for s in report["sections"]) else 1


if __name__ == "__main__":
    sys.exit(main())
