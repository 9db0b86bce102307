"""GET /metrics of the C++ example server (torchscript_examples/request_metrics.h): well-formed Prometheus text
with per-endpoint request counts and latency histograms, and the library counters, which match the requests served.
The server comes from the CMake build, as in test_torchscript_examples.py."""

from __future__ import annotations

import os
import re
import socket
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "torchscript_examples"))
import load_test  # noqa: E402
import recommender_model  # noqa: E402

BUILD = Path(os.environ.get("SPEEDTORCH_BUILD_DIR", ROOT / "build")) / "torchscript_examples"
DIM = 8

NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*"'
SAMPLE = re.compile(rf"^({NAME})(?:\{{({LABEL}(?:,{LABEL})*)\}})? (\S+)$")


def parse(text: str) -> dict[tuple[str, frozenset], float]:
    """Checks the text exposition format line by line and returns {(sample name, labels): value}."""
    assert text.endswith("\n")
    types: dict[str, str] = {}
    samples: dict[tuple[str, frozenset], float] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("# HELP "):
            current = line.split(" ", 3)[2]
            assert re.fullmatch(NAME, current) and current not in types, line
        elif line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert name == current and kind in ("counter", "gauge", "histogram"), line
            types[name] = kind
        else:
            m = SAMPLE.match(line)
            assert m, f"not a sample line: {line!r}"
            name, labels, value = m.group(1), m.group(2), float(m.group(3))
            kind = types[current]
            if kind == "counter":
                assert name == current and name.endswith("_total") and value >= 0, line
            elif kind == "histogram":
                assert name in (current + "_bucket", current + "_sum", current + "_count"), line
            pairs = frozenset(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', labels or ""))
            assert (name, pairs) not in samples, f"duplicate sample {line!r}"
            samples[(name, pairs)] = value
    # Histograms: cumulative buckets ending in +Inf, which equals _count.
    for (name, labels), value in samples.items():
        if name.endswith("_count") and types.get(name[: -len("_count")]) == "histogram":
            base, rest = name[: -len("_count")], labels
            buckets = sorted(((float(dict(l)["le"]), v) for (n, l), v in samples.items()
                              if n == base + "_bucket" and l - {("le", dict(l)["le"])} == rest))  # fmt: skip
            assert buckets and buckets[-1][0] == float("inf") and buckets[-1][1] == value
            assert all(a[1] <= b[1] for a, b in zip(buckets, buckets[1:]))
    return samples


def value(samples, name: str, **labels) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    path = BUILD / "speedtorch_server"
    if not path.exists():
        pytest.skip(f"{path} not built")
    folder = tmp_path_factory.mktemp("metrics")
    model = torch.jit.script(recommender_model.Recommender(500, 50, DIM))
    torch.jit.save(model, str(folder / "model.pt"))
    return str(path), str(folder / "model.pt")


def get(srv, path: str) -> tuple[int, str, str]:
    with urllib.request.urlopen(srv.url + path, timeout=30) as response:
        return response.status, response.headers["Content-Type"], response.read().decode()


def test_metrics_endpoint_counts_requests_and_rows(model_file):
    binary, model = model_file
    with load_test.Server(binary, model, threads=2, max_batch=64) as srv:
        ids = [[1, 2, 3], [4], [7, 7, 8, 9, 10]]
        for batch in ids:
            assert srv.post("/lookup", {"ids": batch})[0] == 200
        assert srv.post("/lookup", {"ids": [500]})[0] == 404  # refused before any row moves
        status, content_type, text = get(srv, "/metrics")
        assert status == 200 and content_type.startswith("text/plain; version=0.0.4")
        samples = parse(text)
        for family in ("speedtorch_server_requests_total", "speedtorch_server_request_duration_seconds",
                       "speedtorch_gather_calls_total", "speedtorch_cache_hits_total"):  # fmt: skip
            assert f"# TYPE {family} " in text
        lookup = {"method": "POST", "endpoint": "/lookup"}
        assert value(samples, "speedtorch_server_requests_total", status="200", **lookup) == 3
        assert value(samples, "speedtorch_server_requests_total", status="404", **lookup) == 1
        assert value(samples, "speedtorch_server_request_duration_seconds_count", **lookup) == 4
        assert value(samples, "speedtorch_server_request_duration_seconds_sum", **lookup) > 0
        rows = sum(len(b) for b in ids)
        assert value(samples, "speedtorch_gather_calls_total") == 3
        assert value(samples, "speedtorch_cpu_gather_rows_total") == rows
        assert value(samples, "speedtorch_cpu_gather_bytes_total") == rows * DIM * 4

        # Unknown paths share one series; /metrics counts itself (after it has answered).
        with pytest.raises(urllib.error.HTTPError):
            get(srv, "/no/such/path")
        samples = parse(get(srv, "/metrics")[2])
        assert value(samples, "speedtorch_server_requests_total", method="GET", endpoint="other", status="404") == 1
        assert value(samples, "speedtorch_server_requests_total", method="GET", endpoint="/metrics",
                     status="200") == 1  # fmt: skip
        assert srv.proc.poll() is None


def test_metrics_text_parses_with_the_prometheus_client(model_file):
    parser = pytest.importorskip("prometheus_client.parser")
    binary, model = model_file
    with load_test.Server(binary, model, threads=2) as srv:
        srv.post("/score", {"users": [1, 2], "items": [3, 4]})
        families = {f.name: f for f in parser.text_string_to_metric_families(get(srv, "/metrics")[2])}
    # The client names counter families without _total.
    assert families["speedtorch_server_requests"].type == "counter"
    assert families["speedtorch_server_request_duration_seconds"].type == "histogram"
    assert families["speedtorch_gather_calls"].samples[0].value == 1


def raw_request(srv, data: bytes) -> bytes:
    """Sends `data` on a connection of its own and returns the server's answer: its head and the Content-Length bytes
    of body after it (or what came before the server closed)."""
    host, port = srv.url[len("http://"):].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as conn:
        conn.sendall(data)
        answer = b""
        while b"\r\n\r\n" not in answer and (chunk := conn.recv(65536)):
            answer += chunk
        head, _, body = answer.partition(b"\r\n\r\n")
        length = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)
        while length and len(body) < int(length.group(1)) and (chunk := conn.recv(65536)):
            body += chunk
    return head + b"\r\n\r\n" + body


