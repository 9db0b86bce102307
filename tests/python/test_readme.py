"""The README's first example and docs/training.md's loop run as written (the latter at small sizes)."""

from __future__ import annotations

import re
from pathlib import Path

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
    assert bool(namespace["loss"].isfinite())
    assert namespace["opt"].param_groups[0]["lr"] == 1e-2  # the warm-up reached the table's group
    assert f"after {len(loader)} steps" in capsys.readouterr().out


def test_the_training_guides_loop_runs():
    guide = ROOT / "docs" / "training.md"
    block = python_blocks(guide)[0]
    small = block.replace("1_000_000", "5_000").replace("10_000", "300").replace("range(200)", "range(3)")
    assert small.count("5_000") == 2 and "range(3)" in small, "the guide's sizes changed: update this test"
    namespace: dict = {"__name__": "guide"}
    exec(compile(small, str(guide), "exec"), namespace)
    assert namespace["model"].users.table.step_count() == 3
