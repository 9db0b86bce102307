"""speedtorch.PinnedEmbedding (torch.classes.speedtorch.PinnedEmbedding) from Python and TorchScript."""

from __future__ import annotations

import copy
import os

import pytest
import torch
from helpers import last_wins_reference

import speedtorch


def test_construction_and_sizes():
    e = speedtorch.PinnedEmbedding(1000, 64)
    assert (e.num_rows(), e.dim()) == (1000, 64)
    assert e.nbytes() == 1000 * 64 * 4
    assert e.table().dtype == torch.float32 and e.table().shape == (1000, 64)
    assert e.is_pinned() == e.table().is_pinned()
    assert torch.count_nonzero(e.table()) == 0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_tables(dtype):
    e = speedtorch.PinnedEmbedding(10, 4, dtype)
    assert e.table().dtype == dtype and e.nbytes() == 10 * 4 * 2


def test_bad_construction():
    with pytest.raises(RuntimeError, match="num_rows must be >= 0"):
        speedtorch.PinnedEmbedding(-1, 4)
    with pytest.raises(RuntimeError, match="dim must be > 0"):
        speedtorch.PinnedEmbedding(10, 0)
    with pytest.raises(RuntimeError, match="dtype must be float32, float16 or bfloat16"):
        speedtorch.PinnedEmbedding(10, 4, torch.int64)


def test_initialisers_are_seeded_and_in_place():
    e = speedtorch.PinnedEmbedding(50_000, 8)
    ptr = e.table().data_ptr()
    e.uniform_(-0.5, 0.5, 7)
    first = e.table().clone()
    assert first.min() >= -0.5 and first.max() <= 0.5 and first.std() > 0.2
    e.uniform_(-0.5, 0.5, 7)
    assert torch.equal(first, e.table())
    e.normal_(1.0, 2.0, 3)
    t = e.table()
    assert abs(float(t.mean()) - 1.0) < 0.05 and abs(float(t.std()) - 2.0) < 0.05
    e.zero_()
    assert torch.count_nonzero(e.table()) == 0
    assert e.table().data_ptr() == ptr


def test_seed_does_not_depend_on_thread_count():
    previous = torch.get_num_threads()
    e = speedtorch.PinnedEmbedding(40_000, 4)
    try:
        torch.set_num_threads(1)
        e.normal_(0.0, 1.0, 11)
        one = e.table().clone()
        torch.set_num_threads(2)
        e.normal_(0.0, 1.0, 11)
    finally:
        torch.set_num_threads(previous)
    assert torch.equal(one, e.table())


def test_unseeded_init_follows_torch_manual_seed():
    e = speedtorch.PinnedEmbedding(100, 4)
    torch.manual_seed(5)
    e.uniform_(-1.0, 1.0)
    a = e.table().clone()
    torch.manual_seed(5)
    e.uniform_(-1.0, 1.0)
    assert torch.equal(a, e.table())


def test_initialiser_arguments_checked():
    e = speedtorch.PinnedEmbedding(10, 4)
    with pytest.raises(RuntimeError, match="low .* must be <= high"):
        e.uniform_(1.0, 0.0)
    with pytest.raises(RuntimeError, match="std must be >= 0"):
        e.normal_(0.0, -1.0)
    with pytest.raises(RuntimeError, match=r"src must have shape \[10, 4\]"):
        e.copy_(torch.randn(3, 4))


def test_copy_gather_scatter():
    e = speedtorch.PinnedEmbedding(64, 6)
    values = torch.randn(64, 6)
    e.copy_(values)
    indices = torch.randint(0, 64, (4, 5))
    torch.testing.assert_close(e.gather(indices), values[indices], rtol=0, atol=0)
    src = torch.randn(4, 5, 6)
    expected = last_wins_reference(values, indices, src)
    assert e.scatter_(indices, src).data_ptr() == e.table().data_ptr()
    torch.testing.assert_close(e.table(), expected, rtol=0, atol=0)


