"""Files and placement (speedtorch.data, PinnedEmbedding.save/load/open, HostEmbedding.save/load, placement='gpu' /
'hybrid'): .npy files NumPy agrees with, header validation, round trips that keep optimizer state, memory-mapped
tables, and the three placements training to the same result. Faults (kills, truncation, bit flips) are in
test_reliability.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import speedtorch
from speedtorch import data
from speedtorch.nn import HostEmbedding
from speedtorch.nn.placement import DeviceTable, HybridTable

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
TABLE_DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def trained_table(num_rows=300, dim=12, dtype=torch.float32, optimizer="adam", steps=3, beside=True):
    emb = speedtorch.PinnedEmbedding(num_rows, dim, dtype)
    emb.set_optimizer(optimizer, {"lr": 0.05}, beside)
    emb.uniform_(-1.0, 1.0, 7)
    gen = torch.Generator().manual_seed(3)
    for _ in range(steps):
        ids = torch.randint(0, num_rows, (40,), generator=gen)
        emb.apply_gradients(ids, torch.randn(40, dim, generator=gen))
    return emb


# --- .npy tensors ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64, torch.int64, torch.int32,
                                   torch.uint8])
def test_save_npy_is_what_numpy_reads(tmp_path, dtype):
    tensor = (torch.randn(37, 5, 3) * 50).to(dtype)
    data.save_npy(tensor, tmp_path / "t.npy")
    np.testing.assert_array_equal(np.load(tmp_path / "t.npy"), tensor.numpy())
    assert data.npy_info(tmp_path / "t.npy") == (dtype, (37, 5, 3))


def test_bfloat16_round_trips_as_raw_bits(tmp_path):
    tensor = torch.randn(20, 8).to(torch.bfloat16)
    data.save_npy(tensor, tmp_path / "b.npy")
    on_disk = np.load(tmp_path / "b.npy")
    assert on_disk.dtype == np.uint16
    np.testing.assert_array_equal(on_disk, tensor.view(torch.uint16).numpy())
    back = torch.empty(20, 8, dtype=torch.bfloat16)
    data.load_npy_into_(back, tmp_path / "b.npy")
    assert torch.equal(back, tensor)


def test_load_npy_gives_bfloat16_back(tmp_path):
    """A bfloat16 table saved by PinnedEmbedding.save loads as bfloat16 (its meta file says so); a plain '<u2' file
    cannot say, so it loads as uint16 unless dtype=torch.bfloat16 asks for the same bits as bfloat16."""
    table = speedtorch.PinnedEmbedding(20, 8, torch.bfloat16)
    table.normal_(0.0, 1.0, 0)
    table.save(str(tmp_path / "t.npy"))
    back = data.load_npy(tmp_path / "t.npy")
    assert back.dtype == torch.bfloat16
    assert torch.equal(back.view(torch.uint16), table.table().view(torch.uint16))  # bit for bit
    assert back.is_pinned() == speedtorch.pinned_empty(1).is_pinned()

    tensor = torch.randn(20, 8).to(torch.bfloat16)
    data.save_npy(tensor, tmp_path / "b.npy")
    assert data.load_npy(tmp_path / "b.npy").dtype == torch.uint16
    back = data.load_npy(tmp_path / "b.npy", dtype=torch.bfloat16)
    assert back.dtype == torch.bfloat16 and torch.equal(back.view(torch.uint16), tensor.view(torch.uint16))
    assert data.load_npy(tmp_path / "b.npy", dtype=torch.uint16).dtype == torch.uint16
    with pytest.raises(ValueError, match="holds uint16.*dtype=torch.float32"):
        data.load_npy(tmp_path / "b.npy", dtype=torch.float32)


def test_save_npy_takes_strided_tensors_and_the_same_data_hashes_the_same(tmp_path):
    base = torch.randn(30, 16)
    strided = base[::2, 3:11]
    hash_strided = data.save_npy(strided, tmp_path / "s.npy")
    hash_dense = data.save_npy(strided.contiguous(), tmp_path / "d.npy")
    np.testing.assert_array_equal(np.load(tmp_path / "s.npy"), strided.numpy())
    assert hash_strided == hash_dense and len(hash_strided) == 16
    assert data.save_npy(strided + 1, tmp_path / "e.npy") != hash_dense


def test_content_hash_is_the_hash_save_npy_returns_without_writing(tmp_path):
    # What the quantized serving model of torchscript_examples/ checks a mapped table file against at load.
    base = torch.randn(40, 24)
    for tensor in (base, base[::3, 5:17], base.t(), base[:, :0], torch.randn(5, 6, 7), base.to(torch.bfloat16)):
        assert data.content_hash(tensor) == data.save_npy(tensor, tmp_path / "t.npy")
    mapped = data.open_npy(tmp_path / "t.npy")
    assert data.content_hash(mapped) == data.save_npy(base.to(torch.bfloat16), tmp_path / "u.npy")
    assert data.content_hash(base + 1) != data.content_hash(base)


def test_resolve_sidecar_path_follows_the_sidecar_rule(monkeypatch):
    monkeypatch.delenv("SPEEDTORCH_SIDECAR_DIR", raising=False)
    assert torch.ops.speedtorch.resolve_sidecar_path("t.npy") == "t.npy"
    monkeypatch.setenv("SPEEDTORCH_SIDECAR_DIR", "/srv/tables")
    assert torch.ops.speedtorch.resolve_sidecar_path("t.npy") == "/srv/tables/t.npy"
    assert torch.ops.speedtorch.resolve_sidecar_path("/abs/t.npy") == "/abs/t.npy"


@pytest.mark.gpu
def test_content_hash_refuses_a_gpu_tensor():
    with pytest.raises(RuntimeError, match="must be in host memory"):
        data.content_hash(torch.ones(3, 4, device="cuda"))


def test_load_npy_reads_numpy_files_and_converts_floats(tmp_path):
    array = np.random.default_rng(0).standard_normal((50, 9))
    np.save(tmp_path / "f64.npy", array)
    loaded = data.load_npy(tmp_path / "f64.npy")
    assert loaded.dtype == torch.float64 and loaded.device.type == "cpu"
    np.testing.assert_array_equal(loaded.numpy(), array)
    into = torch.empty(50, 9, dtype=torch.float32)
    data.load_npy_into_(into, tmp_path / "f64.npy")
    torch.testing.assert_close(into, torch.from_numpy(array).float())


@pytest.mark.gpu
def test_load_npy_pins_and_loads_into_gpu_tensors(tmp_path):
    array = np.random.default_rng(1).standard_normal((300, 64)).astype(np.float32)
    np.save(tmp_path / "a.npy", array)
    assert data.load_npy(tmp_path / "a.npy").is_pinned()
    on_gpu = torch.empty(300, 64, device="cuda")
    data.load_npy_into_(on_gpu, tmp_path / "a.npy")
    np.testing.assert_array_equal(on_gpu.cpu().numpy(), array)
    data.save_npy(on_gpu * 2, tmp_path / "b.npy")
    np.testing.assert_array_equal(np.load(tmp_path / "b.npy"), array * 2)


@pytest.mark.parametrize("make, message", [
    (lambda p: np.save(p, np.asfortranarray(np.ones((4, 3), np.float32))), "Fortran"),
    (lambda p: np.save(p, np.ones((4, 3), ">f4")), "big-endian"),
    (lambda p: np.save(p, np.array([1 + 2j, 3j])), "unsupported dtype .<c16"),
    (lambda p: np.save(p, np.array(["a", "b"])), "<U1"),
    (lambda p: p.write_bytes(b"NOTNUMPY" + bytes(100)), "not a .npy file"),
    (lambda p: p.write_bytes(np.lib.format.magic(1, 0) + b"\x10\x00{'descr': '<f4'}    \n"), "header"),
])
def test_bad_headers_are_rejected_with_a_clear_error(tmp_path, make, message):
    path = tmp_path / "bad.npy"
    make(path)
    with pytest.raises(RuntimeError, match=message):
        data.load_npy(path)


def test_truncated_npy_is_rejected(tmp_path):
    np.save(tmp_path / "t.npy", np.ones((100, 4), np.float32))
    raw = (tmp_path / "t.npy").read_bytes()
    (tmp_path / "t.npy").write_bytes(raw[:-1])
    with pytest.raises(RuntimeError, match="truncated"):
        data.npy_info(tmp_path / "t.npy")
    with pytest.raises(RuntimeError, match="shape"):
        data.load_npy_into_(torch.empty(99, 4), tmp_path / "t.npy")


def test_open_npy_modes(tmp_path):
    path = tmp_path / "m.npy"
    np.save(path, np.arange(60, dtype=np.float32).reshape(20, 3))
    read_only = data.open_npy(path, "r")
    assert read_only[4, 1] == 13
    copy_on_write = data.open_npy(path, "c")
    copy_on_write[0, 0] = -1
    assert np.load(path)[0, 0] == 0
    shared = data.open_npy(path, "r+")
    shared[1, 2] = 99
    del shared
    assert np.load(path)[1, 2] == 99
    with pytest.raises(RuntimeError, match="mode"):
        data.open_npy(path, "w")


def test_saving_onto_a_file_mapped_read_write_never_orphans_the_mapping(tmp_path):
    """save_npy onto the file an 'r+' tensor maps used to rename a new file over it: the tensor kept mapping the
    old, unlinked one and every later write was lost. One rule (csrc/io/mapped_file_guard.h), as
    PinnedEmbedding.save: saving the mapped data itself writes it back in place; anything else is refused."""
    path = tmp_path / "m.npy"
    np.save(path, np.arange(60, dtype=np.float32).reshape(20, 3))
    shared = data.open_npy(path, "r+")
    shared[0, 0] = -7.0
    assert data.save_npy(shared, path) == data.save_npy(shared.clone(), tmp_path / "copy.npy")  # the same hash
    shared[1, 1] = 42.0  # a write after the save still reaches the file
    assert np.load(path)[0, 0] == -7.0 and np.load(path)[1, 1] == 42.0
    for other in (torch.zeros(20, 3), shared[:5], shared.t()):  # other data, a part of the mapping, another layout
        with pytest.raises(RuntimeError, match="mapped read-write"):
            data.save_npy(other, path)
    emb = trained_table(20, 3)
    with pytest.raises(RuntimeError, match="mapped read-write"):
        emb.save(str(path))  # a table's save onto that file: the same rule
    shared[2, 2] = 5.0
    assert np.load(path)[2, 2] == 5.0 and np.load(path)[1, 1] == 42.0
    del shared, other
    data.save_npy(torch.zeros(4), path)  # no mapping left: an ordinary save
    assert np.load(path).shape == (4,)
    # A PinnedEmbedding opened 'r+' and saved onto its own files is flushed (as before), and so is its table
    # saved as a tensor.
    emb.save(str(tmp_path / "t"))
    mapped = data.open_embedding(tmp_path / "t", "r+")
    mapped.scatter_(torch.tensor([3]), torch.full((1, 3), 9.0))
    mapped.save(str(tmp_path / "t"))
    data.save_npy(mapped.table(), tmp_path / "t.npy")
    mapped.scatter_(torch.tensor([4]), torch.full((1, 3), 8.0))
    mapped.flush()
    back = speedtorch.PinnedEmbedding.load(str(tmp_path / "t"), True).table()
    assert torch.equal(back[3], torch.full((3,), 9.0)) and torch.equal(back[4], torch.full((3,), 8.0))


# A torch write into a mode 'r' mapping: numpy's mmap_mode='r' raises, torch has no read-only tensors. It was a
# SIGSEGV; now, as torch.load(mmap=True), the pages are private: the write stays in this process, never in the file.
_TORCH_WRITES_READ_ONLY_MAPPING = """
import sys
import numpy as np
import torch
from speedtorch import data
from speedtorch.nn import HostEmbedding

