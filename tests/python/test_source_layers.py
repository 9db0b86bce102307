"""The C++ sources' layers (README, Layout): each folder of csrc/ includes only folders below it, never one beside
or above, so the kernels (cpu/, cuda/) do not depend on the routing that calls them (optim/, cache/), and host
memory (memory/) and files (io/) do not depend on the transfer engine. What several layers share lives below them
(core/: definitions every layer may use; memory/host_access_tracker: who still uses host memory on a GPU)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Lowest first; folders of one rank must not include each other.
LAYERS = {
    "core": 0,
    "memory": 1, "metrics": 1,
    "cpu": 2, "cuda": 2,
    "transfer": 3, "io": 3,
    "optim": 4, "quant": 4, "engram": 4,
    "cache": 5,
    "embedding": 6, "contiguous": 6,
}


def _includes():
    for path in sorted((ROOT / "csrc").rglob("*")):
        if path.suffix not in (".h", ".cuh", ".cpp", ".cu"):
            continue
        folder = path.relative_to(ROOT / "csrc").parts[0]
        for target in re.findall(r'^#include "([^"]+)"', path.read_text(), flags=re.MULTILINE):
            yield path.relative_to(ROOT), folder, target


def test_every_csrc_folder_has_a_layer():
    folders = {p.name for p in (ROOT / "csrc").iterdir() if p.is_dir()}
    assert folders == set(LAYERS), "a new csrc/ folder needs its place in LAYERS (and the README's Layout)"


def test_no_include_runs_up_or_sideways():
    wrong = []
    for source, folder, target in _includes():
        target_folder = target.split("/")[0]
        if target_folder == folder:
            continue
        assert target_folder in LAYERS, f"{source} includes {target}: csrc/ must not include the operator layer"
        if LAYERS[target_folder] >= LAYERS[folder]:
            wrong.append(f"{source} ({folder}, layer {LAYERS[folder]}) includes {target} (layer "
                         f"{LAYERS[target_folder]})")
    assert not wrong, "includes that run up or sideways:\n" + "\n".join(wrong)
