"""Load test of speedtorch_server: starts it on 127.0.0.1 (a free port) with a scripted recommender, and with its
AOTInductor package when one is given (recommender_aoti.py), drives each from several client threads for a bounded
number of requests (the same requests for both), checks every answer against the model run in Python
(torch.jit.load), and reports throughput and p50/p99 latency side by side.

    python torchscript_examples/load_test.py --server build/torchscript_examples/speedtorch_server --model model.pt \
        [--package model.pt2 --table users.npy]
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import statistics
import subprocess
import sys
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
    lines = [f"{'server':<12} {'requests':>8} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'req/s ratio':>11} {'wrong':>5}"]
    for name in names:
        r = results[name]
        lines.append(f"{name:<12} {r['requests']:>8} {r['req/s']:>9.1f} {r['p50 ms']:>8.2f} {r['p99 ms']:>8.2f} "
                     f"{r['req/s'] / first:>10.2f}x {len(r['failures']):>5}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", required=True)
    parser.add_argument("--model", required=True, help="the scripted model: served, and the reference answers")
    parser.add_argument("--package", help="its AOTInductor package (recommender_aoti.py), served too")
    parser.add_argument("--table", help="the package's user table files (recommender_aoti.py --table)")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests", type=int, default=500, help="per client")
    parser.add_argument("--threads", type=int, default=8, help="server threads")
    parser.add_argument("--warmup", type=int, default=10, help="requests per client before the timed ones (checked, "
                        "not timed: the first calls of a scripted model are profiled and optimised)")
    parser.add_argument("--device", default="cpu", help="where the server runs the model (cpu, cuda)")
    args = parser.parse_args()
    if bool(args.package) != bool(args.table):
        parser.error("--package and --table go together")
    model = torch.jit.load(args.model)
    served = {"torchscript": (args.model, None)}
    if args.package:
        served["aoti"] = (args.package, args.table)
    results = {}
    for name, (path, table) in served.items():
        with Server(args.server, path, args.threads, device=args.device, table=table) as server:
            warmup = run(server, model, args.clients, args.warmup, seed=1000) if args.warmup else {"failures": []}
            results[name] = run(server, model, args.clients, args.requests)
            results[name]["failures"] += warmup["failures"]
        for failure in results[name]["failures"][:10]:
            print(f"{name}: wrong answer: {failure}", file=sys.stderr)
    print(f"device {args.device}, {args.clients} clients x {args.requests} requests, {args.threads} server threads")
    print(side_by_side(results))
    wrong = sum(len(r["failures"]) for r in results.values())
    print(f"{wrong} wrong answers")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
