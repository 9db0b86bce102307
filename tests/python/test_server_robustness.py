"""The example server (torchscript_examples/http_server.h) under clients that are slow, idle, hostile or many: keep-
alive at full rate, deadlines that do not restart per byte, a connection cap, body limits that hold for chunked
bodies, 404 / 405 for paths and methods it does not serve, and SIGTERM that answers every request it has received
(issue 27). Each check that /health still answers bounds the wait at a few seconds: the stalls these tests guard
against lasted 15 to 32 s, or forever."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "torchscript_examples"))
import load_test  # noqa: E402
import recommender_model  # noqa: E402

BUILD = Path(os.environ.get("SPEEDTORCH_BUILD_DIR", ROOT / "build")) / "torchscript_examples"
DIM = 8
FLAGS = ["--header-timeout", "1", "--body-timeout", "1", "--max-connections", "48", "--max-body-bytes", "1000000",
         "--threads", "2"]


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    path = BUILD / "speedtorch_server"
    if not path.exists():
        pytest.skip(f"{path} not built")
    folder = tmp_path_factory.mktemp("robust")
    torch.jit.save(torch.jit.script(recommender_model.Recommender(500, 50, DIM)), str(folder / "model.pt"))
    return str(path), str(folder / "model.pt")


@pytest.fixture(scope="module")
def srv(model_file):
    with load_test.Server(*model_file, extra=FLAGS) as server:
        yield server


def address(srv) -> tuple[str, int]:
    host, port = srv.url[len("http://"):].rsplit(":", 1)
    return host, int(port)


def connect(srv) -> socket.socket:
    return socket.create_connection(address(srv), timeout=10)


def read_answers(conn: socket.socket, count: int) -> list[tuple[int, dict, bytes]]:
    """`count` answers (Content-Length framed) from `conn`: status, headers (lower-case names), body."""
    data, answers = b"", []
    while len(answers) < count:
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                raise ConnectionError(f"closed after {data!r}")
            data += chunk
        head, _, data = data.partition(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        length = int(headers.get("content-length", 0))
        while len(data) < length:
            chunk = conn.recv(65536)
            if not chunk:
                raise ConnectionError("closed in a body")
            data += chunk
        answers.append((int(lines[0].split()[1]), headers, data[:length]))
        data = data[length:]
    return answers


def read_answer(conn: socket.socket) -> tuple[int, dict, bytes]:
    return read_answers(conn, 1)[0]


def health_within(srv, seconds: float) -> bool:
    """/health on a new connection answers 200 within `seconds`."""
    start = time.monotonic()
    conn = http.client.HTTPConnection(*address(srv), timeout=seconds)
    try:
        conn.request("GET", "/health")
        return conn.getresponse().status == 200 and time.monotonic() - start < seconds
    except OSError:
        return False
    finally:
        conn.close()


def test_keep_alive_answers_at_full_rate(srv):
    # Without TCP_NODELAY an answer's head and body met the client's delayed ACK: 43 ms a request, so 200 requests
    # on one connection took 8.6 s. With it they take a few ms each even on a loaded machine.
    conn = http.client.HTTPConnection(*address(srv), timeout=10)
    start = time.monotonic()
    for i in range(200):
        conn.request("POST", "/lookup", body=json.dumps({"ids": [i % 500, 3]}),
                     headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        assert response.status == 200 and len(json.loads(response.read())["rows"]) == 2
    assert time.monotonic() - start < 4.0
    conn.close()


def test_pipelined_requests_are_answered_in_order(srv):
    with connect(srv) as conn:
        bodies = [json.dumps({"ids": [i]}).encode() for i in range(5)]
        conn.sendall(b"".join(b"POST /lookup HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s" % (len(b), b) for b in bodies))
        rows = [json.loads(body)["rows"][0] for _, _, body in read_answers(conn, len(bodies))]
    model = torch.jit.load(srv.cmd[1])
    assert rows == model.lookup(torch.arange(5)).tolist()


def test_idle_and_slow_clients_do_not_stall_health(srv):
    # 40 idle connections, 4 clients sending a header byte every 0.2 s and 4 sending a body byte every 0.2 s: the
    # loop serves everyone, and the slow ones are cut off by deadlines that do not restart per byte (408).
    idle = [connect(srv) for _ in range(40)]
    slow_heads = [connect(srv) for _ in range(4)]
    slow_bodies = [connect(srv) for _ in range(4)]
    for s in slow_bodies:
        s.sendall(b"POST /lookup HTTP/1.1\r\nContent-Length: 1000\r\n\r\n{")
    try:
        start = time.monotonic()
        answers: dict[socket.socket, int] = {}
        while time.monotonic() - start < 3.0 and len(answers) < 8:
            for s in slow_heads + slow_bodies:
                if s in answers:
                    continue
                try:
                    s.sendall(b"X-Slow: 1\r\n" if s in slow_heads else b" ")
                    s.setblocking(False)
                    answers[s] = read_answer(s)[0]
                except (BlockingIOError, ConnectionError, BrokenPipeError, ConnectionResetError):
                    pass
                finally:
                    s.setblocking(True)
            assert health_within(srv, 1.0)
            time.sleep(0.2)
        assert list(answers.values()) == [408] * 8 and time.monotonic() - start < 2.9
    finally:
        for s in idle + slow_heads + slow_bodies:
            s.close()


def test_connection_cap_closes_idle_connections_first_then_refuses(srv):
    # --max-connections 48: idle connections make room for new ones (the oldest is closed); when every connection
    # is busy with a request, a newcomer gets 503 at once instead of waiting.
    idle = [connect(srv) for _ in range(60)]
    try:
        assert health_within(srv, 2.0)
    finally:
        for s in idle:
            s.close()
    time.sleep(0.2)
    busy = [connect(srv) for _ in range(48)]
    try:
        for s in busy:
            s.sendall(b"POST /lookup HTTP/1.1\r\nContent-Length: 100\r\n\r\n{")  # a body on its way
        time.sleep(0.2)
        with connect(srv) as newcomer:
            newcomer.sendall(b"GET /health HTTP/1.1\r\n\r\n")
            assert read_answer(newcomer)[0] == 503
    finally:
        for s in busy:
            s.close()
    time.sleep(0.2)
    assert health_within(srv, 2.0)


def test_body_limits_hold_for_chunked_bodies(srv):
    # --max-body-bytes 1000000: an announced body over it is refused before it is read; a chunked one when the
    # chunk that passes it is announced (the server never holds more than the limit).
    with connect(srv) as conn:
        conn.sendall(b"POST /update HTTP/1.1\r\nContent-Length: 1000001\r\n\r\n")
        assert read_answer(conn)[0] == 413
    with connect(srv) as conn:
        conn.sendall(b"POST /update HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n")
        status = None
        for _ in range(40):  # 40 chunks of 64 KiB: 2.6 MB
            try:
                conn.sendall(b"10000\r\n" + b"[" * 0x10000 + b"\r\n")
            except (BrokenPipeError, ConnectionResetError):
                break
        status = read_answer(conn)[0]
        assert status == 413
    assert health_within(srv, 2.0)


def test_paths_methods_and_bodies_are_answered_by_what_they_are(srv):
    conn = http.client.HTTPConnection(*address(srv), timeout=10)
    conn.request("GET", "/no/such/path")
    response = conn.getresponse()
    assert response.status == 404 and b"no such path" in response.read()
    conn.request("GET", "/lookup")
    response = conn.getresponse()
    assert response.status == 405 and response.getheader("Allow") == "POST"
    response.read()
    # curl -d sends a form content type: the body is read as JSON all the same, however large.
    ids = list(range(500)) * 8
    conn.request("POST", "/lookup", body=json.dumps({"ids": ids[:4000]}),
                 headers={"Content-Type": "application/x-www-form-urlencoded"})
    response = conn.getresponse()
    assert response.status == 200 and len(json.loads(response.read())["rows"]) == 4000
    conn.close()
    # A POST without Content-Length: 411 at once, not a wait for a body (test_server_first_use.py says more).
    with connect(srv) as raw:
        start = time.monotonic()
        raw.sendall(b"POST /lookup HTTP/1.1\r\n\r\n")
        assert read_answer(raw)[0] == 411 and time.monotonic() - start < 1.0
    # curl's Expect: 100-continue gets its 100 before the body is sent.
    with connect(srv) as raw:
        body = json.dumps({"ids": [1]}).encode()
        raw.sendall(b"POST /lookup HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(body))
        assert raw.recv(100).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        raw.sendall(body)
        assert read_answer(raw)[0] == 200
    # Malformed requests get their 4xx and the connection closes.
    with connect(srv) as raw:
        raw.sendall(b"GET / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n")
        status, headers, _ = read_answer(raw)
        assert status == 400 and headers["connection"] == "close"


def test_sigterm_answers_every_request_it_received(model_file):
    # Requests sent whole before the signal are all answered, then the server exits 0 (they were dropped when
    # queued behind busy workers).
    with load_test.Server(*model_file, threads=1, extra=["--batch-window-us", "0"]) as server:
        conns = [connect(server) for _ in range(24)]
        for i, conn in enumerate(conns):
            body = json.dumps({"ids": list(range(400))}).encode()
            conn.sendall(b"POST /lookup HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        server.proc.send_signal(signal.SIGTERM)
        statuses = []
        for conn in conns:
            status, headers, body = read_answer(conn)
            statuses.append(status)
            assert len(json.loads(body)["rows"]) == 400
            # An answer written after the signal says it closes; one the worker finished before the signal arrived
            # (a race the test cannot order) keeps the connection alive, and the stop then closes it idle.
            if headers.get("connection") != "close":
                assert conn.recv(1) == b""
            conn.close()
        assert server.proc.wait(30) == 0
    assert statuses == [200] * 24