def _with_state(dtype, optimizer, beside, dim=6):
    e = speedtorch.PinnedEmbedding(40, dim, dtype)
    e.copy_(torch.randn(40, dim).to(dtype))
    e.set_optimizer(optimizer, {"lr": 0.1}, beside)
    e.state().uniform_()  # so the state read is not the zeros it starts as
    return e


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("optimizer", ["rowwise_adagrad", "adam"])
@pytest.mark.parametrize("beside", [True, False])
def test_gather_with_state_is_gather_and_the_state_rows(dtype, optimizer, beside):
    e = _with_state(dtype, optimizer, beside, dim=5 if dtype == torch.float16 else 6)
    ids = torch.tensor([7, 0, 39, 7, 12])
    rows, state = e.gather_with_state(ids, None)
    torch.testing.assert_close(rows, e.gather(ids), rtol=0, atol=0)
    torch.testing.assert_close(state, e.state()[ids], rtol=0, atol=0)
    # State beside the rows: one read of whole records, the two views of one tensor.
    assert (rows.untyped_storage().data_ptr() == state.untyped_storage().data_ptr()) == beside
    rows.add_(1.0)  # a copy: the table is untouched
    torch.testing.assert_close(e.gather(ids) + 1.0, rows, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("beside", [True, False])
@pytest.mark.parametrize("records", [True, False])
def test_scatter_with_state_writes_what_gather_with_state_reads(dtype, beside, records):
    e = _with_state(dtype, "adam", beside)
    ids = torch.tensor([2, 9, 31])
    rows, state = e.gather_with_state(ids, None)
    if not records:  # rows and state of tensors of their own: two writes
        rows, state = rows.clone(), state.clone()
    rows.mul_(2.0)
    state.add_(1.0)
    before = e.table().clone(), e.state().clone()
    e.scatter_with_state_(ids, rows, state, 7)
    expected_rows, expected_state = before[0].clone(), before[1].clone()
    expected_rows[ids], expected_state[ids] = rows, state
    assert torch.equal(e.table(), expected_rows) and torch.equal(e.state(), expected_state)
    assert e.step_count() == 7


def test_scatter_with_state_refuses_what_does_not_fit():
    e = _with_state(torch.float32, "adam", True)
    rows, state = e.gather_with_state(torch.tensor([1, 2]), None)
    with pytest.raises(RuntimeError, match=r"state must be 2 x 16 Float, got \[2, 4\]"):
        e.scatter_with_state_(torch.tensor([1, 2]), rows, state[:, :4], 1)
    with pytest.raises(RuntimeError, match="step must be >= 0"):
        e.scatter_with_state_(torch.tensor([1, 2]), rows, state, -1)
    with pytest.raises(RuntimeError, match="no optimizer state"):
        speedtorch.PinnedEmbedding(10, 6).scatter_with_state_(torch.tensor([1]), torch.ones(1, 6), torch.ones(1, 4), 1)
    assert e.step_count() == 0


def test_gather_with_state_refuses_what_it_cannot_read():
    with pytest.raises(RuntimeError, match="the table has no optimizer state; call set_optimizer first"):
        speedtorch.PinnedEmbedding(10, 4).gather_with_state(torch.tensor([1]), None)
    with pytest.raises(RuntimeError, match=r"indices must be 1-D, got shape \[1, 1\]"):
        _with_state(torch.float32, "adam", True).gather_with_state(torch.tensor([[1]]), None)
    with pytest.raises(IndexError):
        _with_state(torch.float32, "adam", True).gather_with_state(torch.tensor([40]), None)


class _Lookup(torch.nn.Module):
    def __init__(self, table):
        super().__init__()
        self.table = table

    def forward(self, indices: torch.Tensor) -> torch.Tensor:
        return self.table.gather(indices, None).sum(-1)


def test_torchscript_module_with_pinned_embedding_attribute():
    e = speedtorch.PinnedEmbedding(32, 4)
    e.normal_(0.0, 1.0, 1)
    scripted = torch.jit.script(_Lookup(e))
    indices = torch.tensor([[1, 2], [3, 31]])
    torch.testing.assert_close(scripted(indices), e.table()[indices].sum(-1), rtol=0, atol=0)


def _file_versions(stem) -> dict:
    """inode and mtime of a sidecar's files: a save replaces them (new inodes) and writes them (new mtimes)."""
    return {suffix: (os.stat(f"{stem}{suffix}").st_ino, os.stat(f"{stem}{suffix}").st_mtime_ns)
            for suffix in (".npy", ".state.npy", ".meta.json")}


def test_copying_a_scripted_model_leaves_its_sidecar_alone(tmp_path):
    e = speedtorch.PinnedEmbedding(64, 8)
    e.normal_(0.0, 1.0, 2)
    e.set_optimizer("adam", {"lr": 0.1}, True)
    e.apply_gradients(torch.tensor([1, 5]), torch.ones(2, 8))
    e.set_sidecar(str(tmp_path / "side.npy"))
    scripted = torch.jit.script(_Lookup(e))
    torch.jit.save(scripted, str(tmp_path / "model.pt"))
    saved = _file_versions(tmp_path / "side")

    indices = torch.tensor([[1, 2], [5, 63]])
    for copied in (copy.deepcopy(scripted), copy.copy(scripted)):  # both pickle the table
        torch.testing.assert_close(copied(indices), scripted(indices), rtol=0, atol=0)
    assert _file_versions(tmp_path / "side") == saved
    torch.jit.save(scripted, str(tmp_path / "again.pt"))  # nothing changed: nothing to write either
    assert _file_versions(tmp_path / "side") == saved

    e.apply_gradients(torch.tensor([2]), torch.ones(1, 8))  # a changed table is saved
    torch.jit.save(scripted, str(tmp_path / "model.pt"))
    changed = _file_versions(tmp_path / "side")
    assert all(changed[suffix][0] != saved[suffix][0] for suffix in saved)
    loaded = torch.jit.load(str(tmp_path / "model.pt"))
    assert loaded.table.step_count() == 2
    torch.testing.assert_close(loaded(indices), scripted(indices), rtol=0, atol=0)
    copy.deepcopy(scripted)
    assert _file_versions(tmp_path / "side") == changed


@pytest.mark.gpu
def test_gather_to_gpu_and_back():
    e = speedtorch.PinnedEmbedding(5000, 32)
    e.normal_(0.0, 1.0, 2)
    assert e.is_pinned()
    indices = torch.randint(0, 5000, (1000,), device="cuda")
    rows = e.gather(indices)
    assert rows.device.type == "cuda"
    torch.testing.assert_close(rows.cpu(), e.table()[indices.cpu()], rtol=0, atol=0)
    unique = torch.unique(indices)
    e.scatter_(unique, torch.full((unique.numel(), 32), 3.0, device="cuda"))
    torch.cuda.synchronize()
    assert bool((e.table()[unique.cpu()] == 3.0).all())


@pytest.mark.gpu
@pytest.mark.parametrize("beside", [True, False])
def test_gather_with_state_to_the_gpu(beside):
    e = _with_state(torch.bfloat16, "adam", beside)
    ids = torch.unique(torch.randint(0, 40, (30,), device="cuda"))
    rows, state = e.gather_with_state(ids, torch.device("cuda"))
    assert rows.device.type == state.device.type == "cuda"
    torch.testing.assert_close(rows.cpu(), e.table()[ids.cpu()], rtol=0, atol=0)
    torch.testing.assert_close(state.cpu(), e.state()[ids.cpu()], rtol=0, atol=0)