path, table_path = sys.argv[1], sys.argv[2]
for pin in (False, True):
    t = data.open_npy(path, "r", pin=pin)
    t.mul_(2)
    assert float(t[1, 0]) == 6.0, float(t[1, 0])  # this process sees its write
    assert float(np.load(path)[1, 0]) == 3.0  # the file never does
emb = HostEmbedding.load(table_path, mmap_mode="r", device="cpu")
emb.weight.uniform_()
print("no crash")
"""


def test_a_torch_write_into_a_read_only_mapping_never_crashes(tmp_path):
    path = tmp_path / "r.npy"
    np.save(path, np.arange(15, dtype=np.float32).reshape(5, 3))
    trained_table(10, 4).save(str(tmp_path / "t"))
    table_bytes = (tmp_path / "t.npy").read_bytes()
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root / "python"), os.environ.get("PYTHONPATH", "")]))
    result = subprocess.run([sys.executable, "-c", _TORCH_WRITES_READ_ONLY_MAPPING, str(path),
                             str(tmp_path / "t")], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, f"exit status {result.returncode}\n{result.stdout}\n{result.stderr}"
    assert "no crash" in result.stdout
    assert (tmp_path / "t.npy").read_bytes() == table_bytes


def _memory_commit_bytes() -> int:
    fields = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    return sum(int(fields[name].split()[0]) * 1024 for name in ("MemTotal", "SwapTotal"))


@pytest.mark.skipif(not Path("/proc/sys/vm/overcommit_memory").exists(), reason="Linux memory accounting")
def test_a_file_larger_than_memory_opens_read_only(tmp_path):
    # A private writable mapping is charged against the commit limit unless it is MAP_NORESERVE: without it a
    # read-only file larger than RAM + swap could not be opened at all (numpy's mmap_mode="r" can).
    if Path("/proc/sys/vm/overcommit_memory").read_text().strip() == "2":
        pytest.skip("strict overcommit refuses every mapping past the commit limit")
    rows = _memory_commit_bytes() // (4 * 1024) + (1 << 18)  # 1 GiB past RAM + swap, 1024 float32 a row
    path = tmp_path / "huge.npy"
    header = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(rows, 1024))
    header[rows - 1, :3] = [1.0, 2.0, 3.0]
    header.flush()
    del header
    if os.stat(path).st_blocks * 512 > (64 << 20):
        pytest.skip("this filesystem does not keep sparse files sparse")
    table = data.open_npy(path, "r", pin=False)
    assert table.shape == (rows, 1024)
    assert table[rows - 1, :4].tolist() == [1.0, 2.0, 3.0, 0.0]
    table[0, 0] = 5.0  # a write stays in this process (one page copied)
    assert table[0, 0].item() == 5.0 and np.load(path, mmap_mode="r")[0, 0] == 0.0


# Opening a file while another thread re-saves it smaller: the header used to be read, then the path opened again
# and mapped; a save renamed in between left a view past the end of the mapping (SIGBUS on reading it). The window
# is microseconds wide, so this stress test rarely hits it; tensor_over's extent check (test_pinned_host_buffer.cpp)
# is the deterministic half.
_OPEN_WHILE_RESAVED = """
import sys
import threading
import time
import torch
import speedtorch
from speedtorch import data

