"""Fault injection for the guarantees of docs/reliability.md:

- a save killed (SIGKILL) while it writes leaves the previous checkpoint loadable, bit for bit, and the temporaries
  it leaves behind do not disturb later saves;
- truncated and bit-flipped table, state and meta files are rejected by load(verify=True) with a message naming the
  file, or (for a flip that changes nothing a load uses) load exactly the original;
- a TorchScript model whose sidecar is missing, truncated or flipped fails at torch.jit.load with such a message;
- the C++ server (torchscript_examples/server_main.cpp) survives clients that disconnect mid-request and still
  answers correctly.

Each test prints what it tried (pytest -s) for the figures in docs/reliability.md. The server comes from the CMake
build (build/torchscript_examples, or $SPEEDTORCH_BUILD_DIR/torchscript_examples); without it that test skips.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

import speedtorch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "torchscript_examples"))
import load_test  # noqa: E402
import recommender_model  # noqa: E402

BUILD = Path(os.environ.get("SPEEDTORCH_BUILD_DIR", ROOT / "build")) / "torchscript_examples"
SAVE_FILES = ("t.npy", "t.state.npy", "t.meta.json")


def trained(num_rows: int, dim: int, seed: int, steps: int = 3):
    """A table with Adam state beside its rows after a few steps with duplicate ids (never zeros)."""
    e = speedtorch.PinnedEmbedding(num_rows, dim)
    e.set_optimizer("adam", {"lr": 0.01, "amsgrad": 1.0}, True)
    e.normal_(0.0, 1.0, seed)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        ids = torch.randint(0, num_rows, (num_rows // 3 + 1,), generator=gen)
        e.apply_gradients(ids, torch.randn(ids.numel(), dim, generator=gen))
    return e


def snapshot(e) -> dict:
    state = e.state()
    return {"table": e.table().clone(), "state": None if state is None else state.clone(),
            "optimizer": e.optimizer(), "options": e.optimizer_options(), "step": e.step_count()}


def same(e, snap: dict) -> bool:
    state = e.state()
    return (torch.equal(e.table(), snap["table"]) and (state is None) == (snap["state"] is None)
            and (state is None or torch.equal(state, snap["state"])) and e.optimizer() == snap["optimizer"]
            and e.optimizer_options() == snap["options"] and e.step_count() == snap["step"])


def npy_data_offset(raw: bytes) -> int:
    """Where a .npy file's data starts (after magic, version, length and header)."""
    if raw[6] == 1:
        return 10 + int.from_bytes(raw[8:10], "little")
    return 12 + int.from_bytes(raw[8:12], "little")


# --- a save killed midway -------------------------------------------------------------------------------------------

KILL_ROWS, KILL_DIM = 160_000, 64  # 41 MB of rows and 84 MB of Adam state beside them: a save takes a while

SAVER = """
import sys
import torch
import speedtorch
path, run, rows, dim = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
e = speedtorch.PinnedEmbedding(rows, dim)
e.set_optimizer("adam", {"lr": 0.01, "amsgrad": 1.0}, True)
e.normal_(0.0, 1.0, 100 + run)
ids = torch.arange(0, rows, 7)
e.apply_gradients(ids, torch.ones(ids.numel(), dim))
e.set_step_count(1000 + run)
print("saving", flush=True)
e.save(path)
print("saved", flush=True)
"""


