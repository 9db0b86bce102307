"""Peak memory of speedtorch_server reading request bodies of the maximum size: the figures of docs/torchscript.md's
memory bound (issue 27). Each shape runs in a fresh server (the peak, VmHWM, only rises); one JSON line each.

    python torchscript_examples/body_memory.py --server build/torchscript_examples/speedtorch_server
    python torchscript_examples/body_memory.py --server ... --shapes numbers --clients 4      # 4 bodies at once
    python torchscript_examples/body_memory.py --server ... --shapes objects --repeat 4 --threads 2

Shapes (each a /lookup body of exactly --max-body-bytes): numbers `{"ids":[1,1,...]}`, floats `[1.5,...]`, lists
`[[],[],...]`, strings `["","",...]`, objects `[{},{},...]`, whitespace (`[1]` and blanks: the body alone, nothing
parsed). The server refuses bodies of more than 1,048,576 values with 400 before parsing them (request_json.h);
smaller ones it parses, then refuses with 413 when they hold more ids than --max-batch.
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import load_test  # noqa: E402
import recommender_model  # noqa: E402

UNITS = {"numbers": b"1,", "floats": b"1.5,", "lists": b"[],", "strings": b'"",', "objects": b"{},"}


def body(shape: str, size: int) -> bytes:
    if shape == "whitespace":
        return b'{"ids":[1]' + b" " * (size - 11) + b"}"
    head, tail, unit = b'{"ids":[', b"]}", UNITS[shape]
    count = (size - len(head) - len(tail) - len(unit) + 1) // len(unit)
    return head + unit * count + unit[:-1] + tail


def memory(pid: int) -> dict:
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) * 1024
    return out


def post(url: str, data: bytes, answers: list) -> None:
    host, port = url[len("http://"):].rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=600)
    conn.request("POST", "/lookup", body=data, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    response.read()
    answers.append(response.status)
    conn.close()


def measure(server: str, model: str, shape: str, size: int, clients: int, threads: int, repeat: int) -> dict:
    data = body(shape, size)
    mib = 1 << 20
    with load_test.Server(server, model, threads=threads, extra=["--max-body-bytes", str(size)]) as srv:
        time.sleep(0.5)
        base = memory(srv.proc.pid)["VmRSS"]
        answers, after = [], []
        for _ in range(repeat):
            senders = [threading.Thread(target=post, args=(srv.url, data, answers)) for _ in range(clients)]
            start = time.perf_counter()
            for t in senders:
                t.start()
            for t in senders:
                t.join()
            seconds = time.perf_counter() - start
            time.sleep(0.3)
            after.append(memory(srv.proc.pid))
    peak = after[-1]["VmHWM"] - base
    return {"shape": shape, "body bytes": len(data), "clients at once": clients, "threads": threads,
            "answers": sorted(set(answers)), "rest RSS MiB": round(base / mib),
            "peak above rest MiB": round(peak / mib),
            "peak per body / body bytes": round(peak / clients / len(data), 1),
            "RSS above rest after each round MiB": [round((m["VmRSS"] - base) / mib) for m in after],
            "seconds (last round)": round(seconds, 2)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", required=True, help="the speedtorch_server binary")
    parser.add_argument("--shapes", default="whitespace,numbers,floats,lists,strings,objects")
    parser.add_argument("--max-body-bytes", type=int, default=64 << 20, help="the server's limit and the body size")
    parser.add_argument("--clients", type=int, default=1, help="bodies sent at once")
    parser.add_argument("--threads", type=int, default=8, help="the server's --threads")
    parser.add_argument("--repeat", type=int, default=1, help="rounds, one after the other, in the same server")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        model = str(Path(folder) / "model.pt")
        torch.jit.save(torch.jit.script(recommender_model.Recommender(500, 50, 8)), model)
        for shape in args.shapes.split(","):
            print(json.dumps(measure(args.server, model, shape, args.max_body_bytes, args.clients, args.threads,
                                     args.repeat)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
