"""The recommender of recommender_model.py served from a smaller copy of its trained user table: float16, bfloat16,
row-wise int8 (FBGEMM's inference row: a float16 scale and bias, then uint8 codes) or fp8 e4m3 with ue8m0 block
scales. The copy is written once from the trained float32 table by the library's conversion
(speedtorch.serving.quantized.quantize_rows; float16 is a plain cast) into a file beside the model, and read with the
library's gathers: speedtorch::gather_dequant for bf16 / int8 / fp8 (dequantized to bfloat16 inside the gather),
speedtorch::gather for float16. Rows and scores come out as float32, as the float32 model's do, so the C++ server
(server_main.cpp) serves this model, or its AOTInductor package (recommender_aoti.py), exactly as the float32 one.

    python torchscript_examples/quantized_recommender.py --model model.pt --format int8_rowwise \
        --table users_int8.npy --out model_int8.pt
    python torchscript_examples/recommender_aoti.py --model model_int8.pt --out model_int8.pt2 [--device cuda]
    speedtorch_server model_int8.pt             # or: speedtorch_server model_int8.pt2 --table users_int8.npy

The model file holds the dense parameters and the table file's path and content hash, not the rows: torch.jit.load
maps the file read-only (page-locked on a GPU host, so GPUs read the rows over UVA; on /dev/shm every process of a
host shares one copy) and refuses a file whose content is not the one converted. A relative path is resolved as a
PinnedEmbedding sidecar's (under $SPEEDTORCH_SIDECAR_DIR when set, else the current directory).

The copy is read-only: update_rows raises, and the server answers /update with 409. Updates go to the float32
table (the trained model), which is converted again; docs/torchscript.md says why.
"""

# No `from __future__ import annotations`: TorchScript reads the class's attribute annotations as types, not text.
import argparse
import sys
from pathlib import Path
from typing import Tuple, Union

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
import speedtorch  # noqa: E402
from speedtorch.serving.quantized import QuantizedRows  # noqa: E402

#: The serving formats: "fp16" (a float16 table read by speedtorch::gather) and speedtorch.serving.quantized's formats.
SERVING_FORMATS = ("fp16",) + speedtorch.serving.quantized.FORMATS
#: Rows of the quantized formats start on 4-byte boundaries by default: an int8 row of dim 32 then takes 36 bytes
#: (0.28 of float32), where FBGEMM's 16-byte alignment takes 48 (0.375). The GPU kernel reads rows with the widest
#: loads their stride allows; --row-alignment 16 gives it 16-byte loads at that cost in RAM.
DEFAULT_ROW_ALIGNMENT = 4
#: The top-k whose order an int8 copy keeps (the /topk answers the example's clients ask for: k = 10).
DEFAULT_RANK_K = 10


def serving_rows(table: torch.Tensor, ids: torch.Tensor, table_format: str, dim: int) -> torch.Tensor:
    """Rows `ids` of a serving table in `table_format` as float32 (ids.shape + (dim,)), on the ids' device: the one
    place that reads a serving table (the scripted model below and the AOTInductor package's program)."""
    if table_format == "fp16":
        return torch.ops.speedtorch.gather(table, ids, None).float()
    return torch.ops.speedtorch.gather_dequant(table, ids, table_format, dim, None).float()


def open_table(path: str, expected_hash: str) -> torch.Tensor:
    """The serving table file at `path` (resolved as a sidecar), memory-mapped read-only and page-locked when a GPU
    is present; refused unless its content hash is `expected_hash` (the file converted for this model)."""
    resolved = torch.ops.speedtorch.resolve_sidecar_path(path)
    table = torch.ops.speedtorch.map_npy(resolved, "r", True)
    found = torch.ops.speedtorch.content_hash(table)
    if found != expected_hash:
        raise RuntimeError("QuantizedRecommender: the table file " + resolved + " holds other rows than the model was "
                           "converted with (content hash " + found + ", expected " + expected_hash + "): convert "
                           "the model again (torchscript_examples/quantized_recommender.py)")
    return table


