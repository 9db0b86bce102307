"""Load test of speedtorch_server: starts it on 127.0.0.1 (a free port) with a scripted recommender, and with its
AOTInductor package when one is given (recommender_aoti.py), drives each with the same bounded stream of requests
from keep-alive clients, checks every answer, and reports throughput and p50/p99 latency side by side.

Two kinds of client:
- Python threads (the default): lookups, top-k and scores over the server's JSON endpoints, each answer checked
  against the model run in Python (torch.jit.load);
- the C++ load generator (--load-client, load_client.cpp), for rates a Python thread per client cannot reach:
  lookups in the Open Inference Protocol with binary tensors (or its JSON form, or /lookup) mixed with /updates,
  rows checked bit for bit against the table, updated rows whole and read back by their writer; --ceiling also
  measures the client itself against a trivial endpoint.

    python torchscript_examples/load_test.py --server build/torchscript_examples/speedtorch_server --model model.pt \
        [--package model.pt2 --table users.npy] [--quantized model_int8.pt [--quantized-package model_int8.pt2]] \
        [--load-client build/torchscript_examples/speedtorch_load_client --clients 64 --seconds 10 \
        --update-every 50 --ceiling]

--quantized also serves a serving copy of the model (quantized_recommender.py: a float16, bf16, int8 or fp8 user
table), and --quantized-package its AOTInductor package over the copy's table file; their answers are checked
against the copy run in Python (the library's own dequantizing gather), and their runs send no /update (the copy is
read-only). quantized_accuracy.py compares the copy's answers with the float32 model's.
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
import speedtorch  # noqa: E402,F401  (registers the PinnedEmbedding class for torch.jit.load)


class Server:
    """speedtorch_server as a context manager: started on a free port, stopped (SIGTERM) on exit."""

    def __init__(self, binary: str, model: str, threads: int = 8, max_batch: int = 4096, device: str = "cpu",
                 table: str | None = None, extra: list[str] | tuple = ()):
        """model: a scripted model (.pt) or an AOTInductor package (.pt2, with its user table's files `table`);
        `extra`: more server options."""
        self.cmd = [binary, model, "--port", "0", "--threads", str(threads), "--max-batch", str(max_batch),
                    "--device", device] + (["--table", table] if table else []) + list(extra)
        self._connections = threading.local()  # one keep-alive connection per client thread

    def __enter__(self):
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("listening on "):
            self.proc.kill()
            raise RuntimeError(f"server did not start: {line!r} {self.proc.stderr.read()}")
        self.url = "http://" + line.split()[-1]
        return self

    def __exit__(self, *exc):
        if self.proc.poll() is not None:  # it died: show why
            print(f"server exited with {self.proc.returncode}: {self.proc.stderr.read()[-4000:]}", file=sys.stderr)
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()

    def post(self, path: str, payload, raw: bool = False):
        """POSTs JSON (or `raw` bytes) on this thread's keep-alive connection: (status, decoded JSON answer)."""
        data = payload if raw else json.dumps(payload).encode()
        for attempt in range(2):
            conn = getattr(self._connections, "conn", None)
            if conn is None:
                host, port = self.url[len("http://"):].rsplit(":", 1)
                conn = self._connections.conn = http.client.HTTPConnection(host, int(port), timeout=30)
            try:
                conn.request("POST", path, body=data, headers={"Content-Type": "application/json"})
                response = conn.getresponse()
                body = response.read()
                if response.getheader("Connection", "").lower() == "close":
                    conn.close()
                    self._connections.conn = None
                return response.status, json.loads(body or b"{}")
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                conn.close()  # the server closed an idle kept-alive connection: once more on a new one
                self._connections.conn = None
                if attempt == 1:
                    raise


def same_top_k(model, user: int, k: int, body: dict) -> bool:
    """Whether a /topk answer is the model's: the same scores, and the same items, or items that score what the
    answer says (a compiled model rounds differently, which may swap items whose scores tie within 1e-5)."""
    items, scores = model.top_k(user, k)
    got = torch.tensor(body["scores"])
    if len(body["items"]) != len(items) or not torch.allclose(got, scores, atol=1e-5):
        return False
    if body["items"] == items.tolist():
        return True
    rescored = model.score(torch.full((len(items),), user), torch.tensor(body["items"]))
    return len(set(body["items"])) == len(items) and torch.allclose(rescored, got, atol=1e-5)


def run(server: Server, model, clients: int, requests: int, seed: int = 0) -> dict:
    """`requests` per client of lookup / top-k / score, each answer checked against `model`."""
    num_users = model.num_users()
    num_items = model.items.shape[0]
    latencies: list[float] = []
    failures: list[str] = []
    lock = threading.Lock()

    def client(index: int):
        rng = random.Random(seed + index)
        for _ in range(requests):
            kind = rng.choice(("lookup", "topk", "score"))
            start = time.perf_counter()
            if kind == "lookup":
                ids = [rng.randrange(num_users) for _ in range(rng.randint(1, 64))]
                status, body = server.post("/lookup", {"ids": ids})
                ok = status == 200 and torch.allclose(torch.tensor(body["rows"]), model.lookup(torch.tensor(ids)))
            elif kind == "topk":
                user, k = rng.randrange(num_users), rng.randint(1, 20)
                status, body = server.post("/topk", {"user": user, "k": k})
                ok = status == 200 and same_top_k(model, user, k, body)
            else:
                users = [rng.randrange(num_users) for _ in range(16)]
                items = [rng.randrange(num_items) for _ in range(16)]
                status, body = server.post("/score", {"users": users, "items": items})
                expected = model.score(torch.tensor(users), torch.tensor(items))
                ok = status == 200 and torch.allclose(torch.tensor(body["scores"]), expected, atol=1e-5)
            elapsed = time.perf_counter() - start
            with lock:
                latencies.append(elapsed)
                if not ok:
                    failures.append(f"{kind}: status {status}")

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    latencies.sort()
    return {"requests": len(latencies), "failures": failures, "seconds": wall, "req/s": len(latencies) / wall,
            "p50 ms": 1e3 * statistics.median(latencies),
            "p99 ms": 1e3 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]}