def test_methods_are_counted_from_a_closed_set(model_file):
    # Made-up methods (and bytes that are not UTF-8) all count as method "other": the series do not grow with
    # what clients send, and the text stays valid UTF-8 (issue 22, item 15).
    binary, model = model_file
    with load_test.Server(binary, model, threads=2) as srv:
        for i in range(50):
            answer = raw_request(srv, f"M{i} /lookup HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            assert answer.startswith(b"HTTP/1.1 4"), answer
        raw_request(srv, b"G\xff\xfeT /lookup HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer = raw_request(srv, b"DELETE /lookup HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 4"), answer
        assert srv.post("/lookup", {"ids": [1]})[0] == 200
        raw = urllib.request.urlopen(srv.url + "/metrics", timeout=30).read()
        text = raw.decode("utf-8")  # raises if not UTF-8
        samples = parse(text)
        methods = {dict(labels)["method"] for name, labels in samples if name == "speedtorch_server_requests_total"}
        assert methods <= {"GET", "POST", "DELETE", "other"}, methods
        other = sum(v for (name, labels), v in samples.items()
                    if name == "speedtorch_server_requests_total" and dict(labels)["method"] == "other")
        assert other >= 50  # the malformed request line may be refused before it is counted
        assert value(samples, "speedtorch_server_requests_total", method="POST", endpoint="/lookup", status="200") == 1
        assert "M1" not in text and srv.proc.poll() is None