class QuantizedRecommender(torch.nn.Module):
    """score(user, item) = <user row, item row> + bias, as recommender_model.Recommender, over a read-only serving
    copy of the user table (`table`, in `table_format`, `dim` values a row). The methods the server calls are the
    float32 model's: num_users, lookup, score, top_k, update_rows (which refuses)."""

    table_format: str
    table_path: str
    table_hash: str
    dim: int

    def __init__(self, items: torch.Tensor, bias: torch.Tensor, table: torch.Tensor, table_format: str, dim: int,
                 table_path: str, table_hash: str):
        super().__init__()
        if table_format not in SERVING_FORMATS:
            raise ValueError(f"unknown serving format {table_format!r}; known: {', '.join(SERVING_FORMATS)}")
        self.register_buffer("items", items.detach().clone())
        self.register_buffer("bias", bias.detach().clone())
        self.table = table  # a plain attribute, not a buffer: not saved in the model, not moved by .to(device)
        self.table_format = table_format
        self.dim = dim
        self.table_path = table_path
        self.table_hash = table_hash

    def forward(self, user_ids: torch.Tensor, item_ids: torch.Tensor) -> torch.Tensor:
        return self.score(user_ids, item_ids)

    @torch.jit.export
    def num_users(self) -> int:
        return self.table.size(0)

    @torch.jit.export
    def lookup(self, user_ids: torch.Tensor) -> torch.Tensor:
        return serving_rows(self.table, user_ids, self.table_format, self.dim)

    @torch.jit.export
    def score(self, user_ids: torch.Tensor, item_ids: torch.Tensor) -> torch.Tensor:
        return (self.lookup(user_ids) * self.items[item_ids]).sum(-1) + self.bias

    @torch.jit.export
    def top_k(self, user_id: int, k: int) -> Tuple[torch.Tensor, torch.Tensor]:
        row = self.lookup(torch.tensor([user_id], device=self.items.device))[0]
        scores = self.items @ row + self.bias
        top = torch.topk(scores, min(k, scores.numel()))
        return top.indices, top.values

    @torch.jit.export
    def update_rows(self, user_ids: torch.Tensor, rows: torch.Tensor) -> None:
        raise RuntimeError("QuantizedRecommender: the " + self.table_format + " user table is a read-only serving "
                           "copy: update the float32 model's table and convert it again")

    # Saved: the dense parameters and the table's path and hash; the rows stay in their file, mapped again at load.
    @torch.jit.export
    def __getstate__(self) -> Tuple[torch.Tensor, torch.Tensor, str, int, str, str, bool]:
        return (self.items, self.bias, self.table_format, self.dim, self.table_path, self.table_hash, self.training)

    @torch.jit.export
    def __setstate__(self, state: Tuple[torch.Tensor, torch.Tensor, str, int, str, str, bool]) -> None:
        self.items = state[0]
        self.bias = state[1]
        self.table_format = state[2]
        self.dim = state[3]
        self.table_path = state[4]
        self.table_hash = state[5]
        self.training = state[6]
        self.table = open_table(self.table_path, self.table_hash)


def convert(model, table_format: str, table_path: Union[str, Path], *,
            row_alignment: int = DEFAULT_ROW_ALIGNMENT, rank_k: int = DEFAULT_RANK_K) -> QuantizedRecommender:
    """The serving copy of a trained `model` (a recommender_model.Recommender, scripted or not): its user table
    written in `table_format` to `table_path` (a .npy file NumPy reads; bf16 / int8 / fp8 also get
    speedtorch.serving.quantized's `.format.json`, so QuantizedRows.open reads them), mapped back read-only, with the
    model's items and bias. The path is recorded as given (relative paths: see the module's docstring).
    int8: with `rank_k` > 0 each user's codes keep that user's `rank_k` best items in the float32 order
    (speedtorch.serving.rank_preserving_rounding); 0 rounds every value to nearest."""
    if table_format not in SERVING_FORMATS:
        raise ValueError(f"unknown serving format {table_format!r}; known: {', '.join(SERVING_FORMATS)}")
    trained = model.users.table()
    dim = trained.shape[1]
    path = str(table_path)
    resolved = torch.ops.speedtorch.resolve_sidecar_path(path)
    if table_format == "fp16":
        table_hash = speedtorch.data.save_npy(trained.to(torch.float16), resolved)
    else:
        ranking = {}
        if table_format == "int8_rowwise" and rank_k:
            ranking = {"rank_items": model.items.detach(), "rank_k": rank_k}
        rows = QuantizedRows.from_table(trained, table_format, row_alignment=row_alignment, pinned=False, **ranking)
        table_hash = rows.save(resolved)
    return QuantizedRecommender(model.items, model.bias, open_table(path, table_hash), table_format, dim, path,
                                table_hash)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True, help="a trained scripted model of recommender_model.py")
    parser.add_argument("--format", required=True, choices=SERVING_FORMATS, help="the serving table's row format")
    parser.add_argument("--table", required=True, help="where to write the serving table (.npy)")
    parser.add_argument("--out", type=Path, required=True, help="the scripted serving model (.pt)")
    parser.add_argument("--row-alignment", type=int, default=DEFAULT_ROW_ALIGNMENT,
                        help="bytes each quantized row is padded to a multiple of (16: FBGEMM's)")
    parser.add_argument("--rank-k", type=int, default=DEFAULT_RANK_K,
                        help="int8: keep each user's k best items in the float32 order (0: nearest rounding)")
    args = parser.parse_args()
    model = torch.jit.load(str(args.model))
    served = torch.jit.script(convert(model, args.format, args.table, row_alignment=args.row_alignment,
                                      rank_k=args.rank_k))
    speedtorch.jit_save(served, args.out)
    fp32_bytes = model.users.table().nbytes
    print(f"{args.format} table {args.table}: {served.table.nbytes} bytes, {served.table.nbytes / fp32_bytes:.3f} "
          f"of the float32 table's {fp32_bytes}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