path, stem = sys.argv[1], sys.argv[2]
big, small = torch.ones(4096, 16), torch.ones(1, 16)
data.save_npy(big, path)
speedtorch.PinnedEmbedding(4096, 16).save(stem)
stop = time.monotonic() + float(sys.argv[3])
def resave():
    while time.monotonic() < stop:
        for rows in (small, big):
            data.save_npy(rows, path)
            speedtorch.PinnedEmbedding(rows.shape[0], 16).save(stem)
saver = threading.Thread(target=resave)
saver.start()
opened = refused = 0
while time.monotonic() < stop:
    t = data.open_npy(path, "r", pin=False)
    assert float(t[-1].sum()) == 16.0  # the last row of whatever was mapped
    opened += 1
    try:
        e = speedtorch.PinnedEmbedding.open(stem, "r")
        float(e.table()[-1].sum())
    except RuntimeError as error:  # the meta and the rows of two saves: refused, never a crash
        assert "different saves" in str(error) or "does not match" in str(error), str(error)
        refused += 1
saver.join()
print("opened", opened, "refused", refused)
"""


def test_opening_a_file_while_it_is_saved_again_never_crashes(tmp_path):
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root / "python"), os.environ.get("PYTHONPATH", "")]))
    result = subprocess.run([sys.executable, "-c", _OPEN_WHILE_RESAVED, str(tmp_path / "race.npy"),
                             str(tmp_path / "table"), "2.0"], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, f"exit status {result.returncode}\n{result.stdout}\n{result.stderr}"
    assert "opened" in result.stdout


# Every writing op called on a mode 'r' mapping, pinned or not. Before the ops checked, the first one was a SIGSEGV
# (issue 13): the calls run in a subprocess so that such a crash fails this test instead of killing pytest.
_WRITE_READ_ONLY_MAPPING = """
import sys
import torch
import speedtorch
from speedtorch import data

