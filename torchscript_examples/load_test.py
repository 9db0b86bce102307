"""Load test of speedtorch_server: starts it on 127.0.0.1 (a free port) with a scripted recommender, drives it from
several client threads for a bounded number of requests, checks every answer against the same model run in Python
(torch.jit.load), and reports throughput and p50/p99 latency.

    python torchscript_examples/load_test.py --server build/torchscript_examples/speedtorch_server --model model.pt
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
import speedtorch  # noqa: E402,F401  (registers the PinnedEmbedding class for torch.jit.load)


class Server:
    """speedtorch_server as a context manager: started on a free port, stopped (SIGTERM) on exit."""

    def __init__(self, binary: str, model: str, threads: int = 8, max_batch: int = 4096, device: str = "cpu"):
        self.cmd = [binary, model, "--port", "0", "--threads", str(threads), "--max-batch", str(max_batch),
                    "--device", device]

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
        data = payload if raw else json.dumps(payload).encode()
        request = urllib.request.Request(self.url + path, data=data, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")


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
                items, _ = model.top_k(user, k)
                ok = status == 200 and body["items"] == items.tolist()
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests", type=int, default=500, help="per client")
    parser.add_argument("--threads", type=int, default=8, help="server threads")
    parser.add_argument("--device", default="cpu", help="where the server runs the model (cpu, cuda)")
    args = parser.parse_args()
    model = torch.jit.load(args.model)
    with Server(args.server, args.model, args.threads, device=args.device) as server:
        result = run(server, model, args.clients, args.requests)
    print(json.dumps({"device": args.device, "clients": args.clients, "server threads": args.threads,
                      **{k: v for k, v in result.items() if k != "failures"}}, indent=1))
    print(f"{len(result['failures'])} wrong answers")
    return 1 if result["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
