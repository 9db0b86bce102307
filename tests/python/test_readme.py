"""The README's code: its training example runs as written, at small sizes (the one line of sizes is swapped)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
SIZES = "num_users, num_items, dim = 10_000_000, 100_000, 128"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


def test_training_example_runs():
    (block,) = [b for b in python_blocks() if "users.step()" in b]
    assert SIZES in block, "the README's sizes line changed: update this test's substitution"
    namespace: dict = {"__name__": "readme"}
    exec(compile(block.replace(SIZES, "num_users, num_items, dim = 5_000, 200, 16"), str(README), "exec"), namespace)
    users, loader = namespace["users"], namespace["loader"]
    assert users.table.step_count() == len(loader)  # one fused update per batch
    assert bool(namespace["loss"].isfinite())
