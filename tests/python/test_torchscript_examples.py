"""TorchScript end to end: a recommender with a PinnedEmbedding attribute scripted, saved and loaded (Python and the
C++ programs of torchscript_examples/); the scripted training loop run from Python and, unchanged, by the C++
trainer with the same result; the C++ server under concurrent load and bad requests, serving the scripted model or
its AOTInductor package (recommender_aoti.py; compiled once per session: it takes a minute) with the same answers.
The C++ programs come from the CMake build (build/torchscript_examples, or
$SPEEDTORCH_BUILD_DIR/torchscript_examples)."""

from __future__ import annotations

import os
import signal
import socket
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
import recommender_aoti  # noqa: E402
import recommender_model  # noqa: E402

BUILD = Path(os.environ.get("SPEEDTORCH_BUILD_DIR", ROOT / "build")) / "torchscript_examples"
# AOTInductor packages are built and served with PyTorch >= 2.10 (torchscript_examples/CMakeLists.txt).
SERVES_PACKAGES = torch.__version__ >= (2, 10)  # TorchVersion compares with tuples
needs_package_serving = pytest.mark.skipif(not SERVES_PACKAGES,
                                           reason="AOTInductor packages are served with PyTorch >= 2.10")


def binary(name: str) -> str:
    path = BUILD / name
    if not path.exists():
        pytest.skip(f"{path} not built")
    return str(path)


@pytest.fixture(scope="session")
def saved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ts")
    model = torch.jit.script(recommender_model.Recommender(3000, 200, 16))
    torch.jit.save(model, str(folder / "model.pt"))
    batches = torch.jit.script(recommender_model.make_batches(3000, 200, 6, 128))
    torch.jit.save(batches, str(folder / "batches.pt"))
    return folder, model


@pytest.fixture(scope="session")
def aoti_package(saved):
    """The scripted model's AOTInductor package for the CPU and its user table's files: (package, table)."""
    if not SERVES_PACKAGES:
        pytest.skip("AOTInductor packages are served with PyTorch >= 2.10")
    folder, model = saved
    model.users.save(str(folder / "users.npy"))
    recommender_aoti.export_package(model, folder / "model.pt2")
    return str(folder / "model.pt2"), str(folder / "users.npy")


@pytest.fixture(params=["torchscript", "aoti"])
def served(request, saved):
    """(server arguments, reference model) for each form the server takes: the scripted model, or the package."""
    folder, model = saved
    if request.param == "torchscript":
        return {"model": str(folder / "model.pt")}, model
    binary("speedtorch_server")  # skip before compiling a package the test cannot serve
    package, table = request.getfixturevalue("aoti_package")
    return {"model": package, "table": table}, model


def test_round_trip_gives_identical_outputs(saved):
    folder, model = saved
    loaded = torch.jit.load(str(folder / "model.pt"))
    users, items = torch.randint(0, 3000, (50,)), torch.randint(0, 200, (50,))
    torch.testing.assert_close(loaded.score(users, items), model.score(users, items), rtol=0, atol=0)
    torch.testing.assert_close(loaded.lookup(users), model.lookup(users), rtol=0, atol=0)
    assert loaded.users.optimizer() == "adam" and loaded.users.optimizer_options() == {"lr": 0.05}


