"""bench/dynamic_table.py at tiny sizes on the CPU: each section runs to its end and prints its figures (the GPU
ways are the GPU machine's; their code is the CPU ways' with other options)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> str:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # the CPU's sections, whatever the machine
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "dynamic_table.py"), *args], capture_output=True,
                          text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    return proc.stdout


def test_mapping_and_training_sections_print_their_ratios():
    out = _run("--cpu-only", "--sections", "mapping,training", "--rows", "20000", "--batch", "2048", "--reps", "2",
               "--train-rows", "4000", "--train-batch", "256", "--rounds", "1", "--turn", "2", "--warmup", "1",
               "--trace-steps", "1", "--threads", "1")
    assert "IdIndex.find vs Python dict" in out and "(target >= 10x)" in out
    assert "dynamic / fixed: plain loop" in out and "TrainPipeline" in out
    assert out.count("  host [") == 4  # each training way's host operators, from its trace


def test_memory_and_billion_sections_report_bytes_against_the_raw_ones():
    assert "IdIndex.memory_bytes()" in _run("--memory", "--keys", "50000")
    out = _run("--billion", "--keys", "300000", "--steps", "3", "--batch", "256", "--threads", "1")
    assert "admitted 300,000 of 300,000 ids" in out and "RSS / raw:" in out