def side_by_side(results: dict[str, dict]) -> str:
    """A table of the runs' figures, with each run's throughput as a ratio to the first's."""
    names = list(results)
    first = results[names[0]]["req/s"]
    lines = [f"{'server':<26} {'requests':>8} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'req/s ratio':>11} {'wrong':>5}"]
    for name in names:
        r = results[name]
        lines.append(f"{name:<26} {r['requests']:>8} {r['req/s']:>9.1f} {r['p50 ms']:>8.2f} {r['p99 ms']:>8.2f} "
                     f"{r['req/s'] / first:>10.2f}x {len(r['failures']):>5}")
    return "\n".join(lines)


def run_load_client(client: str, server: Server, expected: Path, users: int, dim: int, clients: int,
                    requests: int, seconds: int, protocol: str, update_every: int, warmup: int,
                    path: str | None = None, keep_alive: bool = True) -> dict:
    """The C++ load generator (load_client.cpp) against `server`: `clients` keep-alive connections for `requests`
    each (or `seconds`), lookups in `protocol` mixed with an /update every `update_every` requests, every answer
    checked against the table in `expected` (float32 rows as the server starts with them)."""
    port = server.url.rsplit(":", 1)[1]
    # Niced: 64 client threads that are always runnable would otherwise take most of the CPU time from the
    # server's few threads (the scheduler shares it per thread), and the client would be what is measured.
    cmd = ["nice", "-n", "10", client, "--port", port, "--clients", str(clients), "--warmup", str(warmup), "--protocol", protocol,
           "--update-every", str(update_every), "--users", str(users), "--dim", str(dim), "--expected", str(expected)]
    cmd += ["--seconds", str(seconds)] if seconds else ["--requests", str(requests)]
    if path:
        cmd += ["--path", path]
    if not keep_alive:
        cmd += ["--keep-alive", "0"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if not out.stdout.strip():
        raise RuntimeError(f"the load client failed: {out.stderr}")
    r = json.loads(out.stdout.strip().splitlines()[-1])
    failures = [r["first_problem"]] * (r["wrong"] + r["errors"])
    return {"requests": r["requests"], "failures": failures, "seconds": r["seconds"], "req/s": r["req_per_s"],
            "p50 ms": r["p50_ms"], "p99 ms": r["p99_ms"]}


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", required=True)
    parser.add_argument("--model", required=True, help="the scripted model: served, and the reference answers")
    parser.add_argument("--package", help="its AOTInductor package (recommender_aoti.py), served too")
    parser.add_argument("--table", help="the package's user table files (recommender_aoti.py --table)")
    parser.add_argument("--quantized", help="a serving copy of the model (quantized_recommender.py), served too and "
                        "checked against itself run in Python; its runs send no /update (the copy is read-only)")
    parser.add_argument("--quantized-package", help="the serving copy's AOTInductor package (recommender_aoti.py "
                        "--model COPY.pt), served too, over the copy's table file")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests", type=int, default=500, help="per client")
    parser.add_argument("--threads", type=int, default=8, help="server threads")
    parser.add_argument("--warmup", type=int, default=10, help="requests per client before the timed ones (checked, "
                        "not timed: the first calls of a scripted model are profiled and optimised)")
    parser.add_argument("--device", default="cpu", help="where the server runs the model (cpu, cuda)")
    parser.add_argument("--load-client", help="the C++ load generator (build/torchscript_examples/"
                        "speedtorch_load_client): lookups mixed with /updates, keep-alive, every answer checked; "
                        "without it Python threads send lookups, top-k and scores")
    parser.add_argument("--protocol", default="binary", choices=["binary", "v2json", "json"],
                        help="the load client's lookups: Open Inference Protocol with binary tensors, its JSON form, "
                        "or the server's own /lookup")
    parser.add_argument("--seconds", type=int, default=0, help="with --load-client: run this long instead of "
                        "--requests per client")
    parser.add_argument("--update-every", type=int, default=0, help="with --load-client: every Nth request of a "
                        "client is an /update (0: none)")
    parser.add_argument("--ceiling", action="store_true", help="with --load-client: also measure the client's own "
                        "ceiling against GET /v2/health/ready (answered by the server's event loop alone)")
    parser.add_argument("--no-keep-alive", action="store_true", help="with --load-client: a new connection per "
                        "request, for comparison")
    parser.add_argument("--server-args", default="", help="more server options, e.g. '--batch-window-us 500'")
    args = parser.parse_args()
    if bool(args.package) != bool(args.table):
        parser.error("--package and --table go together")
    if args.quantized_package and not args.quantized:
        parser.error("--quantized-package needs --quantized (the serving copy it was compiled from)")
    model = torch.jit.load(args.model)
    # name: (served file, its table files, the reference model, whether /updates are sent)
    served = {"torchscript": (args.model, None, model, True)}
    if args.package:
        served["aoti"] = (args.package, args.table, model, True)
    if args.quantized:
        copy = torch.jit.load(args.quantized)
        served[f"torchscript {copy.table_format}"] = (args.quantized, None, copy, False)
        if args.quantized_package:
            table = torch.ops.speedtorch.resolve_sidecar_path(copy.table_path)
            served[f"aoti {copy.table_format}"] = (args.quantized_package, table, copy, False)
    results = {}
    expected_rows: dict[int, Path] = {}  # the rows every server of one reference starts with, for the load client
    users, dim = model.num_users(), model.items.shape[1]
    extra = args.server_args.split()
    for name, (path, table, reference, updates) in served.items():
        if args.load_client and id(reference) not in expected_rows:
            expected_rows[id(reference)] = Path(tempfile.mkdtemp()) / "table.f32"
            rows = reference.users.table() if reference is model else reference.lookup(torch.arange(users))
            rows.float().contiguous().numpy().tofile(expected_rows[id(reference)])
        with Server(args.server, path, args.threads, device=args.device, table=table, extra=extra) as server:
            if args.load_client:
                expected = expected_rows[id(reference)]
                if args.ceiling and not results:  # once: it measures the client and the server's event loop
                    results[f"{name} ceiling"] = run_load_client(
                        args.load_client, server, expected, users, dim, args.clients, args.requests, args.seconds,
                        args.protocol, 0, args.warmup, path="/v2/health/ready")
                results[name] = run_load_client(args.load_client, server, expected, users, dim, args.clients,
                                                args.requests, args.seconds, args.protocol,
                                                args.update_every if updates else 0, args.warmup,
                                                keep_alive=not args.no_keep_alive)
            else:
                warmup = (run(server, reference, args.clients, args.warmup, seed=1000) if args.warmup
                          else {"failures": []})
                results[name] = run(server, reference, args.clients, args.requests)
                results[name]["failures"] += warmup["failures"]
        for failure in results[name]["failures"][:10]:
            print(f"{name}: wrong answer: {failure}", file=sys.stderr)
    amount = f"{args.seconds} s" if args.load_client and args.seconds else f"{args.requests} requests"
    how = (f"C++ load client{' (no keep-alive)' if args.no_keep_alive else ''}, {args.protocol} lookups" + (f", /update every {args.update_every}" if
                                                           args.update_every else "")) if args.load_client else \
        "Python clients, lookup/topk/score"
    if args.load_client and args.update_every and args.quantized:
        how += " (none to the read-only serving copies)"
    kept = "" if args.load_client and args.no_keep_alive else "keep-alive "
    print(f"device {args.device}, {args.clients} {kept}clients x {amount}, {how}, {args.threads} server "
          f"threads, load average {load_average()}")
    print(side_by_side(results))
    wrong = sum(len(r["failures"]) for r in results.values())
    print(f"{wrong} wrong answers")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
