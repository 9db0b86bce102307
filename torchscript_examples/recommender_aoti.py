"""The recommender of recommender_model.py compiled ahead of time for the C++ server, without TorchScript:
torch.export of one program, AOTInductor (torch._inductor.aoti_compile_and_package) into a .pt2 package that the
server loads with torch::inductor::AOTIModelPackageLoader (torchscript_examples/model_runner.cpp).

The user table is not in the package: it is the program's first input, and the server opens it from its files
(PinnedEmbedding.open, memory-mapped) and passes it in. The package holds the small dense parameters (items, bias)
and the code, which calls torch.ops.speedtorch.gather on the table (the operator runs from the compiled model, so
the server process must have libspeedtorch_ops.so loaded). The table's shape is fixed in the package (recorded in
its metadata and checked by the server); only the batch size is dynamic.

One program answers every request, to keep one compilation per package (AOTInductor compiles each program to its
own shared library, which takes a minute): for pairs (users[i], items[i]) it returns the users' rows and the pairs'
scores. /lookup uses the rows, /score the scores, and /topk scores one user against every item and takes the top k
in the server (torch::topk).

    python torchscript_examples/recommender_aoti.py --model model.pt --table users.npy --out model.pt2 [--device cuda]

reads a scripted model (recommender_model.py), saves its user table to users.npy (+ .meta.json,
docs/persistence.md) and writes the package to model.pt2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
import speedtorch  # noqa: E402,F401  (registers the operators and the PinnedEmbedding class)

#: The most (user, item) pairs one call of the compiled program takes (the export's bound on the batch dimension).
MAX_PAIRS = 1 << 20


class PairScorer(torch.nn.Module):
    """rows, scores for pairs (users[i], items[i]): rows = table[users], scores = <rows, item rows> + bias, the
    scoring of Recommender.score, with the table passed in."""

    def __init__(self, items: torch.Tensor, bias: torch.Tensor):
        super().__init__()
        self.register_buffer("items", items.detach().clone())
        self.register_buffer("bias", bias.detach().clone())

    def forward(self, table: torch.Tensor, users: torch.Tensor, items: torch.Tensor):
        rows = torch.ops.speedtorch.gather(table, users)
        return rows, (rows * self.items[items]).sum(-1) + self.bias


def export_package(model, out: str | Path, device: str = "cpu") -> str:
    """Compiles `model` (a Recommender of recommender_model.py, scripted or not) for `device` into the package
    `out` (.pt2). Its user table is the example input (only its shape and dtype go into the package)."""
    device = torch.device(device)
    table = model.users.table()
    scorer = PairScorer(model.items, model.bias).to(device)
    pairs = torch.export.Dim("pairs", min=1, max=MAX_PAIRS)
    # Example ids of two or more pairs: a size of 1 would be specialised.
    example = (table, torch.tensor([0, 1, 2], device=device), torch.tensor([0, 1, 0], device=device))
    exported = torch.export.export(scorer, example, dynamic_shapes=(None, {0: pairs}, {0: pairs}))
    metadata = {"speedtorch.num_users": str(table.shape[0]), "speedtorch.dim": str(table.shape[1]),
                "speedtorch.num_items": str(model.items.shape[0]), "speedtorch.table_dtype": str(table.dtype)}
    return torch._inductor.aoti_compile_and_package(exported, package_path=str(out),
                                                    inductor_configs={"aot_inductor.metadata": metadata})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True, help="a scripted model of recommender_model.py")
    parser.add_argument("--table", type=Path, required=True, help="where to save its user table (.npy)")
    parser.add_argument("--out", type=Path, required=True, help="the package (.pt2)")
    parser.add_argument("--device", default="cpu", help="what the package is compiled for (cpu, cuda)")
    args = parser.parse_args()
    model = torch.jit.load(str(args.model))
    model.users.save(str(args.table))
    export_package(model, args.out, args.device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
