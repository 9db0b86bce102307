"""speedtorch.jit_save: re-saving a scripted model that holds a PinnedEmbedding either succeeds or leaves the file
that was there intact and loadable (plain torch.jit.save truncates it first: the failure it fixes)."""

from __future__ import annotations

import os

import pytest
import torch

import speedtorch


class Holder(torch.nn.Module):
    def __init__(self, rows: int):
        super().__init__()
        self.emb = speedtorch.PinnedEmbedding(rows, 8)
        self.emb.set_optimizer("adam", {"lr": 0.1}, True)
        self.emb.normal_(0.0, 1.0, 0)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.emb.gather(ids, None)


def _scripted(rows: int = 100):
    return torch.jit.script(Holder(rows))


def _first_rows(path) -> torch.Tensor:
    return torch.jit.load(str(path))(torch.arange(3))


def test_plain_torch_jit_save_loses_the_old_file_when_pickling_fails(tmp_path, monkeypatch):
    """Why jit_save exists: torch truncates the file before our pickling can refuse."""
    path = tmp_path / "model.pt"
    torch.jit.save(_scripted(), str(path))
    monkeypatch.setenv("SPEEDTORCH_INLINE_MAX_BYTES", "1000")  # the table has grown past it, no sidecar set
    with pytest.raises(RuntimeError, match=r"Call set_sidecar"):
        torch.jit.save(_scripted(), str(path))
    with pytest.raises(RuntimeError):
        torch.jit.load(str(path))


def test_jit_save_keeps_the_old_file_when_pickling_fails(tmp_path, monkeypatch):
    path = tmp_path / "model.pt"
    speedtorch.jit_save(_scripted(), path)
    before = _first_rows(path)
    monkeypatch.setenv("SPEEDTORCH_INLINE_MAX_BYTES", "1000")
    with pytest.raises(RuntimeError, match=r"Call set_sidecar"):
        speedtorch.jit_save(_scripted(200), path)
    assert torch.equal(_first_rows(path), before)  # the old model, whole
    assert sorted(os.listdir(tmp_path)) == ["model.pt"]  # no temporary left behind


def test_jit_save_keeps_the_old_file_when_the_sidecar_cannot_be_written(tmp_path):
    path = tmp_path / "model.pt"
    speedtorch.jit_save(_scripted(), path)
    model = _scripted()
    model.emb.set_sidecar(str(tmp_path / "no-such-folder" / "users.npy"))
    with pytest.raises(RuntimeError):
        speedtorch.jit_save(model, path)
    assert _first_rows(path).shape == (3, 8)


def test_jit_save_replaces_the_file_when_it_succeeds(tmp_path):
    path = tmp_path / "model.pt"
    speedtorch.jit_save(_scripted(), path)
    model = _scripted()
    model.emb.copy_(torch.full((100, 8), 7.0))
    speedtorch.jit_save(model, path)
    assert torch.equal(_first_rows(path), torch.full((3, 8), 7.0))
    assert sorted(os.listdir(tmp_path)) == ["model.pt"]
