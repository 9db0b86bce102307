"""MEASUREMENT PROTOTYPE (issue 34 item 2): our epoll HTTP layer against the Boost.Beast front end, in turns.

Each round starts each server (the order alternates between rounds: ours first in odd rounds, Beast first in even
ones), and measures it with the C++ load client as load_test.py does (load_test.run_load_client: niced, every answer
checked): first the client's ceiling against GET /v2/health/ready (answered on the event loop: the HTTP layer alone),
then the hot route, binary v2 lookups of 16 ids with an /update every 50 requests (the 23.5k req/s row of
bench/RESULTS.md, "2026-11-25, issue 27 item 4"). Also the server's CPU time per request (user + system, all threads, from /proc): on
a shared machine it moves less than req/s. Prints each run, then the median and range per server.

    PYTHONPATH=python SPEEDTORCH_LIBRARY=build-cpu/libspeedtorch_ops.so python bench/experiments/http_beast/compare.py \
        --ours build-cpu/torchscript_examples/speedtorch_server \
        --beast build-cpu/torchscript_examples/http_beast/speedtorch_server_beast \
        --load-client build-cpu/torchscript_examples/speedtorch_load_client --model /tmp/http34/serve_lt.pt --rounds 6
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "torchscript_examples"))
import load_test  # noqa: E402


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (all its threads): the server's cost, less sensitive than req/s to
    what else runs on a shared machine."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ours", required=True)
    parser.add_argument("--beast", required=True)
    parser.add_argument("--load-client", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--update-every", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    args = parser.parse_args()
    model = torch.jit.load(args.model)
    users, dim = model.num_users(), model.items.shape[1]
    expected = Path(tempfile.mkdtemp()) / "table.f32"
    model.users.table().float().contiguous().numpy().tofile(expected)
    servers = {"ours": args.ours, "beast": args.beast}
    runs: dict[tuple[str, str], list[dict]] = {}
    wrong = 0
    for round_ in range(1, args.rounds + 1):
        order = ["ours", "beast"] if round_ % 2 else ["beast", "ours"]
        for name in order:
            with load_test.Server(servers[name], args.model, args.threads) as server:
                for what, path, update_every in (("ceiling", "/v2/health/ready", 0),
                                                 ("lookup+update", None, args.update_every)):
                    cpu = cpu_seconds(server.proc.pid)
                    r = load_test.run_load_client(args.load_client, server, expected, users, dim, args.clients, 0,
                                                  args.seconds, "binary", update_every, args.warmup, path=path)
                    r["cpu us"] = 1e6 * (cpu_seconds(server.proc.pid) - cpu) / (r["requests"] + args.clients * args.warmup)
                    r["load"] = os.getloadavg()[0]
                    runs.setdefault((name, what), []).append(r)
                    wrong += len(r["failures"])
                    print(f"round {round_} {name:<5} {what:<13} {r['req/s']:>9.0f} req/s  p50 {r['p50 ms']:.3f} ms  "
                          f"p99 {r['p99 ms']:.3f} ms  server CPU {r['cpu us']:.1f} us/req  wrong+errors {len(r['failures'])}  load {r['load']:.2f}"
                          + (f"  ({r['failures'][0]})" if r["failures"] else ""), flush=True)
    print(f"\n{args.clients} clients, {args.seconds} s a run, {args.rounds} rounds, server --threads {args.threads}")
    print(f"{'server':<6} {'route':<14} {'req/s median':>12} {'(min-max)':>17} {'p99 ms median':>13} {'(min-max)':>13}")
    for (name, what), rs in sorted(runs.items(), key=lambda kv: (kv[0][1], kv[0][0] != "ours")):
        rate = [r["req/s"] for r in rs]
        p99 = [r["p99 ms"] for r in rs]
        print(f"{name:<6} {what:<14} {statistics.median(rate):>12.0f} {f'({min(rate):.0f}-{max(rate):.0f})':>17} "
              f"{statistics.median(p99):>13.3f} {f'({min(p99):.2f}-{max(p99):.2f})':>13}")
    for what in ("ceiling", "lookup+update"):  # each round's Beast figure over ours from the same round
        rate = [b["req/s"] / o["req/s"] for o, b in zip(runs[("ours", what)], runs[("beast", what)])]
        p99 = [b["p99 ms"] / o["p99 ms"] for o, b in zip(runs[("ours", what)], runs[("beast", what)])]
        cpu = {name: statistics.median(r["cpu us"] for r in runs[(name, what)]) for name in ("ours", "beast")}
        print(f"server CPU per request, {what}: ours median {cpu['ours']:.1f} us, beast median {cpu['beast']:.1f} us")
        print(f"beast / ours, {what}, paired by round: req/s median {statistics.median(rate):.3f} "
              f"({min(rate):.2f}-{max(rate):.2f}), p99 median {statistics.median(p99):.3f} "
              f"({min(p99):.2f}-{max(p99):.2f})")
    print(f"{wrong} wrong answers or errors")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