def wait_for_temp(folder: Path, name: str, pid: int, at_least: int, proc: subprocess.Popen) -> bool:
    """Polls until the saver's temporary for `name` holds `at_least` bytes; False if the saver finished first."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        for temp in folder.glob(f"{name}.tmp-{pid}-*"):
            try:
                if temp.stat().st_size >= at_least:
                    return True
            except FileNotFoundError:  # renamed into place meanwhile
                pass
        if proc.poll() is not None:
            return False
        time.sleep(0.0005)
    raise AssertionError(f"the saver never wrote {at_least} bytes of {name}")


def test_save_killed_midway_leaves_the_previous_checkpoint(tmp_path):
    path = str(tmp_path / "t.npy")
    first = trained(KILL_ROWS, KILL_DIM, seed=1)
    first.save(path)
    expected = snapshot(first)
    del first
    table_bytes = 128 + KILL_ROWS * KILL_DIM * 4
    state_width = speedtorch.PinnedEmbedding.state_width("adam", {"lr": 0.01, "amsgrad": 1.0}, KILL_DIM)
    state_bytes = 128 + KILL_ROWS * state_width * 4
    # Where each run kills the saver: a share of the rows file or of the state file written (1.0: all of it, the
    # saver then flushing it to disk or starting the next file).
    kill_points = [("t.npy", 0.2), ("t.npy", 0.7), ("t.npy", 1.0), ("t.state.npy", 0.3), ("t.state.npy", 0.9)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "python"), os.environ.get("PYTHONPATH", "")]),
               SPEEDTORCH_PROGRESS="0")
    outcomes = []
    for run, (name, share) in enumerate(kill_points):
        proc = subprocess.Popen([sys.executable, "-c", SAVER, path, str(run), str(KILL_ROWS), str(KILL_DIM)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        try:
            assert proc.stdout.readline().strip() == "saving", proc.stderr.read()
            full = table_bytes if name == "t.npy" else state_bytes
            wait_for_temp(tmp_path, name, proc.pid, int(share * full), proc)
            proc.send_signal(signal.SIGKILL)
        finally:
            proc.wait(60)
        back = speedtorch.PinnedEmbedding.load(path, True)  # must load, hashes verified
        if same(back, expected):
            outcomes.append("previous")
        else:
            # The save had committed before the signal landed (possible only when the saver was past its last
            # write): the new version, whole (its hashes matched).
            assert back.step_count() == 1000 + run, f"run {run}: neither the previous nor the new save"
            expected = snapshot(back)
            outcomes.append("new")
        del back
    strays = sorted(p.name for p in tmp_path.glob("*.tmp-*"))
    # A later save into the same place works beside the killed saves' temporaries, and loads back.
    later = trained(1000, 8, seed=3)
    later.save(path)
    assert same(speedtorch.PinnedEmbedding.load(path, True), snapshot(later))
    assert sorted(p.name for p in tmp_path.glob("*.tmp-*")) == strays  # never read, never replaced
    print(f"\n[kill] {len(kill_points)} saves of {(table_bytes + state_bytes) / 1e6:.0f} MB killed (SIGKILL): "
          f"{outcomes.count('previous')} left the previous checkpoint, {outcomes.count('new')} had committed; "
          f"{len(strays)} temporaries left behind; a later save and load succeeded")


# --- truncated and bit-flipped files --------------------------------------------------------------------------------

def load_outcome(path: str, original: dict) -> str:
    """'rejected' (RuntimeError naming one of the files), 'identical' (loaded, equal to the original) or raises."""
    try:
        back = speedtorch.PinnedEmbedding.load(path, True)
    except RuntimeError as e:
        message = str(e)
        assert any(name in message for name in SAVE_FILES), f"the error does not name the file: {message[:300]}"
        return "rejected"
    assert same(back, original), "a damaged save loaded as a different table"
    return "identical"


def faults_of(raw: bytes, header_end: int, data_samples: int, rng: random.Random):
    """(description, damaged bytes): truncation at every header offset and at data_samples data offsets; a single
    bit flipped at every bit of the header and at data_samples bits of the data."""
    cuts = set(range(header_end)) | {header_end + (len(raw) - header_end) * i // data_samples
                                     for i in range(data_samples)} | {len(raw) - 1}
    for cut in sorted(c for c in cuts if c < len(raw)):
        yield "truncated", raw[:cut]
    positions = [(b, bit) for b in range(header_end) for bit in range(8)]
    if len(raw) > header_end:
        positions += [(rng.randrange(header_end, len(raw)), rng.randrange(8)) for _ in range(data_samples)]
    for byte, bit in positions:
        damaged = bytearray(raw)
        damaged[byte] ^= 1 << bit
        yield "flipped", bytes(damaged)


def test_truncated_and_flipped_files_are_rejected(tmp_path):
    path = str(tmp_path / "t.npy")
    e = trained(64, 8, seed=2)
    e.save(path)
    original = snapshot(e)
    rng = random.Random(0)
    counts = {}
    for name in SAVE_FILES:
        file = tmp_path / name
        raw = file.read_bytes()
        header_end = len(raw) if name.endswith(".json") else npy_data_offset(raw)
        for kind, damaged in faults_of(raw, header_end, 60, rng):
            file.write_bytes(damaged)
            outcome = load_outcome(path, original)
            # Only the meta's closing newline may go unnoticed: nothing a load reads is missing then.
            assert outcome == "rejected" or kind == "flipped" or raw[len(damaged):].isspace(), \
                f"{name} cut at {len(damaged)} of {len(raw)} bytes loaded"
            counts[(name, kind, outcome)] = counts.get((name, kind, outcome), 0) + 1
        file.write_bytes(raw)
    assert load_outcome(path, original) == "identical"
    for name in SAVE_FILES:
        assert counts[(name, "flipped", "rejected")] > 0
    print("\n[faults] " + "; ".join(f"{name} {kind}: {n} {outcome}"
                                    for (name, kind, outcome), n in sorted(counts.items())))


# --- a model's damaged sidecar --------------------------------------------------------------------------------------

def _model_with_a_relative_sidecar(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SPEEDTORCH_SIDECAR_DIR", raising=False)
    model = torch.jit.script(recommender_model.Recommender(50, 10, 4))
    model.users.set_sidecar("side.npy")
    torch.jit.save(model, "model.pt")


def test_missing_sidecar_rows_say_how_the_path_was_resolved(tmp_path, monkeypatch):
    _model_with_a_relative_sidecar(tmp_path, monkeypatch)
    (tmp_path / "side.npy").unlink()
    with pytest.raises(RuntimeError, match="relative to the current directory; set SPEEDTORCH_SIDECAR_DIR"):
        torch.jit.load("model.pt")


def test_missing_sidecar_state_says_how_the_path_was_resolved(tmp_path, monkeypatch):
    _model_with_a_relative_sidecar(tmp_path, monkeypatch)
    (tmp_path / "side.state.npy").unlink()
    with pytest.raises(RuntimeError) as error:
        torch.jit.load("model.pt")
    assert "missing: side.state.npy." in str(error.value)  # only that file: the rows and meta are there
    assert "relative to the current directory; set SPEEDTORCH_SIDECAR_DIR" in str(error.value)


def test_damaged_sidecar_fails_at_jit_load(tmp_path):
    model = torch.jit.script(recommender_model.Recommender(300, 20, 8))
    model.users.set_sidecar(str(tmp_path / "users.npy"))
    torch.jit.save(model, str(tmp_path / "model.pt"))
    original = snapshot(model.users)
    assert same(torch.jit.load(str(tmp_path / "model.pt")).users, original)
    names = ("users.npy", "users.state.npy", "users.meta.json")
    rng = random.Random(1)
    counts = {}

    def outcome() -> str:
        try:
            loaded = torch.jit.load(str(tmp_path / "model.pt"))
        except RuntimeError as e:
            assert any(n in str(e) for n in names), f"the error does not name the sidecar: {str(e)[:300]}"
            return "rejected"
        assert same(loaded.users, original), "a damaged sidecar loaded as a different table"
        return "identical"

    for name in names:
        file = tmp_path / name
        raw = file.read_bytes()
        header_end = len(raw) if name.endswith(".json") else npy_data_offset(raw)
        file.unlink()
        faults = [("missing", outcome())]
        for cut in sorted(rng.sample(range(len(raw)), 12)):
            file.write_bytes(raw[:cut])
            faults.append(("truncated", outcome()))
        data_bytes = range(header_end, len(raw))
        for byte in rng.sample(range(header_end), 12) + rng.sample(data_bytes, min(12, len(data_bytes))):
            damaged = bytearray(raw)
            damaged[byte] ^= 1 << rng.randrange(8)
            file.write_bytes(bytes(damaged))
            faults.append(("flipped", outcome()))
        file.write_bytes(raw)
        for kind, result in faults:
            counts[(name, kind, result)] = counts.get((name, kind, result), 0) + 1
        assert ("missing", "rejected") in faults and ("truncated", "identical") not in faults
    assert outcome() == "identical"
    print("\n[sidecar] " + "; ".join(f"{n} {k}: {c} {o}" for (n, k, o), c in sorted(counts.items())))


# --- the server and clients that go away ----------------------------------------------------------------------------

RESET_ON_CLOSE = struct.pack("ii", 1, 0)  # SO_LINGER on with a 0 s timeout: close() sends a reset


def abusive_client(address, kind: int) -> None:
    """One connection that leaves mid-request, in one of five ways."""
    sock = socket.create_connection(address, timeout=10)
    try:
        if kind == 0:  # connects and leaves
            pass
        elif kind == 1:  # half a request line and headers
            sock.sendall(b"POST /lookup HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Ty")
        elif kind == 2:  # headers promising a long body, a few bytes of it
            sock.sendall(b"POST /lookup HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 100000\r\n\r\n{\"ids\": [1, 2,")
        elif kind == 3:  # a whole request, gone before the answer (reset, not a clean close)
            sock.sendall(request(b'{"ids": [1, 2, 3]}'))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, RESET_ON_CLOSE)
        else:  # a request for many rows, half-closed, reset while the large answer is being written
            sock.sendall(request(("{\"ids\": [" + ", ".join(str(i % 300) for i in range(4000)) + "]}").encode()))
            sock.shutdown(socket.SHUT_WR)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, RESET_ON_CLOSE)
    finally:
        sock.close()


def request(body: bytes) -> bytes:
    return (b"POST /lookup HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\n\r\n" + body)


def test_server_survives_clients_that_disconnect(tmp_path):
    binary = BUILD / "speedtorch_server"
    if not binary.exists():
        pytest.skip(f"{binary} not built")
    model = torch.jit.script(recommender_model.Recommender(300, 20, 8))
    torch.jit.save(model, str(tmp_path / "model.pt"))
    rounds, threads = 60, 8
    with load_test.Server(str(binary), str(tmp_path / "model.pt"), threads=4, max_batch=4096) as srv:
        host, port = srv.url[len("http://"):].rsplit(":", 1)
        address = (host, int(port))
        errors = []

        def abuse(index: int) -> None:
            rng = random.Random(index)
            for _ in range(rounds):
                try:
                    abusive_client(address, rng.randrange(5))
                except OSError as e:  # the server closing first is its right; refusing to connect is not
                    if isinstance(e, ConnectionRefusedError):
                        errors.append(repr(e))

        workers = [threading.Thread(target=abuse, args=(i,)) for i in range(threads)]
        for w in workers:
            w.start()
        served = load_test.run(srv, model, clients=2, requests=30)  # real clients alongside
        for w in workers:
            w.join()
        assert errors == []
        assert served["failures"] == [] and served["requests"] == 60
        assert srv.proc.poll() is None, srv.proc.stderr.read()
        ids = list(range(0, 300, 7))
        status, body = srv.post("/lookup", {"ids": ids})
        assert status == 200 and torch.equal(torch.tensor(body["rows"]), model.lookup(torch.tensor(ids)))
    print(f"\n[server] {rounds * threads} connections dropped mid-request (5 ways, {threads} at a time) alongside "
          f"{served['requests']} checked requests: server up, answers correct")
