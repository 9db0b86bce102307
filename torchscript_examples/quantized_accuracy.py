"""What a serving copy of the example recommender costs in answers and saves in host RAM, side by side per format.

Trains the recommender of recommender_model.py (its scripted train_step: the user table's fused Adam), converts its
user table to each serving format (quantized_recommender.py) and prints, against the float32 model:
- the table's bytes and their share of the float32 table's (the target for int8: <= 1 / 3.5);
- the rows' error (relative RMS over every row, and the largest absolute error of one value);
- scores: the largest absolute error over random (user, item) pairs;
- top-k: the share of /topk requests (random users) whose answer is the float32 model's: the same best item (top-1),
  the same k items in the same order, and the same k items in any order (the target for int8: >= 99%); the mean
  recall@k (the share of the float32 model's k best items the answer holds); and the largest score loss: how much
  lower, under the float32 model, the answer's i-th item scores than the float32 model's i-th best item (what the
  items a copy swaps cost: near-ties cost about the score error);
- with --server, the same requests are sent to speedtorch_server serving each model (answers compared between the
  servers), and the server's resident memory after every row has been read once (VmRSS: host RAM it holds); the
  float32 model is served without the Adam state its table keeps for training (which no server reads).

    python torchscript_examples/quantized_accuracy.py [--server build/torchscript_examples/speedtorch_server] \
        [--users 10000 --items 1000 --dim 32 --train-steps 400 --batch 4096 --requests 2000 --k 10]

The defaults are the example model's sizes (recommender_model.py), trained until its loss has fallen from 0.69 to
about 0.43. Its table is too small for the servers' resident memory to show it: for the RAM column, run with
`--users 1000000 --train-steps 20` (128 MB of float32 rows; the errors then are those of an untrained table).
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import load_test  # noqa: E402
import quantized_recommender  # noqa: E402
import recommender_model  # noqa: E402

import speedtorch  # noqa: E402  (the path is set by the imports above)


def train(model, users: int, items: int, steps: int, batch: int, lr: float = 0.5) -> float:
    """`steps` of the scripted train_step on the example's batches (make_batches: users and items that match when
    their ids share parity); returns the last loss."""
    batches = recommender_model.make_batches(users, items, steps, batch, seed=7)
    loss = float("nan")
    for i in range(steps):
        loss = float(model.train_step(batches.users[i], batches.items[i], batches.labels[i], lr))
    return loss


def serving_float32_model(model, users: int, items: int, dim: int):
    """The trained float32 model as it is served for the RAM comparison: the same rows, items and bias, its table
    without the Adam state that training keeps beside each row (twice the rows' bytes, which no server reads)."""
    served = recommender_model.Recommender(1, items, dim)
    served.users = speedtorch.PinnedEmbedding(users, dim)
    served.users.copy_(model.users.table())
    with torch.no_grad():
        served.items.copy_(model.items)
        served.bias.copy_(model.bias)
    return torch.jit.script(served)


def row_errors(reference, copy, users: int, chunk: int = 1 << 16) -> tuple[float, float]:
    """(relative RMS error over every row, largest absolute error of one value) of the copy's rows."""
    squared_error, squared, largest = 0.0, 0.0, 0.0
    for begin in range(0, users, chunk):
        ids = torch.arange(begin, min(users, begin + chunk))
        exact, got = reference.lookup(ids).detach().double(), copy.lookup(ids).double()
        squared_error += float(((got - exact) ** 2).sum())
        squared += float((exact ** 2).sum())
        largest = max(largest, float((got - exact).abs().max()))
    return (squared_error / squared) ** 0.5, largest


def requests(users: int, items: int, count: int, k: int, seed: int = 0):
    rng = random.Random(seed)
    top = [rng.randrange(users) for _ in range(count)]
    pairs = (torch.tensor([rng.randrange(users) for _ in range(count)]),
             torch.tensor([rng.randrange(items) for _ in range(count)]))
    return top, pairs


def answers_in_process(model, top_users: list[int], pairs, k: int):
    """(top-k item lists, scores of the pairs) from the model run in this process."""
    return [model.top_k(u, k)[0].tolist() for u in top_users], model.score(*pairs).detach()


def answers_from_server(server: load_test.Server, top_users: list[int], pairs, k: int):
    """The same from a running server (/topk, /score in batches of 256)."""
    tops = []
    for u in top_users:
        status, body = server.post("/topk", {"user": u, "k": k})
        assert status == 200, body
        tops.append(body["items"])
    scores = []
    for begin in range(0, len(pairs[0]), 256):
        status, body = server.post("/score", {"users": pairs[0][begin:begin + 256].tolist(),
                                              "items": pairs[1][begin:begin + 256].tolist()})
        assert status == 200, body
        scores += body["scores"]
    return tops, torch.tensor(scores)


def top_k_agreement(model, top_users: list[int], tops: list[list[int]], fp32_tops: list[list[int]]):
    """(mean recall@k, largest score loss) of a copy's top-k answers against the float32 model's, scored by the
    float32 model: recall@k is the share of the float32 k best items an answer holds; the score loss of an answer
    is max over ranks i of (float32 score of its i-th best item - float32 score of the answer's i-th item)."""
    recall, loss = 0.0, 0.0
    for user, got, best in zip(top_users, tops, fp32_tops):
        recall += len(set(got) & set(best)) / len(best)
        scores = model.score(torch.full((len(got) + len(best),), user), torch.tensor(got + best)).detach()
        loss = max(loss, float((scores[len(got):] - scores[:len(got)]).max()))
    return recall / len(tops), loss


def resident_bytes_after_reading_every_row(server: load_test.Server, users: int, chunk: int = 4096) -> int:
    """The server's VmRSS after /lookup has read every row once (a mapped table is resident once touched)."""
    host, port = server.url[len("http://"):].rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    for begin in range(0, users, chunk):
        conn.request("POST", "/lookup", body=json.dumps({"ids": list(range(begin, min(users, begin + chunk)))}))
        answer = conn.getresponse()
        body = answer.read()  # not parsed: only the reading matters here
        assert answer.status == 200, body[:200]
    conn.close()
    with open(f"/proc/{server.proc.pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/PID/status")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", help="speedtorch_server: also serve each model and measure through it")
    parser.add_argument("--users", type=int, default=10_000)
    parser.add_argument("--items", type=int, default=1_000)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--train-steps", type=int, default=400)
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--requests", type=int, default=2000, help="top-k requests (and scored pairs) compared")
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--formats", default=",".join(quantized_recommender.SERVING_FORMATS))
    parser.add_argument("--row-alignment", type=int, default=quantized_recommender.DEFAULT_ROW_ALIGNMENT)
    parser.add_argument("--rank-k", type=int, default=quantized_recommender.DEFAULT_RANK_K,
                        help="int8: the top-k each user's codes keep in order (0: nearest rounding only)")
    args = parser.parse_args()
    formats = args.formats.split(",")
    folder = Path(tempfile.mkdtemp(prefix="speedtorch_quantized_"))
    model = torch.jit.script(recommender_model.Recommender(args.users, args.items, args.dim))
    loss = train(model, args.users, args.items, args.train_steps, args.batch)
    served = serving_float32_model(model, args.users, args.items, args.dim)
    served.users.set_sidecar(str(folder / "users.npy"))  # the server loads it into (pinned) host memory
    speedtorch.jit_save(served, folder / "model.pt")
    copies = {}
    for fmt in formats:
        # int8 twice when ranking is on: nearest rounding beside the rank-preserving codes the converter writes.
        for rank_k in ((0, args.rank_k) if fmt == "int8_rowwise" and args.rank_k else (args.rank_k,)):
            name = fmt + (" nearest" if fmt == "int8_rowwise" and not rank_k else "")
            file = name.replace(" ", "_")
            copy = quantized_recommender.convert(model, fmt, folder / f"users_{file}.npy",
                                                 row_alignment=args.row_alignment, rank_k=rank_k)
            copies[name] = torch.jit.script(copy)
            speedtorch.jit_save(copies[name], folder / f"model_{file}.pt")
    top_users, pairs = requests(args.users, args.items, args.requests, args.k)

    def measure(name: str, served, path: Path):
        if args.server:
            with load_test.Server(args.server, str(path), threads=2, max_batch=4096) as server:
                tops, scores = answers_from_server(server, top_users, pairs, args.k)
                rss = resident_bytes_after_reading_every_row(server, args.users)
        else:
            (tops, scores), rss = answers_in_process(served, top_users, pairs, args.k), None
        return tops, scores, rss

    fp32_tops, fp32_scores, fp32_rss = measure("float32", model, folder / "model.pt")
    fp32_bytes = model.users.table().nbytes
    where = "through speedtorch_server" if args.server else "in process"
    print(f"{args.users} users x {args.dim}, {args.items} items, trained {args.train_steps} steps of {args.batch} "
          f"(last loss {loss:.4f}); {args.requests} top-{args.k} requests and scored pairs, {where}; rows aligned to "
          f"{args.row_alignment} bytes")
    k = args.k
    print(f"{'format':<22} {'table bytes':>12} {'of fp32':>8} {'server RSS':>11} {'RAM saved':>10} "
          f"{'row rel RMS':>11} {'max |row err|':>13} {'max |score err|':>15} {'top-1 same':>10} "
          f"{f'top-{k} same':>11} {f'top-{k} set':>10} {f'recall@{k}':>10} {'max score loss':>14}")

    def line(name, nbytes, rss, rel, largest, score_err, tops):
        recall, score_loss = top_k_agreement(model, top_users, tops, fp32_tops)

        def share(same):
            return f"{100 * sum(same(a, b) for a, b in zip(tops, fp32_tops)) / len(tops):.2f}%"

        rss_text = f"{rss / 2**20:.1f} MiB" if rss is not None else "-"
        saved = f"{(fp32_rss - rss) / 2**20:.1f} MiB" if rss is not None else "-"
        print(f"{name:<22} {nbytes:>12} {nbytes / fp32_bytes:>8.3f} {rss_text:>11} {saved:>10} {rel:>11.2e} "
              f"{largest:>13.2e} {score_err:>15.2e} {share(lambda a, b: a[:1] == b[:1]):>10} "
              f"{share(lambda a, b: a == b):>11} {share(lambda a, b: set(a) == set(b)):>10} {100 * recall:>9.2f}% "
              f"{score_loss:>14.2e}")

    line("float32", fp32_bytes, fp32_rss, 0.0, 0.0, 0.0, fp32_tops)
    for fmt, copy in copies.items():
        tops, scores, rss = measure(fmt, copy, folder / f"model_{fmt.replace(' ', '_')}.pt")
        rel, largest = row_errors(model, copy, args.users)
        line(fmt, copy.table.nbytes, rss, rel, largest, float((scores - fp32_scores).abs().max()), tops)
    return 0


if __name__ == "__main__":
    sys.exit(main())
