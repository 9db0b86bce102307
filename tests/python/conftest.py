"""pytest setup: import speedtorch from the source tree when it is not installed; GPU tests are marked `gpu` and
skipped without CUDA; the transfer engine's settings are restored after every test."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

try:
    import speedtorch  # noqa: F401
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
    import speedtorch  # noqa: F401

HAS_CUDA = torch.cuda.is_available() and "cuda=none" not in speedtorch.build_info()


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device and a CUDA build of speedtorch")


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="no CUDA device (or speedtorch built without CUDA)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _restore_transfer_config():
    saved = speedtorch.transfer_config()
    yield
    speedtorch.set_transfer_config(**saved)
    speedtorch.set_deferred_index_checks(False)