path, state_path, pin = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
table = data.open_npy(path, "r", pin=pin)
state = data.open_npy(state_path, "r", pin=pin)
ids = torch.tensor([1, 3])
calls = {
    "scatter_": lambda: speedtorch.scatter_(table, ids, torch.ones(2, 3)),
    "scatter_ (no rows)": lambda: speedtorch.scatter_(table, ids[:0], torch.ones(0, 3)),
    "row_optimizer_step_": lambda: torch.ops.speedtorch.row_optimizer_step_(
        table, torch.zeros(5, 16), ids, torch.ones(2, 3), "adagrad", {"lr": 0.1}, 1),
    "row_optimizer_step_ (read-only state)": lambda: torch.ops.speedtorch.row_optimizer_step_(
        torch.zeros(5, 3), state, ids, torch.ones(2, 3), "adagrad", {"lr": 0.1}, 1),
    "load_npy_into_": lambda: data.load_npy_into_(table, path),
}
for name, call in calls.items():
    try:
        call()
    except RuntimeError as error:
        assert "read-only file mapping" in str(error), (name, str(error))
        print(name, "refused")
    else:
        print(name, "wrote a read-only mapping")
        sys.exit(1)
assert float(table.sum()) == 0.0 and float(state.sum()) == 0.0
"""


@pytest.mark.parametrize("pin", [False, True])
def test_writing_ops_refuse_a_read_only_mapping(tmp_path, pin):
    path = tmp_path / "r.npy"
    np.save(path, np.zeros((5, 3), dtype=np.float32))
    state_path = tmp_path / "state.npy"
    np.save(state_path, np.zeros((5, 16), dtype=np.float32))
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root / "python"), os.environ.get("PYTHONPATH", "")]))
    result = subprocess.run([sys.executable, "-c", _WRITE_READ_ONLY_MAPPING, str(path), str(state_path),
                             "1" if pin else "0"],
                            capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, f"exit status {result.returncode}\n{result.stdout}\n{result.stderr}"
    assert result.stdout.count("refused") == 5, result.stdout


def test_numpy_view_shares_memory():
    emb = speedtorch.PinnedEmbedding(10, 4, torch.float32)
    view = data.numpy(emb)
    view[3, 2] = 5.0
    assert emb.table()[3, 2] == 5.0
    host = HostEmbedding(10, 4, device="cpu", seed=0)
    data.numpy(host)[0, 0] = 7.0
    assert host.weight[0, 0] == 7.0
    bf16 = speedtorch.PinnedEmbedding(3, 4, torch.bfloat16)
    assert data.numpy(bf16).dtype == np.uint16


def test_progress_line_on_request(tmp_path, capfd, monkeypatch):
    monkeypatch.setenv("SPEEDTORCH_PROGRESS", "1")
    data.save_npy(torch.randn(1000, 16), tmp_path / "p.npy")
    assert "p.npy" in capfd.readouterr().err
    monkeypatch.setenv("SPEEDTORCH_PROGRESS", "0")
    data.save_npy(torch.randn(1000, 16), tmp_path / "q.npy")
    assert capfd.readouterr().err == ""


# --- PinnedEmbedding files ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", TABLE_DTYPES)
@pytest.mark.parametrize("beside", [True, False])
def test_save_load_keeps_rows_state_and_config(tmp_path, dtype, beside):
    emb = trained_table(dtype=dtype, beside=beside)
    emb.save(str(tmp_path / "users"))
    assert sorted(os.listdir(tmp_path)) == ["users.meta.json", "users.npy", "users.state.npy"]
    back = speedtorch.PinnedEmbedding.load(str(tmp_path / "users.npy"), True)
    assert back.table().dtype == dtype
    assert torch.equal(back.table(), emb.table()) and torch.equal(back.state(), emb.state())
    assert (back.optimizer(), back.optimizer_options(), back.step_count()) == \
        (emb.optimizer(), emb.optimizer_options(), emb.step_count())
    # Training goes on identically from the loaded copy.
    ids, grad = torch.tensor([0, 5, 5, 299]), torch.randn(4, emb.dim())
    emb.apply_gradients(ids, grad)
    back.apply_gradients(ids, grad)
    assert torch.equal(back.table(), emb.table())
    # NumPy reads the files as they are documented.
    rows = np.load(tmp_path / "users.npy")
    assert rows.shape == (300, 12)


def test_saves_keep_the_mode_of_the_files_they_replace(tmp_path):
    """One rule for file permissions (csrc/io/file_mode.h): a save used to turn a 0600 table into 0644 (its temporary
    was made 0666 and renamed over it), and create() made 0600 files whatever the umask."""
    emb = trained_table(10, 4)
    stem = tmp_path / "t"
    emb.save(str(stem))
    files = [tmp_path / name for name in ("t.npy", "t.state.npy", "t.meta.json")]
    for file in files:
        os.chmod(file, 0o600)
    emb.save(str(stem))
    data.save_npy(torch.ones(3), tmp_path / "x.npy")
    os.chmod(tmp_path / "x.npy", 0o640)
    data.save_npy(torch.zeros(3), tmp_path / "x.npy")
    assert [os.stat(f).st_mode & 0o777 for f in files] == [0o600] * 3
    assert os.stat(tmp_path / "x.npy").st_mode & 0o777 == 0o640
    old = os.umask(0o022)
    try:
        speedtorch.PinnedEmbedding.create(str(tmp_path / "new"), 10, 4, torch.float32, "adagrad", {})
    finally:
        os.umask(old)
    for name in ("new.npy", "new.state.npy", "new.meta.json"):
        assert os.stat(tmp_path / name).st_mode & 0o777 == 0o644, name


def test_plain_npy_loads_as_rows_only(tmp_path):
    array = np.random.default_rng(2).standard_normal((40, 6)).astype(np.float32)
    np.save(tmp_path / "plain.npy", array)
    emb = data.load_embedding(tmp_path / "plain.npy")
    np.testing.assert_array_equal(emb.table().numpy(), array)
    assert emb.optimizer() == "" and emb.step_count() == 0


def test_files_of_different_saves_do_not_mix(tmp_path):
    trained_table(steps=2).save(str(tmp_path / "a"))
    trained_table(steps=5).save(str(tmp_path / "b"))
    os.replace(tmp_path / "b.state.npy", tmp_path / "a.state.npy")
    with pytest.raises(RuntimeError, match="hash"):
        speedtorch.PinnedEmbedding.load(str(tmp_path / "a"), True)


def test_open_maps_the_saved_files(tmp_path):
    emb = trained_table()
    emb.save(str(tmp_path / "t"))
    read_only = data.open_embedding(tmp_path / "t", "r")
    assert read_only.mapping() == "r"
    assert torch.equal(read_only.gather(torch.tensor([3, 1])), emb.table()[[3, 1]])
    with pytest.raises(RuntimeError, match="read-only"):
        read_only.apply_gradients(torch.tensor([0]), torch.ones(1, emb.dim()))

    writable = data.open_embedding(tmp_path / "t", "r+")
    ids, grad = torch.tensor([2, 9]), torch.randn(2, emb.dim())
    writable.apply_gradients(ids, grad)
    emb.apply_gradients(ids, grad)
    writable.flush()
    back = speedtorch.PinnedEmbedding.load(str(tmp_path / "t"), True)
    assert torch.equal(back.table(), emb.table()) and torch.equal(back.state(), emb.state())
    assert back.step_count() == emb.step_count()

    private = data.open_embedding(tmp_path / "t", "c")
    private.scatter_(torch.tensor([0]), torch.full((1, emb.dim()), 5.0))
    assert not torch.equal(speedtorch.PinnedEmbedding.load(str(tmp_path / "t"), True).table()[0],
                           private.table()[0])
    with pytest.raises(RuntimeError, match="mode"):
        data.open_embedding(tmp_path / "t", "w+")


@pytest.mark.gpu
@pytest.mark.parametrize("folder", ["tmp", "shm"])
def test_open_on_a_gpu_host(tmp_path, folder):
    """GPUs read every mapping over UVA. They write 'c' mappings; 'r' mappings, and 'r+' ones outside tmpfs (Linux
    refuses writable GPU pins of shared file pages), are registered read-only: GPU writes are refused up front and
    CPU writes still reach the file."""
    if folder == "shm":
        if not os.path.isdir("/dev/shm"):
            pytest.skip("no /dev/shm")
        tmp_path = tmp_path.__class__(f"/dev/shm/speedtorch-test-{os.getpid()}")
        tmp_path.mkdir(exist_ok=True)
    try:
        emb = trained_table()
        emb.save(str(tmp_path / "g"))
        ids = torch.tensor([4, 0, 7], device="cuda")
        grad = torch.randn(3, emb.dim(), device="cuda")
        for mode in ("r", "r+", "c"):
            # What the file holds now ("r+" rounds write it), read without the mapping.
            expected = speedtorch.PinnedEmbedding.load(str(tmp_path / "g"), False).table()[[4, 0, 7]]
            mapped = data.open_embedding(tmp_path / "g", mode)
            assert mapped.is_pinned()
            assert torch.equal(mapped.gather(ids).cpu(), expected)
            gpu_may_write = mode == "c" or (mode == "r+" and folder == "shm")
            if mode == "r":
                continue  # read-only for everyone (test_open_maps_the_saved_files)
            if gpu_may_write:
                mapped.apply_gradients(ids, grad)
                mapped.scatter_(ids[:1], torch.ones(1, emb.dim(), device="cuda"))
                torch.cuda.synchronize()
                assert torch.equal(mapped.table()[4].cpu(), torch.ones(emb.dim()))
            else:
                with pytest.raises(RuntimeError, match="GPUs may only read"):
                    mapped.apply_gradients(ids, grad)
                with pytest.raises(RuntimeError, match="GPUs may only read"):
                    mapped.scatter_(ids, torch.zeros(3, emb.dim(), device="cuda"))
                mapped.apply_gradients(ids.cpu(), grad.cpu())  # the CPU path writes the file
                mapped.flush()
            del mapped
        torch.cuda.synchronize()  # the context is healthy
    finally:
        if folder == "shm":
            import shutil

            shutil.rmtree(tmp_path, ignore_errors=True)


@pytest.mark.gpu
def test_a_read_only_mapping_serves_gpu_reads_after_a_torch_write(tmp_path):
    """Mode 'r' pages are private (MAP_PRIVATE) and registered read-only with CUDA: a plain torch write on the CPU
    neither crashes nor reaches the file, and GPUs keep reading the table (the written row itself may read as the
    file's bytes or the written ones: which depends on whether the kernel copied the pages when CUDA pinned them)."""
    emb = trained_table()
    emb.save(str(tmp_path / "g"))
    expected = emb.table().clone()
    mapped = data.open_embedding(tmp_path / "g", "r")
    assert mapped.is_pinned()
    mapped.table()[0].mul_(2.0)
    ids = torch.arange(emb.num_rows(), device="cuda")
    rows = mapped.gather(ids).cpu()
    assert torch.equal(rows[1:], expected[1:])
    assert torch.equal(rows[0], expected[0]) or torch.equal(rows[0], 2.0 * expected[0])
    with pytest.raises(RuntimeError, match="read-only"):  # speedtorch's own writes are refused, as before
        mapped.scatter_(ids[:1], torch.zeros(1, emb.dim(), device="cuda"))
    assert torch.equal(speedtorch.PinnedEmbedding.load(str(tmp_path / "g"), True).table(), expected)


def test_missing_files_name_the_path(tmp_path):
    with pytest.raises(RuntimeError, match="nothing.npy"):
        speedtorch.PinnedEmbedding.load(str(tmp_path / "nothing"), True)
    trained_table().save(str(tmp_path / "x"))
    os.remove(tmp_path / "x.state.npy")
    with pytest.raises(RuntimeError, match="x.state.npy"):
        speedtorch.PinnedEmbedding.load(str(tmp_path / "x"), True)


# --- HostEmbedding and placements -----------------------------------------------------------------------------------


def train(module, batches, target):
    losses = []
    for ids in batches:
        loss = ((module(ids) - target) ** 2).sum()
        loss.backward()
        module.step()
        losses.append(float(loss))
    return losses


@pytest.mark.parametrize("device", DEVICES)
def test_placements_train_alike(device):
    n, d = 400, 8
    gen = torch.Generator().manual_seed(5)
    init = torch.randn(n, d, generator=gen)
    batches = [torch.randint(0, 50, (64,), generator=gen) for _ in range(8)]  # hot rows 0..49
    target = torch.randn(d, generator=gen).to(device)
    hot = torch.arange(0, 100, 4)  # half of the hot rows on the device, half not
    modules = {
        "host": HostEmbedding(n, d, device=device, optimizer="adam", optimizer_options={"lr": 0.05}),
        "gpu": HostEmbedding(n, d, device=device, optimizer="adam", optimizer_options={"lr": 0.05}, placement="gpu"),
        "hybrid": HostEmbedding(n, d, device=device, optimizer="adam", optimizer_options={"lr": 0.05},
                                placement="hybrid", hot_rows=hot),
        "hybrid_fraction": HostEmbedding(n, d, device=device, optimizer="adam", optimizer_options={"lr": 0.05},
                                         placement="hybrid", hot_fraction=0.05),
        "hybrid_python": HostEmbedding(n, d, device=device, optimizer="adam", optimizer_options={"lr": 0.05},
                                       placement="hybrid", table=python_hybrid_table(n, d, device)),
    }
    results = {}
    for name, module in modules.items():
        module.table.copy_(init.to(device) if name == "gpu" else init)
        losses = train(module, batches, target)
        results[name] = (losses, module.weight.detach().cpu().clone())
    assert isinstance(modules["gpu"].table, DeviceTable)
    assert modules["hybrid"].table.cache_slots() == 25  # 25 hot rows: one set of 25 ways
    assert modules["hybrid_fraction"].table.cache_slots() == 20  # 5% of 400 rows
    assert modules["hybrid_python"].table.hot_ids.numel() > 0  # re-chosen by frequency
    ref_losses, ref_weight = results["host"]
    assert ref_losses[-1] < ref_losses[0]
    for name, (losses, weight) in results.items():
        np.testing.assert_allclose(losses, ref_losses, rtol=1e-4, err_msg=name)
        torch.testing.assert_close(weight, ref_weight, rtol=1e-4, atol=1e-5, msg=name)


def python_hybrid_table(n, d, device):
    """The Python HybridTable (hot rows re-chosen by frequency every 3 updates), wrapped by HostEmbedding."""
    host = speedtorch.PinnedEmbedding(n, d, torch.float32)
    host.set_optimizer("adam", {"lr": 0.05}, True)
    return HybridTable(host, device, 20, refresh=3)


@pytest.mark.parametrize("placement", ["host", "gpu", "hybrid"])
def test_host_embedding_save_load_every_placement(tmp_path, placement):
    kwargs = {"placement": placement, "device": "cpu", "optimizer": "adagrad"}
    if placement == "hybrid":
        kwargs["hot_rows"] = torch.tensor([1, 2, 3])
    module = HostEmbedding(100, 6, seed=1, **kwargs)
    train(module, [torch.tensor([1, 2, 50, 50, 99])] * 3, torch.zeros(6))
    module.save(tmp_path / "m")
    back = HostEmbedding.load(tmp_path / "m", **kwargs)
    assert torch.equal(back.weight.cpu(), module.weight.cpu())
    assert back.table.step_count() == module.table.step_count() == 3
    assert torch.equal(back.table.state().cpu(), module.table.state().cpu())
    # A host-saved table opens memory-mapped and keeps training.
    mapped = HostEmbedding.load(tmp_path / "m", mmap_mode="c", device="cpu", optimizer="adagrad")
    train(mapped, [torch.tensor([4])], torch.zeros(6))
    assert mapped.table.step_count() == 4


def test_placement_arguments_are_checked():
    with pytest.raises(ValueError, match="placement"):
        HostEmbedding(10, 4, device="cpu", placement="disk")
    with pytest.raises(ValueError, match="hot_fraction"):
        HostEmbedding(10, 4, device="cpu", placement="hybrid")
    with pytest.raises(ValueError, match="hot_fraction"):
        HybridTable.hot_count(10, None, 2.0)
    with pytest.raises(RuntimeError, match="set_optimizer"):
        HybridTable(speedtorch.PinnedEmbedding(10, 4, torch.float32), "cpu", 1)
    hybrid = HostEmbedding(10, 4, device="cpu", placement="hybrid", hot_rows=torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="room for 2"):
        hybrid.set_hot_rows(torch.tensor([1, 2, 3]))
    with pytest.raises(IndexError, match="hot row ids"):
        hybrid.set_hot_rows(torch.tensor([10]))
    module = HostEmbedding(10, 4, device="cpu")
    with pytest.raises(RuntimeError, match="hybrid"):
        module.set_hot_rows(torch.tensor([1]))


def test_hybrid_checks_ids_and_follows_writes_to_weight():
    module = HostEmbedding(10, 4, device="cpu", seed=0, optimizer="sgd", placement="hybrid",
                           hot_rows=torch.tensor([1, 9]))
    for bad in (-1, 10):
        with pytest.raises(IndexError, match=f"holds {bad} at flat position"):
            module(torch.tensor([2, bad]))
    with torch.no_grad():
        module.weight.zero_()  # e.g. nn.init on the weight: hot rows included
    assert torch.count_nonzero(module(torch.tensor([1, 9, 3]))) == 0
    module.table.copy_(torch.ones(10, 4))
    assert torch.equal(module(torch.tensor([9, 0])), torch.ones(2, 4))


def test_numpy_view_of_a_read_only_mapping_is_read_only(tmp_path):
    trained_table().save(str(tmp_path / "r"))
    view = data.numpy(data.open_embedding(tmp_path / "r", "r"))
    with pytest.raises(ValueError, match="read-only"):
        view[0, 0] = 1.0


def test_a_read_only_mapped_table_serves_in_a_host_embedding(tmp_path):
    np.save(tmp_path / "frozen.npy", np.arange(40, dtype=np.float32).reshape(10, 4))
    module = HostEmbedding.load(tmp_path / "frozen.npy", mmap_mode="r", device="cpu")
    assert torch.equal(module(torch.tensor([2])), torch.arange(8, 12, dtype=torch.float32).reshape(1, 4))
    assert not module.trains and not module(torch.tensor([2])).requires_grad  # a plain .npy: a frozen table
    trained = HostEmbedding.load(tmp_path / "frozen.npy", mmap_mode="r", device="cpu", optimizer="adam")
    trained(torch.tensor([2])).sum().backward()
    with pytest.raises(RuntimeError, match="read-only"):
        trained.step()


def test_create_refuses_files_that_do_not_fit(tiny_tmpfs):
    """create() allocates the files' blocks: a file system without room for them is an error there, not a SIGBUS
    later, at the first page written (or, on tmpfs, read through the mapping) past its room."""
    path = str(Path(tiny_tmpfs) / "big")
    with pytest.raises(RuntimeError, match=r"cannot create .*big\.npy \(\d+ bytes\): No space left on device "
                                           r"\(\d+ bytes free there\)"):
        speedtorch.PinnedEmbedding.create(path, 20_000, 16, torch.float32, "adam", {})
    assert list(Path(tiny_tmpfs).iterdir()) == []
    table = speedtorch.PinnedEmbedding.create(path, 1000, 16, torch.float32, "adam", {})  # 64 KB + 144 KB: fits
    table.normal_(0.0, 1.0, 0)
    table.apply_gradients(torch.arange(1000), torch.ones(1000, 16))
    assert table.step_count() == 1 and torch.count_nonzero(table.state()) > 0


def test_create_makes_zero_files_that_open_shares(tmp_path):
    """PinnedEmbedding.create: zero rows and state over new files (what the distributed table shares per host)."""
    path = str(tmp_path / "shared")
    a = speedtorch.PinnedEmbedding.create(path, 300, 8, torch.bfloat16, "adam", {"lr": 0.1})
    assert a.mapping() == "r+" and a.table().dtype == torch.bfloat16 and a.state().shape == (300, 4 + 2 * 8)
    assert torch.count_nonzero(a.table()) == 0 and torch.count_nonzero(a.state()) == 0
    b = speedtorch.PinnedEmbedding.open(path, "r+")  # another mapping of the same pages
    a.apply_gradients(torch.tensor([5, 7]), torch.ones(2, 8))
    assert torch.equal(b.table(), a.table()) and torch.equal(b.state(), a.state())
    assert torch.count_nonzero(b.table()[5]) == 8
    a.flush()
    assert np.load(path + ".npy").shape == (300, 8)  # files NumPy reads
    assert speedtorch.PinnedEmbedding.load(path, True).optimizer() == "adam"  # hashes match the contents
    with pytest.raises(RuntimeError, match="File exists"):
        speedtorch.PinnedEmbedding.create(path, 300, 8, torch.float32, "", {})
    with pytest.raises(RuntimeError, match="num_rows must be > 0"):
        speedtorch.PinnedEmbedding.create(str(tmp_path / "empty"), 0, 8, torch.float32, "", {})
    with pytest.raises(RuntimeError, match="unknown optimizer"):
        speedtorch.PinnedEmbedding.create(str(tmp_path / "bad"), 10, 8, torch.float32, "adamm", {})
    assert not any(p.name.startswith("bad") for p in tmp_path.iterdir())  # nothing half-made is left
    # Any one of the three files already there: refused before anything is touched, and that file survives whole.
    for existing in (".npy", ".state.npy", ".meta.json"):
        stem = tmp_path / f"taken{existing.replace('.', '-')}"
        (tmp_path / (stem.name + existing)).write_bytes(b"not ours")
        with pytest.raises(RuntimeError, match="exists"):
            speedtorch.PinnedEmbedding.create(str(stem), 10, 8, torch.float32, "adam", {})
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith(stem.name)] == [stem.name + existing]
        assert (tmp_path / (stem.name + existing)).read_bytes() == b"not ours"
    assert np.load(path + ".npy").shape == (300, 8)  # the refused create above left the first table alone


