"""The README's first example (as written, and after `make develop` from any folder) and docs/training.md's loop run
(the latter at small sizes)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.DOTALL)


def test_the_first_example_runs_as_written(capsys):
    readme = ROOT / "README.md"
    block = python_blocks(readme)[0]  # the first example, before anything else
    assert "HostEmbeddingOptimizer" in block and "GradScaler" in block and "sched.step()" in block
    namespace: dict = {"__name__": "readme"}
    exec(compile(block, str(readme), "exec"), namespace)
    model, loader = namespace["model"], namespace["loader"]
    assert model.users.table.step_count() == len(loader)  # one fused update per batch
    assert namespace["opt"].param_groups[0]["lr"] == 0.1  # the warm-up reached the table's group
    # Something was learned: the loss fell and held-out clicks are guessed well above chance (51% -> 90% on the CPU).
    losses, before, after = namespace["losses"], namespace["before"], namespace["accuracy"](*namespace["held_out"])
    assert losses[-1] < losses[0] and after > 0.75 and after > before + 0.2, (losses[0], losses[-1], before, after)
    assert f"after {len(loader)} steps; held-out accuracy" in capsys.readouterr().out


def test_the_first_examples_memory_figure_is_what_the_table_takes():
    # 10M users at dim 32 with Adam: the rows, two moments and 16 bytes of state a row (the comment said 15.7 GB).
    block = python_blocks(ROOT / "README.md")[0]
    figure = re.search(r"10_000_000 users: ([0-9.]+) GB with Adam's state", block)
    from speedtorch.nn import HostEmbedding

    small = HostEmbedding(10_000, 32, optimizer="sparse_adam")
    assert figure and float(figure.group(1)) == round(small.table.nbytes() * 1000 / 1e9, 1)


def test_make_develop_lets_the_first_example_run_from_anywhere(tmp_path):
    # After `make demo` the README's example failed with "No module named 'speedtorch'": the Makefile set
    # PYTHONPATH and SPEEDTORCH_LIBRARY for its own commands only. make develop registers python/ with the Python
    # it is given (here a fresh virtual environment that sees this one's torch), and the package finds the
    # library the Makefile built beside it (build/), with neither variable set.
    if not (ROOT / "build" / "libspeedtorch_ops.so").is_file():
        pytest.skip("build/libspeedtorch_ops.so not built (make demo / make test build it)")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True,
                   timeout=120)
    python = str(venv / "bin" / "python")
    subprocess.run(["make", "-s", "-C", str(ROOT), "develop", f"PYTHON={python}"], check=True, timeout=120,
                   capture_output=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SPEEDTORCH_LIBRARY")}
    code = "import speedtorch; print(speedtorch.library_path())"
    out = subprocess.run([python, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(ROOT / "build" / "libspeedtorch_ops.so")


def test_the_training_guides_loop_runs():
    guide = ROOT / "docs" / "training.md"
    block = python_blocks(guide)[0]
    small = block.replace("1_000_000", "5_000").replace("10_000", "300").replace("range(200)", "range(3)")
    assert small.count("5_000") == 2 and "range(3)" in small, "the guide's sizes changed: update this test"
    namespace: dict = {"__name__": "guide"}
    exec(compile(small, str(guide), "exec"), namespace)
    assert namespace["model"].users.table.step_count() == 3
