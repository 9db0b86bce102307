"""Are two builds of the library bit-identical on the CPU path? Dumps what the CPU path computes with the library that
SPEEDTORCH_LIBRARY names, then compares two dumps tensor by tensor (torch.equal: every bit, NaNs and signed zeros
included).

What is dumped: every optimizer and option set of tests/python/test_row_optimizer.py (and per_row_step) on float32,
float16 and bfloat16 tables of odd and even widths, five steps each with ids holding duplicates (the op sums them)
and with torch.unique's ids (sorted_unique=True), at 1 and 2 threads, batches below and above the sizes at which a
second thread helps; gather and scatter_ with duplicates; gather's CPU backward; and 30 training steps of the demo's
speedtorch ways (python -m speedtorch demo: losses, tables, optimizer state).

    SPEEDTORCH_LIBRARY=old/libspeedtorch_ops.so python bench/experiments/cpu_bit_identity.py dump /tmp/old.pt
    SPEEDTORCH_LIBRARY=new/libspeedtorch_ops.so python bench/experiments/cpu_bit_identity.py dump /tmp/new.pt
    python bench/experiments/cpu_bit_identity.py compare /tmp/old.pt /tmp/new.pt
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))

OPTIMIZERS = [
    ("sgd", {"lr": 0.1}),
    ("sgd", {"lr": 0.1, "momentum": 0.9, "dampening": 0.1, "weight_decay": 0.01}),
    ("sgd", {"lr": 0.1, "momentum": 0.9, "nesterov": 1}),
    ("adagrad", {"lr": 0.1, "lr_decay": 0.01, "initial_accumulator_value": 0.1, "weight_decay": 0.01}),
    ("adam", {"lr": 0.01}),
    ("adam", {"lr": 0.01, "beta1": 0.8, "beta2": 0.99, "weight_decay": 0.1, "amsgrad": 1}),
    ("adam", {"lr": 0.01, "per_row_step": 1}),
    ("adamw", {"lr": 0.01, "weight_decay": 0.1}),
    ("adamw", {"lr": 0.01, "amsgrad": 1}),
    ("adamax", {"lr": 0.01, "weight_decay": 0.01}),
    ("rmsprop", {"lr": 0.01}),
    ("rmsprop", {"lr": 0.01, "momentum": 0.5, "centered": 1, "weight_decay": 0.01}),
    ("adadelta", {"lr": 1.0, "weight_decay": 0.01}),
    ("asgd", {"lr": 0.01, "t0": 2}),
    ("rprop", {"lr": 0.01}),
    ("rowwise_adagrad", {"lr": 0.1}),
    ("rowwise_adagrad", {"lr": 0.1, "eps": 1e-6, "weight_decay": 0.01, "initial_accumulator_value": 0.1}),
    ("rowwise_adam", {"lr": 0.01}),
    ("rowwise_adam", {"lr": 0.01, "beta1": 0.8, "beta2": 0.99, "eps": 1e-6, "weight_decay": 0.1}),
]


def optimizer_results(out: dict) -> None:
    import speedtorch

    for threads in (1, 2):
        torch.set_num_threads(threads)
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            for dim, count in ((37, 300), (32, 9000)):  # 9,000 x 32: over the one-thread batch size
                for c, (kind, options) in enumerate(OPTIMIZERS):
                    gen = torch.Generator().manual_seed(c)
                    n = 3000
                    width = speedtorch.PinnedEmbedding.state_width(kind, options, dim)
                    for mode in ("duplicates", "sorted_unique"):
                        w = torch.randn(n, dim, generator=gen).to(dtype)
                        s = torch.randn(n, width, generator=gen).abs()
                        s[:, 0].zero_()  # the per-row step count
                        for step in range(1, 6):
                            ids = torch.randint(0, n, (count,), generator=gen)
                            grad = torch.randn(count, dim, generator=gen)
                            if step == 3:
                                grad[::7] = -0.0  # signed zeros must survive as they did
                            if mode == "sorted_unique":
                                ids = torch.unique(ids)
                                grad = grad[: ids.numel()]
                            torch.ops.speedtorch.row_optimizer_step_(w, s, ids, grad, kind, options, step,
                                                                     mode == "sorted_unique")
                        key = f"{kind}{c} {dtype} dim {dim} x {count} {mode} threads {threads}"
                        out[key + " weights"] = w
                        out[key + " state"] = s


def copy_results(out: dict) -> None:
    import speedtorch

    gen = torch.Generator().manual_seed(7)
    for threads in (1, 2):
        torch.set_num_threads(threads)
        for rows, dim, count in ((1000, 33, 500), (20_000, 64, 40_000)):
            table = torch.randn(rows, dim, generator=gen)
            ids = torch.randint(0, rows, (count,), generator=gen)
            out[f"gather {rows} {count} threads {threads}"] = speedtorch.gather(table, ids)
            speedtorch.scatter_(table, ids, torch.randn(count, dim, generator=gen))
            out[f"scatter_ {rows} {count} threads {threads}"] = table
            leaf = table.clone().requires_grad_()
            (speedtorch.gather(leaf, ids) * torch.randn(count, dim, generator=gen)).sum().backward()
            out[f"gather backward {rows} {count} threads {threads}"] = leaf.grad


def training_results(out: dict) -> None:
    from speedtorch.models.recommender import make_way, zipf_batches

    torch.set_num_threads(2)
    batches = zipf_batches(200_000, 4_096, 8, num_items=10_000)
    for name in ("speedtorch", "speedtorch_both_tables"):
        torch.manual_seed(0)
        way = make_way(name, 200_000, 32, 10_000, torch.device("cpu"), 1e-2)
        out[f"{name} losses"] = torch.stack([way.step(*batches[i % 8]).detach() for i in range(30)])
        for label, module in (("users", way.users), ("items", way.items)):
            if hasattr(module, "table"):
                out[f"{name} {label} table"] = module.table.table().clone()
                out[f"{name} {label} state"] = module.table.state().clone()


def main() -> int:
    if sys.argv[1] == "dump":
        import speedtorch  # noqa: F401  (loads the library SPEEDTORCH_LIBRARY names)

        out: dict = {}
        optimizer_results(out)
        copy_results(out)
        training_results(out)
        torch.save(out, sys.argv[2])
        print(f"{len(out)} tensors written to {sys.argv[2]}")
        return 0
    a, b = torch.load(sys.argv[2]), torch.load(sys.argv[3])
    if a.keys() != b.keys():
        print(f"different keys: {sorted(a.keys() ^ b.keys())[:5]}")
        return 1
    different = [k for k in a if not torch.equal(a[k].view(torch.uint8) if a[k].is_floating_point() else a[k],
                                                 b[k].view(torch.uint8) if b[k].is_floating_point() else b[k])]
    # A NaN's sign and payload come from whichever NaN operand an instruction sees first, which vectorised code may
    # order differently; IEEE 754 leaves that open. Those are told apart from any other difference.
    nan_only = [k for k in different if a[k].is_floating_point() and torch.equal(torch.isnan(a[k]), torch.isnan(b[k]))
                and torch.equal(a[k].nan_to_num(0.0).view(torch.uint8), b[k].nan_to_num(0.0).view(torch.uint8))]
    for k in different[:20]:
        print(f"differs{' (only the sign or payload of NaNs)' if k in nan_only else ''}: {k}")
    print(f"{len(a) - len(different)} of {len(a)} tensors bit-identical; {len(nan_only)} more differ only in the "
          f"sign or payload of NaNs (the same elements are NaN), {len(different) - len(nan_only)} otherwise")
    return 1 if len(different) > len(nan_only) else 0


if __name__ == "__main__":
    sys.exit(main())