def test_an_r_plus_tables_files_stay_a_pair_across_an_optimizer_change(tmp_path):
    """The state file of an 'r+' table is replaced at the flush after set_optimizer. With a tensor of the old state
    still alive, that flush raised after the rows had moved on (they reach their file through the mapping), and the
    files failed load(verify=True): set_optimizer now refuses while the old state is in use, before anything
    changes, and the files stay the pair the last flush wrote."""
    path = str(tmp_path / "t.npy")
    table = speedtorch.PinnedEmbedding.create(path, 8, 4, torch.float32, "adam", {"lr": 0.1})
    table.apply_gradients(torch.tensor([1]), torch.ones(1, 4))
    table.flush()
    old_state = table.state()
    rows, state = table.table().clone(), old_state.clone()
    with pytest.raises(RuntimeError, match="a tensor of the state still uses"):
        table.set_optimizer("sgd", {"lr": 0.5}, False)
    assert table.optimizer() == "adam" and torch.equal(table.state(), state) and torch.equal(table.table(), rows)
    other = speedtorch.PinnedEmbedding.open(path, "r+")  # another table over the same files
    del old_state
    with pytest.raises(RuntimeError, match="another mapping of this process still uses"):
        table.set_optimizer("sgd", {"lr": 0.5}, False)
    del other
    table.set_optimizer("sgd", {"lr": 0.5}, False)
    table.apply_gradients(torch.tensor([2]), torch.ones(1, 4))
    other = speedtorch.PinnedEmbedding.open(path, "r+")  # opened since: the flush refuses before writing anything
    with pytest.raises(RuntimeError, match="this process maps that file read-write.*this flush wrote nothing"):
        table.flush()
    del other
    table.flush()
    loaded = speedtorch.PinnedEmbedding.load(path, True)
    assert loaded.optimizer() == "sgd" and torch.equal(loaded.table(), table.table())
    assert torch.equal(loaded.state(), table.state()) and loaded.step_count() == 1


def test_an_r_plus_module_takes_a_checkpoint_of_another_layout(tmp_path):
    """A checkpoint whose options re-lay the state out (amsgrad) re-configures the optimizer of an 'r+' table: the
    loader holds no tensor of the old state meanwhile (set_optimizer would refuse), and the next flush writes the
    files as a pair."""
    path = str(tmp_path / "t.npy")
    speedtorch.PinnedEmbedding.create(path, 8, 4, torch.float32, "adam", {"lr": 0.1})
    module = HostEmbedding.load(path, mmap_mode="r+", device="cpu")
    source = HostEmbedding(8, 4, device="cpu", optimizer="adam", optimizer_options={"lr": 0.1, "amsgrad": 1},
                           state_beside_rows=False)
    source(torch.tensor([1, 2])).sum().backward()
    source.step()
    module.load_state_dict(source.state_dict())
    assert module.table.optimizer_options() == {"lr": 0.1, "amsgrad": 1.0}
    module.table.flush()
    loaded = speedtorch.PinnedEmbedding.load(path, True)
    assert torch.equal(loaded.table(), source.weight) and torch.equal(loaded.state(), source.table.state())
