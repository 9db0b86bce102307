"""bench/sweep.py and bench/plot_sweeps.py, run as the GPU run calls them, at tiny sizes (on the CPU path here, the
GPU path on a GPU machine), so that the scaling sweep and its plots cannot rot between device runs; and
bench/seed_speedtorch.py's loading of SpeedTorch 0.1.6 from its own folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import speedtorch

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"


def run_script(*args, timeout=600):
    # The child imports speedtorch from where this process did, and loads the same library.
    env = dict(os.environ, PYTHONPATH=str(Path(speedtorch.__file__).resolve().parents[1]))
    return subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout, env=env)


@pytest.fixture(scope="module")
def tiny_sweep(tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep") / "sweep.json"
    result = run_script(BENCH / "sweep.py", "--json", out, "--batches", "256,512", "--dims", "8,32", "--dim", "32",
                        "--batch", "256", "--table-mb", "1", "--items", "100", "--reps", "2", "--steps", "2",
                        "--warmup", "1", "--rounds", "2", "--batch-count", "2", "--threads", "1", "--no-seed")
    assert result.returncode == 0, result.stdout + result.stderr
    return out, result.stdout


def test_sweep_times_every_point_against_its_bound(tiny_sweep):
    out, stdout = tiny_sweep
    data = json.loads(out.read_text())
    assert "SpeedTorch 0.1.6: skipped (--no-seed)" in stdout
    assert data["seed"] == "--no-seed"
    assert data["base"] == {"batch": 256, "dim": 32}
    # (256, 32) belongs to both sweeps and is timed once.
    got = {(p["batch"], p["dim"]): p["sweeps"] for p in data["points"]}
    assert got == {(256, 8): ["dim"], (256, 32): ["batch", "dim"], (512, 32): ["batch"]}
    for point in data["points"]:
        assert point["rows"] >= point["batch"]
        assert point["rows"] * point["dim"] * 4 >= 1 << 20  # the table holds --table-mb at every width
        assert point["bound GB/s"]["h2d"] > 0 and point["bound GB/s"]["d2h"] > 0
        ways = {(r["way"], r["dir"]) for r in point["transfer"]}
        assert ways == {("speedtorch", "h2d"), ("speedtorch", "d2h"), ("torch", "h2d"), ("torch", "d2h")}
        for r in point["transfer"]:
            assert r["ms"] > 0
            assert r["GB/s"] == pytest.approx(point["batch"] * point["dim"] * 4 / (r["ms"] * 1e6))
            assert r["of bound"] == pytest.approx(r["GB/s"] / point["bound GB/s"][r["dir"]])
        assert 0 < point["distinct ids"] <= point["batch"]
        assert point["step bound ms"] > 0
        reference = "cpu_sparse_adam" if data["device"] == "CPU (no GPU)" else "gpu_sparse_adam"
        assert {r["way"] for r in point["step"]} == {"speedtorch", reference}
        for r in point["step"]:
            assert r["ms"] > 0
            assert 0.0 < r["first loss"] < 10.0 and 0.0 < r["last loss"] < 10.0


def test_plot_script_draws_the_sweep(tiny_sweep, tmp_path):
    pytest.importorskip("matplotlib")
    out, _ = tiny_sweep
    result = run_script(BENCH / "plot_sweeps.py", out, "--out", tmp_path, "--prefix", "tiny_", timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    for name in ("tiny_transfer.png", "tiny_step.png"):
        data = (tmp_path / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        assert len(data) > 10_000  # two panels with axes and lines, not an empty canvas


def test_plot_script_refuses_a_sweep_with_a_missing_axis(tiny_sweep, tmp_path):
    pytest.importorskip("matplotlib")
    out, _ = tiny_sweep
    data = json.loads(out.read_text())
    data["points"] = [p for p in data["points"] if p["sweeps"] == ["batch"]]
    partial = tmp_path / "partial.json"
    partial.write_text(json.dumps(data))
    result = run_script(BENCH / "plot_sweeps.py", partial, "--out", tmp_path, timeout=300)
    assert result.returncode == 1
    assert "no point of the dim sweep" in result.stdout


def import_seed_module():
    sys.path.insert(0, str(BENCH))
    try:
        import seed_speedtorch
    finally:
        sys.path.remove(str(BENCH))
    return seed_speedtorch


def seed_or_skip():
    seed_speedtorch = import_seed_module()
    reason = seed_speedtorch.availability()
    if reason:
        pytest.skip(reason)
    return seed_speedtorch


def test_seed_speedtorch_says_what_is_missing(tmp_path, monkeypatch):
    seed_speedtorch = import_seed_module()
    monkeypatch.setattr(seed_speedtorch, "SEED_DIR", tmp_path / "nothing-here")
    with pytest.raises(seed_speedtorch.SeedUnavailable, match="make seed-speedtorch"):
        seed_speedtorch.load(need_gpu=False)
    assert "make seed-speedtorch" in seed_speedtorch.availability()


def test_seed_speedtorch_imports_from_its_folder():
    """The real SpeedTorch 0.1.6 files, imported in a fresh process from build-deps/seed-speedtorch with CuPy
    adapted (no GPU needed for the import): present where `make seed-speedtorch` ran and CuPy is installed."""
    if not (ROOT / "build-deps" / "seed-speedtorch" / "SpeedTorch" / "__init__.py").is_file():
        pytest.skip("SpeedTorch 0.1.6 not installed here (make seed-speedtorch)")
    pytest.importorskip("cupy")
    result = run_script(BENCH / "seed_speedtorch.py", timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    folder = ROOT / "build-deps" / "seed-speedtorch" / "SpeedTorch"
    assert f"SpeedTorch 0.1.6 imported from {folder} " in result.stdout
    assert "has ModelFactory, OptimizerFactory, DataGadget" in result.stdout


def pinned_collection(cupy, array):
    """A CuPy collection in SpeedTorch's pinned memory, read whole into a CPU tensor through a CuPy gather (the path
    the benchmarks time), not a raw copy of a host pointer CuPy takes for a device one."""
    import torch

    return torch.from_numpy(cupy.asnumpy(array[cupy.arange(array.shape[0])]))


@pytest.mark.gpu
def test_seed_speedtorch_switchers_move_the_rows_asked_for():
    """SpeedTorch's ModelFactory through the benchmark's adapter: the rows it gathers and writes back are the ones
    named (so the benchmark times real work)."""
    import torch

    seed_speedtorch = seed_or_skip()
    transfer = seed_speedtorch.SeedTransfer(1000, 8, "cuda")
    full = pinned_collection(transfer.cupy, transfer.switcher.CUPYcorpus)
    idx = torch.tensor([5, 999, 0, 17], device="cuda")
    rows = transfer.gather(transfer.indices(idx))
    torch.testing.assert_close(rows.cpu(), full[idx.cpu()])
    transfer.variable.weight.data = torch.full((4, 8), 2.5, device="cuda")
    transfer.scatter(transfer.indices(idx))
    expected = full.clone()
    expected[idx.cpu()] = 2.5
    torch.testing.assert_close(pinned_collection(transfer.cupy, transfer.switcher.CUPYcorpus), expected)


@pytest.mark.gpu
def test_seed_speedtorch_way_takes_one_adam_step_on_the_batch_rows():
    """The training way SpeedTorch-style: Adam's first step moves each weight of a touched row by lr (the bias-
    corrected m / sqrt(v) is the gradient's sign), and leaves the other rows as they were."""
    import torch

    seed_speedtorch = seed_or_skip()
    lr = 1e-3
    way = seed_speedtorch.SeedSpeedTorchWay(1000, 8, 50, torch.device("cuda"), lr)
    before = pinned_collection(way.cupy, way.user_switcher.CUPYcorpus)
    users = torch.tensor([1, 2, 3, 3], device="cuda")
    loss = way.step(users, torch.tensor([4, 5, 6, 7], device="cuda"), torch.tensor([1.0, 0.0, 1.0, 0.0], device="cuda"))
    assert torch.isfinite(loss)
    after = pinned_collection(way.cupy, way.user_switcher.CUPYcorpus)
    touched = [1, 2, 3]
    torch.testing.assert_close((after[touched] - before[touched]).abs(), torch.full((3, 8), lr), atol=1e-6, rtol=0)
    others = [i for i in range(1000) if i not in touched]
    assert torch.equal(after[others], before[others])
    # The Adam state went back to its pinned collections too: the first moment of a touched row is 0.1 * grad.
    exp_avg = pinned_collection(way.cupy, way.opt_switcher.CUPYcorpi[0])
    assert exp_avg[touched].abs().sum() > 0 and exp_avg[others].abs().sum() == 0
