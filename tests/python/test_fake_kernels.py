"""Under FakeTensorMode (torch.compile, torch.export) every operator runs the checks its CPU and CUDA kernels run:
the C++ Meta kernels' (ops/register_meta.cpp), also where a Python fake kernel (speedtorch/_fake.py) must add the
output's device. The Python fakes used to check less: a table with strided rows, src of another dtype, a bad
format or bucket_sizes of the wrong shape went through."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import speedtorch  # noqa: F401  (registers the operators)

pytestmark = pytest.mark.skipif(torch.__version__ < (2, 6), reason="the Python fake kernels need torch >= 2.6")


def test_gather_and_scatter():
    with FakeTensorMode():
        table, ids = torch.empty(10, 8), torch.tensor([[1, 2], [3, 4]])
        with pytest.raises(RuntimeError, match="table rows must be contiguous"):
            torch.ops.speedtorch.gather(torch.empty(10, 16)[:, ::2], ids)
        with pytest.raises(RuntimeError, match="table must be 2-D"):
            torch.ops.speedtorch.gather(torch.empty(10), ids)
        with pytest.raises(RuntimeError, match="indices must be int64 or int32"):
            torch.ops.speedtorch.gather(table, ids.float())
        with pytest.raises(RuntimeError, match="src dtype"):
            torch.ops.speedtorch.scatter_rows_(table, ids, torch.empty(2, 2, 8, dtype=torch.float64))
        with pytest.raises(RuntimeError, match="table rows overlap"):
            torch.ops.speedtorch.scatter_rows_(torch.empty(1, 8).expand(10, 8), ids, torch.empty(2, 2, 8))
        with pytest.raises(RuntimeError, match=r"src must have shape indices.shape \+ \(dim,\)"):
            torch.ops.speedtorch.scatter_rows_(table, ids, torch.empty(4, 8))
        out = torch.ops.speedtorch.gather(table, ids, torch.device("meta"))
        assert out.shape == (2, 2, 8) and out.device.type == "meta" and out.dtype == table.dtype
        assert torch.ops.speedtorch.gather(table, ids).device.type == "cpu"


def test_row_optimizer_step():
    # The Meta kernel runs every check that needs no values, the step's among them (it used to accept step 0).
    weights, ids, grad = torch.empty(10, 8), torch.tensor([1, 2]), torch.empty(2, 8)
    state = torch.empty(10, 2 * 8 + 4)
    for step in (0, -3):
        with pytest.raises(RuntimeError, match=f"step must be >= 1, got {step}"):
            torch.ops.speedtorch.row_optimizer_step_(weights, state, ids, grad, "adam", {}, step, False)
        with FakeTensorMode():
            fake = [torch.empty(t.shape, dtype=t.dtype) for t in (weights, state, ids, grad)]
            with pytest.raises(RuntimeError, match=f"step must be >= 1, got {step}"):
                torch.ops.speedtorch.row_optimizer_step_(*fake, "adam", {}, step, False)
        meta = [torch.empty(t.shape, dtype=t.dtype, device="meta") for t in (weights, state, ids, grad)]
        with pytest.raises(RuntimeError, match=f"step must be >= 1, got {step}"):
            torch.ops.speedtorch.row_optimizer_step_(*meta, "adam", {}, step, False)
    with FakeTensorMode():
        fake = [torch.empty(t.shape, dtype=t.dtype) for t in (weights, state, ids, grad)]
        torch.ops.speedtorch.row_optimizer_step_(*fake, "adam", {}, 1, False)
        with pytest.raises(RuntimeError, match="grad must have shape"):
            torch.ops.speedtorch.row_optimizer_step_(*fake[:3], torch.empty(3, 8), "adam", {}, 1, False)


def test_gather_dequant():
    with FakeTensorMode():
        table, ids = torch.empty(20, 40, dtype=torch.uint8), torch.tensor([[1, 2], [3, 4]])
        with pytest.raises(ValueError, match="unknown row format 'int3'"):
            torch.ops.speedtorch.gather_dequant(table, ids, "int3", 32)
        with pytest.raises(RuntimeError, match="table rows must be contiguous"):
            torch.ops.speedtorch.gather_dequant(torch.empty(20, 80, dtype=torch.uint8)[:, ::2], ids,
                                                "int8_rowwise", 32)
        with pytest.raises(ValueError, match="pass the dim the table was written with"):
            torch.ops.speedtorch.gather_dequant(table, ids, "int8_rowwise", 64)
        out = torch.ops.speedtorch.gather_dequant(table, ids, "int8_rowwise", 32, torch.device("meta"))
        assert out.shape == (2, 2, 32) and out.device.type == "meta" and out.dtype == torch.bfloat16


def test_ngram_hash():
    with FakeTensorMode():
        tokens, multipliers = torch.empty(2, 6, dtype=torch.int64), torch.empty(2, 3, dtype=torch.int64)
        with pytest.raises(RuntimeError, match="bucket_sizes must be int64 of shape"):
            torch.ops.speedtorch.ngram_hash(tokens, multipliers, torch.empty(1, 2, dtype=torch.int64), 0)
        with pytest.raises(RuntimeError, match="multipliers must be a 2-D int64"):
            torch.ops.speedtorch.ngram_hash(tokens, multipliers.int(), torch.empty(2, 2, dtype=torch.int64), 0)
        with pytest.raises(ValueError, match="fewer than the longest n-gram"):
            torch.ops.speedtorch.ngram_hash(tokens[:, :2], multipliers, torch.empty(2, 2, dtype=torch.int64), 0)
        out = torch.ops.speedtorch.ngram_hash(tokens, multipliers, torch.empty(2, 2, dtype=torch.int64), 0)
        assert out.shape == (2, 6, 4) and out.dtype == torch.int64


@pytest.mark.parametrize("op", ["ngram_hash", "gather_dequant"])
def test_dynamic_shapes(op):
    """The C++ checks read sizes as symbols (opcheck's aot_dispatch_dynamic)."""
    from speedtorch.ngram import hash_multipliers, prime_bucket_sizes
    from speedtorch.serving.quantized import quantize_rows

    if op == "ngram_hash":
        args = (torch.randint(0, 100, (2, 6)), hash_multipliers(100, 2, 3), prime_bucket_sizes(50, 2, 3), 0, None)
    else:
        args = (quantize_rows(torch.randn(20, 32), "int8_rowwise", pinned=False), torch.randint(0, 20, (3, 4)),
                "int8_rowwise", 32)
    torch.library.opcheck(getattr(torch.ops.speedtorch, op).default, args,
                          test_utils=("test_faketensor", "test_aot_dispatch_dynamic"))