def test_cpp_trainer_matches_python(saved, tmp_path):
    folder, _ = saved
    steps, lr = 12, 0.5
    out = subprocess.run([binary("speedtorch_trainer"), str(folder / "model.pt"), str(folder / "batches.pt"),
                          str(steps), str(lr), str(tmp_path / "trained.pt")], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    cpp_losses = [float(x) for x in out.stdout.split()]
    model = torch.jit.load(str(folder / "model.pt"))
    batches = torch.jit.load(str(folder / "batches.pt"))
    py_losses = [float(model.train_step(*batches(i % 6), lr)) for i in range(steps)]
    assert cpp_losses == pytest.approx(py_losses, rel=1e-5)
    assert sum(py_losses[-3:]) < sum(py_losses[:3])  # the loss falls
    trained = torch.jit.load(str(tmp_path / "trained.pt"))
    assert trained.users.step_count() == steps
    ids = torch.arange(3000)
    torch.testing.assert_close(trained.lookup(ids), model.lookup(ids), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("steps, lr", [("4x", "0.5"), ("abc", "0.5"), ("", "0.5"), ("3", "0.5y"), ("3", "nan")])
def test_cpp_trainer_refuses_numbers_it_cannot_read_whole(saved, steps, lr):
    # It used to read "4x" as 4 steps and "abc" as none (strtol), and "0.5y" as 0.5.
    folder, _ = saved
    out = subprocess.run([binary("speedtorch_trainer"), str(folder / "model.pt"), str(folder / "batches.pt"), steps,
                          lr], capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stdout
    assert f"got '{steps if lr == '0.5' else lr}'" in out.stderr and out.stdout == ""


def test_aoti_package_gives_the_scripted_models_answers(saved, aoti_package):
    # The package run from Python, its table passed in: the rows bit for bit, the scores within rounding.
    _, model = saved
    package, _ = aoti_package
    compiled = torch._inductor.aoti_load_package(package)
    table = model.users.table()
    for n in (1, 2, 77):
        users, items = torch.randint(0, 3000, (n,)), torch.randint(0, 200, (n,))
        rows, scores = compiled(table, users, items)
        torch.testing.assert_close(rows, model.lookup(users), rtol=0, atol=0)
        torch.testing.assert_close(scores, model.score(users, items).detach(), rtol=1e-5, atol=1e-6)
    assert compiled.get_metadata()["speedtorch.num_users"] == "3000"


def test_server_under_load_and_bad_requests(served):
    args, model = served
    with load_test.Server(binary("speedtorch_server"), args["model"], threads=4, max_batch=256,
                          table=args.get("table")) as srv:
        result = load_test.run(srv, model, clients=4, requests=40)
        assert result["failures"] == [] and result["requests"] == 160
        assert srv.post("/lookup", b"{oops", raw=True)[0] == 400
        assert srv.post("/lookup", {"ids": [1, 3000]}) == (404, {"error": "unknown id 3000 in 'ids': ids are in "
                                                                          "[0, 3000)"})
        assert srv.post("/lookup", {"ids": list(range(257))})[0] == 413
        assert srv.post("/topk", {"user": "x", "k": 3})[0] == 400
        status, body = srv.post("/update", {"ids": [7], "rows": [[0.5] * 16]})
        assert status == 200 and body == {"updated": 1}
        assert srv.post("/lookup", {"ids": [7]})[1]["rows"] == [[0.5] * 16]
        assert srv.proc.poll() is None  # still serving


def test_updates_are_whole_rows_under_concurrent_reads(served):
    # Writers set rows 0..7 to one value each round; readers must never see a row mixing two rounds' values.
    args, _ = served
    with load_test.Server(binary("speedtorch_server"), args["model"], threads=4, table=args.get("table")) as srv:
        ids = list(range(8))
        assert srv.post("/update", {"ids": ids, "rows": [[0.0] * 16] * 8}) == (200, {"updated": 8})  # uniform rows
        stop = threading.Event()
        mixed: list[list[float]] = []
        statuses: list[int] = []

        def reader():
            while not stop.is_set():
                status, body = srv.post("/lookup", {"ids": ids})
                statuses.append(status)
                mixed.extend(row for row in body.get("rows", []) if len(set(row)) != 1)

        threads = [threading.Thread(target=reader) for _ in range(3)]
        for t in threads:
            t.start()
        try:
            for value in range(1, 41):
                assert srv.post("/update", {"ids": ids, "rows": [[float(value)] * 16] * 8}) == (200, {"updated": 8})
        finally:
            stop.set()
            for t in threads:
                t.join(30)
        assert set(statuses) == {200} and mixed == []
        assert srv.post("/lookup", {"ids": [0, 7]})[1]["rows"] == [[40.0] * 16] * 2


def test_load_test_compares_both_forms(saved, aoti_package):
    # The load test as CI runs it: both servers, the same requests, every answer checked, figures side by side.
    folder, _ = saved
    package, table = aoti_package
    out = subprocess.run([sys.executable, str(ROOT / "torchscript_examples" / "load_test.py"), "--server",
                          binary("speedtorch_server"), "--model", str(folder / "model.pt"), "--package", package,
                          "--table", table, "--clients", "4", "--requests", "60", "--threads", "4"],
                         capture_output=True, text=True, timeout=600)
    print(out.stdout)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[-1] == "0 wrong answers"
    assert [line.split()[:2] for line in lines[2:4]] == [["torchscript", "240"], ["aoti", "240"]]


def test_load_client_mixes_lookups_and_updates_on_both_forms(saved, aoti_package):
    # The load test's C++ client as CI runs it (short): keep-alive clients, lookups mixed with /updates, every row
    # checked bit for bit, updated rows whole and read back by their writer, against both forms.
    folder, _ = saved
    package, table = aoti_package
    out = subprocess.run([sys.executable, str(ROOT / "torchscript_examples" / "load_test.py"), "--server",
                          binary("speedtorch_server"), "--load-client", binary("speedtorch_load_client"), "--model",
                          str(folder / "model.pt"), "--package", package, "--table", table, "--clients", "8",
                          "--requests", "60", "--warmup", "5", "--update-every", "7", "--protocol", "binary",
                          "--threads", "2"], capture_output=True, text=True, timeout=300)
    print(out.stdout)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[-1] == "0 wrong answers"
    assert [line.split()[:2] for line in lines[2:4]] == [["torchscript", "480"], ["aoti", "480"]]


def test_server_refuses_a_table_the_package_was_not_compiled_for(saved, aoti_package, tmp_path):
    _, model = saved
    package, table = aoti_package
    other = speedtorch.PinnedEmbedding(2999, 16)
    other.save(str(tmp_path / "other.npy"))
    server = binary("speedtorch_server")
    out = subprocess.run([server, package, "--table", str(tmp_path / "other.npy")], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 1 and "is 2999 x 16 but the package" in out.stderr, out.stderr
    out = subprocess.run([server, package], capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "--table" in out.stderr, out.stderr
    out = subprocess.run([server, package, "--table", table, "--device", "cuda"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 1 and "is compiled for cpu, not for --device cuda" in out.stderr, out.stderr


@pytest.mark.gpu
@needs_package_serving
def test_aoti_package_for_cuda_serves_the_same_answers(saved, tmp_path):
    # The package compiled for the GPU: the table stays in pinned host memory (opened from its files) and the
    # compiled program's speedtorch.gather reads it over UVA; both forms on the GPU, checked against the model.
    folder, model = saved
    model.users.save(str(tmp_path / "users.npy"))
    recommender_aoti.export_package(model, tmp_path / "model_cuda.pt2", device="cuda")
    out = subprocess.run([sys.executable, str(ROOT / "torchscript_examples" / "load_test.py"), "--server",
                          binary("speedtorch_server"), "--model", str(folder / "model.pt"), "--package",
                          str(tmp_path / "model_cuda.pt2"), "--table", str(tmp_path / "users.npy"), "--device",
                          "cuda", "--clients", "4", "--requests", "60", "--threads", "4"],
                         capture_output=True, text=True, timeout=600)
    print(out.stdout)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.splitlines()[-1] == "0 wrong answers"
    with load_test.Server(binary("speedtorch_server"), str(tmp_path / "model_cuda.pt2"), threads=2, device="cuda",
                          table=str(tmp_path / "users.npy")) as srv:
        assert srv.post("/update", {"ids": [5], "rows": [[0.25] * 16]}) == (200, {"updated": 1})
        assert srv.post("/lookup", {"ids": [5, 5]})[1]["rows"] == [[0.25] * 16] * 2


@pytest.mark.skipif(SERVES_PACKAGES, reason="this server serves packages (test_load_test_compares_both_forms)")
def test_a_server_built_before_torch_2_10_refuses_a_package_saying_why(saved, tmp_path):
    # Its torch's package loader lacks what the AOTInductor runner uses: the server says so before reading the file.
    package = tmp_path / "model.pt2"
    package.write_bytes(b"not read")
    out = subprocess.run([binary("speedtorch_server"), str(package), "--table", str(tmp_path / "users.npy")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "PyTorch >= 2.10" in out.stderr and "scripted model" in out.stderr, out.stderr


def _start_server(folder: Path) -> subprocess.Popen:
    proc = subprocess.Popen([binary("speedtorch_server"), str(folder / "model.pt"), "--port", "0", "--threads", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line.startswith("listening on "), (line, proc.stderr.read() if proc.poll() is not None else "")
    return proc


def _stopped_cleanly(proc: subprocess.Popen, signum: int) -> str:
    try:
        proc.wait(timeout=30)  # it writes a line or two to its pipes: they cannot fill
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"the server did not stop on signal {signum} within 30 s") from None
    err = proc.stderr.read()  # the pipe stays open for load_test.Server's exit
    assert proc.returncode == 0, err
    assert f"stopping on signal {signum}" in err, err
    return err


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_server_stops_cleanly_on_a_signal_right_after_it_starts(saved, signum):
    # Sent as soon as the port is announced, possibly before the server loop runs: the stop must not be lost.
    folder, _ = saved
    for _ in range(3):
        proc = _start_server(folder)
        proc.send_signal(signum)
        _stopped_cleanly(proc, signum)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_server_stops_cleanly_on_a_signal_while_serving(saved, signum):
    folder, _ = saved
    with load_test.Server(binary("speedtorch_server"), str(folder / "model.pt"), threads=2) as srv:
        assert srv.post("/lookup", {"ids": [1, 2]})[0] == 200
        done = threading.Event()
        answered: list[int] = []
        errors: list[str] = []

        def client():
            while not done.is_set():
                try:
                    answered.append(srv.post("/lookup", {"ids": [3]})[0])
                except OSError:  # refused or reset once the server has stopped
                    return
                except Exception as e:  # noqa: BLE001 - anything else is a failure
                    errors.append(repr(e))
                    return

        threads = [threading.Thread(target=client) for _ in range(3)]
        for t in threads:
            t.start()
        while len(answered) < 6 and not errors:  # requests are in flight
            time.sleep(0.01)
        srv.proc.send_signal(signum)
        try:
            _stopped_cleanly(srv.proc, signum)
        finally:
            done.set()
            for t in threads:
                t.join(30)
        assert errors == [] and set(answered) == {200}


@pytest.mark.parametrize("args", [["--port", "abc"], ["--threads", "4x"], ["--port", "70000"], ["--threads", "0"],
                                  ["--max-batch", ""], ["--port", " 80"], ["--threads"]],
                         ids=["port-abc", "threads-4x", "port-70000", "threads-0", "max-batch-empty",
                              "port-space", "no-value"])
def test_server_refuses_numbers_it_cannot_read_whole(saved, args):
    # atoi read "4x" as 4 and "abc" as 0 (a random port): every number is read whole, or the server says why.
    folder, _ = saved
    out = subprocess.run([binary("speedtorch_server"), str(folder / "model.pt")] + args, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2, (out.returncode, out.stdout, out.stderr)
    assert args[0] in out.stderr and out.stdout == ""


def test_server_that_cannot_listen_says_so_and_fails(saved):
    # It printed "listening on HOST:-1" and exited 0 when the port was taken.
    folder, _ = saved
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run([binary("speedtorch_server"), str(folder / "model.pt"), "--port", str(port)],
                             capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, (out.stdout, out.stderr)
    assert "listening" not in out.stdout and f"cannot listen on 127.0.0.1 port {port}" in out.stderr, out.stderr
