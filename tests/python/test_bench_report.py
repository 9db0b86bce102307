"""bench/report.py over the benchmarks it runs: at tiny sizes on the CPU, bench/dlrm.py (every section: the CPU
size, one collection against 26 tables, the placements side by side, the Criteo 1TB configuration with its profile)
and bench/billion_rows.py write the JSON whose figures the report gathers; the figures of transfer.py, train.py and
cache.py are read from JSON shaped as those scripts write it on a GPU; reports of several calls merge into one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import bench_module

ROOT = Path(__file__).resolve().parents[2]


def _report_module():
    return bench_module("report")


@pytest.fixture(scope="module")
def report():
    return _report_module()


def test_every_dlrm_section_and_the_billion_row_run_report_their_figures(tmp_path, report):
    tiny = "--cap 300 --criteo-cap 300 --dim 8 --batch 32 --steps 2 --rounds 1 --warmup 1 --profile-steps 1 " \
           "--loop-cap 300 --loop-batch 16 --threads 1"
    extras = [f"--extra=cpu={tiny}", f"--extra=dlrm={tiny}", f"--extra=criteo1tb={tiny}",
              "--extra=billion=--rows 20000 --steps 4 --batch 16 --bag 4 --batches 2"]
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "report.py"), "--sections", "cpu,dlrm,criteo1tb,billion",
                           "--out", str(tmp_path), *extras], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    result = json.loads((tmp_path / "report.json").read_text())
    assert [s["section"] for s in result["sections"]] == ["cpu", "dlrm", "criteo1tb", "billion"]
    names = {s["section"]: [f["figure"] for f in s["figures"]] for s in result["sections"]}
    assert any("SparseAdam: DLRM step" in n for n in names["cpu"]) and any("one collection" in n for n in names["cpu"])
    assert any("host RAM, pipelined" in n for n in names["dlrm"]) and any("hybrid" in n for n in names["dlrm"])
    assert any("not pipelined" in n for n in names["criteo1tb"]) and any("init" in n for n in names["criteo1tb"])
    assert any("host RSS" in n for n in names["billion"])
    for section in result["sections"]:
        for f in section["figures"]:
            assert f["value"] is None or f["value"] >= 0, f
    assert "| dlrm-cpu |" in (tmp_path / "report.md").read_text()


def test_the_gpu_scripts_figures_are_read(report):
    transfer = {"limits": [{"h2d": 55.0, "d2h": 54.0}], "results": [
        {"threads": 16, "rows": "spread", "dtype": "float32", "way": "speedtorch auto", "dir": "h2d", "ms": 1.5,
         "GB/s": 44.0, "of memcpy": 0.8, "memcpy GB/s": 55.0},
        {"threads": 16, "rows": "spread", "dtype": "float32", "way": "fused step adam", "dir": "both", "ms": 4.0,
         "GB/s": 60.0, "memcpy GB/s": 67.0, "of memcpy": 0.9},
        {"what": "host RSS / raw bytes, speedtorch table", "value": 1.0}]}
    figures = report.transfer_figures(transfer)
    assert [round(f["ratio"], 2) for f in figures if f["ratio"]] == [0.8, 0.9]
    train = {"train": [{"way": "speedtorch", "rows": 10_000_000, "ms/step": 3.0},
                       {"way": "gpu_sparse_adam", "rows": 10_000_000, "ms/step": 5.0},
                       {"way": "speedtorch (scale)", "rows": 56_000_000, "ms/step": 3.3}],
             "fused_step": {"rows": 131072, "ms": 4.0, "pcie bound ms": 3.0, "of bound": 0.75}}
    ratios = {f["figure"]: f["ratio"] for f in report.train_figures(train)}
    assert ratios["training step, table in host RAM, vs gpu_sparse_adam"] == pytest.approx(0.6)
    assert ratios["training step, 56,000,000 rows vs 10,000,000"] == pytest.approx(1.1)
    cache = {"cache_fraction": 0.05, "results": [{"mode": "train", "placement": p, "ms/step": ms}
                                                 for p, ms in (("host", 4.0), ("hybrid", 2.0), ("gpu", 1.0))]}
    assert [f["ratio"] for f in report.cache_figures(cache)] == [0.5, 0.25]


def test_reports_of_several_calls_merge(tmp_path, report):
    for name, value in (("a", 1.5), ("b", 2.5)):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "report.json").write_text(json.dumps({"when": name, "machine": "H100", "sections": [
            {"section": name, "command": "x", "status": "ok", "seconds": 1.0,
             "figures": [report.figure(name, f"figure {name}", value, "ms", "base", 3.0, value / 3.0, "<= 1")]}]}))
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "report.py"), "--merge", str(tmp_path / "a" /
                           "report.json"), str(tmp_path / "b" / "report.json"), "--out", str(tmp_path / "merged")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    text = (tmp_path / "merged" / "report.md").read_text()
    assert "| a | figure a | 1.5 ms | base | 3 ms | 0.5 | <= 1 |" in text and "figure b" in text
