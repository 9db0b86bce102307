"""`python -m speedtorch info | demo | transfer-demo` (speedtorch/__main__.py, info.py, train_demo.py,
transfer_demo.py): unknown arguments are errors, --help shows the defaults this machine resolved, and the output
says what it measured and where the table lives."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import speedtorch
from speedtorch.cli import train_demo, transfer_demo
from speedtorch.__main__ import main

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_info_rejects_unknown_arguments(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["info", "--bogus"])
    assert exit_info.value.code == 2
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err


def test_info_rejects_unknown_arguments_from_the_shell():
    # The child imports speedtorch from where this process did (the source tree under `make test`).
    env = dict(os.environ, PYTHONPATH=str(Path(speedtorch.__file__).resolve().parents[1]))
    result = subprocess.run([sys.executable, "-m", "speedtorch", "info", "--bogus"], capture_output=True, text=True,
                            cwd=ROOT, timeout=120, env=env)
    assert result.returncode == 2
    assert "unrecognized arguments: --bogus" in result.stderr


def test_info_help(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["info", "--help"])
    assert exit_info.value.code == 0
    assert "pinned-copy bandwidth" in capsys.readouterr().out


def test_info_without_a_gpu_says_there_is_no_bandwidth_to_measure(no_gpu, capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "no GPU: no pinned-copy bandwidth to measure" in out
    assert "GB/s" not in out


@pytest.mark.gpu
def test_info_with_a_gpu_measures_the_bandwidth(capsys):
    assert main(["info"]) == 0
    assert "pinned copy:      host->GPU" in capsys.readouterr().out


@pytest.mark.parametrize("demo, cpu_rows", [(train_demo, "200000"), (transfer_demo, "1000000")])
def test_demo_help_shows_the_resolved_defaults(demo, cpu_rows, no_gpu, capsys):
    with pytest.raises(SystemExit) as exit_info:
        demo.main(["--help"])
    assert exit_info.value.code == 0
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert f"(default: {cpu_rows})" in out
    assert "(default: 50)" in out or "(default: 100)" in out  # --steps
    assert "no GPU here" in out


@pytest.mark.parametrize("demo", [train_demo, transfer_demo])
@pytest.mark.parametrize("argument", ["--rows", "--steps", "--batch", "--dim"])
def test_demos_refuse_sizes_below_one(demo, argument, capsys):
    """`demo --rows 0` failed deep in the library and `--steps 0` divided by zero: argparse refuses them now."""
    with pytest.raises(SystemExit) as exit_info:
        demo.main([argument, "0", "--no-progress", "--cpu"])
    assert exit_info.value.code == 2
    assert f"argument {argument}: must be >= 1, got 0" in capsys.readouterr().err


def _host_memory_words() -> str:
    return "pinned host RAM" if speedtorch.pinned_empty(1, 1).is_pinned() else "host RAM (not pinned: no GPU)"


def test_transfer_demo_says_where_the_table_lives(capsys):
    args = ["--rows", "2000", "--dim", "8", "--batch", "100", "--steps", "2", "--no-progress", "--cpu"]
    assert transfer_demo.main(args) == 0
    out = capsys.readouterr().out
    assert f"in {_host_memory_words()};" in out
    assert ("pinned host RAM" in out) == speedtorch.pinned_empty(1, 1).is_pinned()


def test_train_demo_says_where_the_table_lives(capsys):
    args = ["--rows", "2000", "--dim", "8", "--items", "100", "--batch", "64", "--steps", "2", "--no-progress", "--cpu"]
    train_demo.main(args)
    out = capsys.readouterr().out
    assert f"in {_host_memory_words()} " in out
    assert ("pinned host RAM" in out) == speedtorch.pinned_empty(1, 1).is_pinned()


def test_a_build_without_torch_says_how_to_install(tmp_path):
    """What `pip install .` with build isolation meets: a Python without torch. CMake must say why and what to run."""
    import shutil
    import venv

    if shutil.which("cmake") is None:
        pytest.skip("no cmake")
    venv.EnvBuilder(with_pip=False).create(tmp_path / "env")  # a bare interpreter: no torch, like pip's build env
    result = subprocess.run(["cmake", "-S", str(ROOT), "-B", str(tmp_path / "build"),
                             f"-DPython3_EXECUTABLE={tmp_path / 'env' / 'bin' / 'python'}"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    message = " ".join(result.stderr.split())
    assert "needs PyTorch >= 2.4 importable by" in message
    assert "pip install scikit-build-core cmake ninja" in message and "pip install --no-build-isolation ." in message
