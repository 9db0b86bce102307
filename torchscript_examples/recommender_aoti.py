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
docs/persistence.md) and writes the package to model.pt2. A serving copy of quantized_recommender.py compiles the
same way without --table (its table is already in its file); the package reads that table with the copy's gather
(speedtorch::gather_dequant, or speedtorch::gather for fp16) and records its format and content hash, and the
server takes the file with --table.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
import speedtorch  # noqa: E402,F401  (registers the operators and the PinnedEmbedding class)
from quantized_recommender import serving_rows  # noqa: E402  (torchscript_examples/, beside this file)

#: The most (user, item) pairs one call of the compiled program takes (the export's bound on the batch dimension).
MAX_PAIRS = 1 << 20


class PairScorer(torch.nn.Module):
    """rows, scores for pairs (users[i], items[i]): rows = table[users], scores = <rows, item rows> + bias, the
    scoring of Recommender.score, with the table passed in: a float table, or a serving copy in `table_format`
    (quantized_recommender.py: rows dequantized to float32 as the scripted copy does)."""

    def __init__(self, items: torch.Tensor, bias: torch.Tensor, table_format: str | None = None, dim: int = 0):
        super().__init__()
        self.register_buffer("items", items.detach().clone())
        self.register_buffer("bias", bias.detach().clone())
        self.table_format, self.dim = table_format, dim

    def forward(self, table: torch.Tensor, users: torch.Tensor, items: torch.Tensor):
        if self.table_format is None:
            rows = torch.ops.speedtorch.gather(table, users)
        else:
            rows = serving_rows(table, users, self.table_format, self.dim)
        return rows, (rows * self.items[items]).sum(-1) + self.bias


def export_package(model, out: str | Path, device: str = "cpu") -> str:
    """Compiles `model` (a Recommender of recommender_model.py, or a serving copy of quantized_recommender.py;
    scripted or not) for `device` into the package `out` (.pt2). Its user table is the example input (only its
    shape and dtype go into the package; for a serving copy also its format and content hash, which the server
    checks the file it is given against)."""
    device = torch.device(device)
    metadata = {"speedtorch.num_items": str(model.items.shape[0])}
    if hasattr(model, "table_format"):  # a serving copy
        table = model.table
        scorer = PairScorer(model.items, model.bias, model.table_format, model.dim)
        metadata.update({"speedtorch.dim": str(model.dim), "speedtorch.table_format": model.table_format,
                         "speedtorch.table_columns": str(table.shape[1]), "speedtorch.table_hash": model.table_hash})
    else:
        table = model.users.table()
        scorer = PairScorer(model.items, model.bias)
        metadata["speedtorch.dim"] = str(table.shape[1])
    metadata.update({"speedtorch.num_users": str(table.shape[0]), "speedtorch.table_dtype": str(table.dtype)})
    scorer = scorer.to(device)
    pairs = torch.export.Dim("pairs", min=1, max=MAX_PAIRS)
    # Example ids of two or more pairs: a size of 1 would be specialised.
    example = (table, torch.tensor([0, 1, 2], device=device), torch.tensor([0, 1, 0], device=device))
    exported = torch.export.export(scorer, example, dynamic_shapes=(None, {0: pairs}, {0: pairs}))
    return torch._inductor.aoti_compile_and_package(exported, package_path=str(out),
                                                    inductor_configs={"aot_inductor.metadata": metadata})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True, help="a scripted model of recommender_model.py or "
                        "quantized_recommender.py")
    parser.add_argument("--table", type=Path, help="where to save its user table (.npy); not for a serving copy, "
                        "whose table is already in its file")
    parser.add_argument("--out", type=Path, required=True, help="the package (.pt2)")
    parser.add_argument("--device", default="cpu", help="what the package is compiled for (cpu, cuda)")
    args = parser.parse_args()
    model = torch.jit.load(str(args.model))
    if hasattr(model, "table_format"):
        if args.table:
            parser.error(f"{args.model} is a {model.table_format} serving copy, whose table is its file "
                         f"{model.table_path}: leave --table out (the server takes that file with --table)")
    elif not args.table:
        parser.error("--table is needed: where to save the model's user table")
    else:
        model.users.save(str(args.table))
    export_package(model, args.out, args.device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
