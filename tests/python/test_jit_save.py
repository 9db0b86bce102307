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


def test_plain_torch_jit_save_inlines_a_table_past_the_limit_with_a_warning(tmp_path, monkeypatch, capfd):
    """torch.jit.save truncates the file before our pickling runs, so a refusal there destroyed the model already
    saved at that path: a table past SPEEDTORCH_INLINE_MAX_BYTES is now kept inline, with a warning (torch's
    serialization passes C++ warnings to stderr, not to Python's warnings)."""
    path = tmp_path / "model.pt"
    torch.jit.save(_scripted(), str(path))
    monkeypatch.setenv("SPEEDTORCH_INLINE_MAX_BYTES", "1000")  # the table has grown past it, no sidecar set
    model = _scripted(200)
    model.emb.copy_(torch.full((200, 8), 3.0))
    capfd.readouterr()
    torch.jit.save(model, str(path))
    assert "SPEEDTORCH_INLINE_MAX_BYTES" in capfd.readouterr().err
    loaded = torch.jit.load(str(path))
    assert torch.equal(loaded.emb.table(), model.emb.table()) and torch.equal(loaded.emb.state(), model.emb.state())


def test_plain_torch_jit_save_keeps_the_table_inline_when_the_sidecar_cannot_be_written(tmp_path, capfd):
    """torch truncates the file before our pickling runs: a refusal there (an unwritable sidecar) used to leave
    neither the old model nor the new one. The table is pickled inline instead, with a warning naming the sidecar
    (on stderr, as above)."""
    path = tmp_path / "model.pt"
    torch.jit.save(_scripted(), str(path))
    model = _scripted()
    model.emb.copy_(torch.full((100, 8), 7.0))
    model.emb.set_sidecar(str(tmp_path / "no-such-folder" / "users.npy"))
    capfd.readouterr()
    torch.jit.save(model, str(path))
    warning = capfd.readouterr().err
    assert "no-such-folder" in warning and "pickled inline instead" in warning
    loaded = torch.jit.load(str(path))
    assert torch.equal(loaded.emb.table(), model.emb.table()) and torch.equal(loaded.emb.state(), model.emb.state())
    assert loaded.emb.step_count() == model.emb.step_count()
    assert not (tmp_path / "no-such-folder").exists()


def test_jit_save_keeps_the_old_file_when_pickling_fails(tmp_path):
    path = tmp_path / "model.pt"
    speedtorch.jit_save(_scripted(), path)
    before = _first_rows(path)
    model = _scripted(200)
    model.emb.set_sidecar(str(tmp_path / "no-such-folder" / "users.npy"))
    with pytest.raises(RuntimeError, match="no-such-folder"):
        speedtorch.jit_save(model, path)
    assert torch.equal(_first_rows(path), before)  # the old model, whole
    assert sorted(os.listdir(tmp_path)) == ["model.pt"]  # no temporary left behind


def test_jit_save_keeps_the_old_file_when_the_sidecar_cannot_be_written(tmp_path):
    path = tmp_path / "model.pt"
    speedtorch.jit_save(_scripted(), path)
    before = _first_rows(path)
    model = _scripted()
    model.emb.copy_(torch.full((100, 8), 7.0))  # the new model differs from the saved one
    model.emb.set_sidecar(str(tmp_path / "no-such-folder" / "users.npy"))
    with pytest.raises(RuntimeError, match="no-such-folder"):
        speedtorch.jit_save(model, path)
    assert _first_rows(path).shape == (3, 8)
    assert torch.equal(_first_rows(path), before) and not torch.equal(before, torch.full((3, 8), 7.0))
    assert sorted(os.listdir(tmp_path)) == ["model.pt"]  # no temporary left behind
    # The setting is restored: a plain torch.jit.save afterwards falls back to inline, with a warning.
    torch.jit.save(model, str(tmp_path / "plain.pt"))
    assert torch.equal(torch.jit.load(str(tmp_path / "plain.pt")).emb.table(), model.emb.table())


def test_concurrent_jit_saves_to_one_path_each_land_whole(tmp_path):
    """Each call has a temporary of its own: 4 threads x 5 saves to one path used to collide on one temporary name
    (FileNotFoundError). The file ends as one of the models, whole, and no temporary is left."""
    import threading

    path = tmp_path / "model.pt"
    models = []
    for value in range(4):
        model = _scripted()
        model.emb.copy_(torch.full((100, 8), float(value)))
        models.append(model)
    errors = []

    def save_five(model):
        try:
            for _ in range(5):
                speedtorch.jit_save(model, path)
        except BaseException as error:  # noqa: BLE001 (reported below)
            errors.append(error)

    threads = [threading.Thread(target=save_five, args=(m,)) for m in models]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    rows = _first_rows(path)
    assert any(torch.equal(rows, torch.full((3, 8), float(v))) for v in range(4))
    assert sorted(os.listdir(tmp_path)) == ["model.pt"]


def test_jit_save_keeps_the_mode_of_the_file_it_replaces(tmp_path):
    path = tmp_path / "model.pt"
    speedtorch.jit_save(_scripted(), path)
    os.chmod(path, 0o600)
    speedtorch.jit_save(_scripted(), path)
    assert (os.stat(path).st_mode & 0o777) == 0o600
    old = os.umask(0o022)
    try:
        speedtorch.jit_save(_scripted(), tmp_path / "new.pt")  # a new file: the umask's mode, as open() gives
    finally:
        os.umask(old)
    assert (os.stat(tmp_path / "new.pt").st_mode & 0o777) == 0o644


def test_jit_save_replaces_the_file_when_it_succeeds(tmp_path):
    path = tmp_path / "model.pt"
    speedtorch.jit_save(_scripted(), path)
    model = _scripted()
    model.emb.copy_(torch.full((100, 8), 7.0))
    speedtorch.jit_save(model, path)
    assert torch.equal(_first_rows(path), torch.full((3, 8), 7.0))
    assert sorted(os.listdir(tmp_path)) == ["model.pt"]
