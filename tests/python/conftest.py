"""pytest setup: import speedtorch from this source tree (whatever else is installed); GPU tests are marked `gpu` and
skipped without CUDA; fixtures for process-wide settings, and a check that no test leaves them changed."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

# The package of this tree, whatever else Python would find first (`make develop` of another checkout writes a .pth
# that points there, an installed wheel): the tests test the code beside them.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
import speedtorch  # noqa: E402,F401

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


@pytest.fixture
def transfer_settings():
    """transfer_settings(**options) sets process-wide transfer settings for the rest of one test; they are restored
    after it (speedtorch.transfer_config_override)."""
    with contextlib.ExitStack() as stack:
        yield lambda **options: stack.enter_context(speedtorch.transfer_config_override(**options))


@pytest.fixture
def deferred_checks():
    """Deferred index checks for one test (speedtorch.deferred_index_checks)."""
    with speedtorch.deferred_index_checks(True):
        yield


@pytest.fixture
def tiny_tmpfs(tmp_path):
    """A memory file system of 1 MiB, mounted for one test (mounting needs root: the test is skipped otherwise)."""
    folder = tmp_path / "tiny"
    folder.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(folder)]
    if os.geteuid() != 0 or subprocess.run(mount, capture_output=True).returncode != 0:
        pytest.skip("mounting a small tmpfs needs root (CAP_SYS_ADMIN)")
    yield str(folder)
    subprocess.run(["umount", str(folder)], check=True)


@pytest.fixture(autouse=True)
def _process_settings_unchanged():
    """Fails a test that leaves the process-wide settings changed: tests change them through the fixtures above or
    with-blocks, which restore them. (Restores them first, so that one leak does not fail the tests after it.)"""
    saved = speedtorch.transfer_config(), bool(torch.ops.speedtorch.deferred_index_checks())
    yield
    now = speedtorch.transfer_config(), bool(torch.ops.speedtorch.deferred_index_checks())
    if now != saved:
        speedtorch.set_transfer_config(**saved[0])
        speedtorch.set_deferred_index_checks(saved[1])
        pytest.fail(f"the test left process-wide settings changed: {saved} -> {now}")
