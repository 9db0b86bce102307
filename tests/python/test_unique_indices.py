"""speedtorch.ops.unique_indices (ops/unique_indices_op.cpp): torch.unique(sorted=True, return_inverse=True) for row
ids, the step every HostEmbedding forward starts with: the same values for every shape, dtype and value (its CPU
kernel hashes the ids and sorts only the distinct ones), the checks, and its fake kernel's dynamic size."""

from __future__ import annotations

import pytest
import torch

import speedtorch
from speedtorch.ops import unique_indices

INDEX_DTYPES = [torch.int64, torch.int32]


def assert_like_torch_unique(ids: torch.Tensor) -> None:
    unique, inverse = unique_indices(ids)
    expected_unique, expected_inverse = torch.unique(ids, sorted=True, return_inverse=True)
    assert unique.dtype == expected_unique.dtype and inverse.dtype == expected_inverse.dtype == torch.int64
    assert unique.device == ids.device and inverse.device == ids.device
    assert torch.equal(unique, expected_unique)
    assert inverse.shape == expected_inverse.shape and torch.equal(inverse, expected_inverse)


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("shape", [(0,), (1,), (37,), (5, 7), (2, 3, 4), ()])
def test_matches_torch_unique(index_dtype, shape):
    assert_like_torch_unique(torch.randint(0, 20, shape, dtype=index_dtype))


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
def test_any_values(index_dtype):
    """Negative and extreme values too, dense or spread (a bitmap over the span, or a hash table whose empty slot is
    not a value): HostEmbedding names a bad id after this step."""
    info = torch.iinfo(index_dtype)
    assert_like_torch_unique(torch.tensor([-1, 4, -1, info.min, 0, info.max, -7, 4], dtype=index_dtype))
    assert_like_torch_unique(torch.randint(info.min, info.max, (5_000,), dtype=index_dtype))  # nearly all distinct
    assert_like_torch_unique(torch.randint(-100, 100, (1_000,), dtype=index_dtype))  # dense: the bitmap


def test_a_demo_batch_and_a_strided_one():
    from speedtorch.models.recommender import zipf_batches

    users = zipf_batches(200_000, 4_096, 1)[0][0]
    assert_like_torch_unique(users)
    assert_like_torch_unique(users.reshape(64, 64).t())  # not contiguous


def test_bad_dtype():
    with pytest.raises(RuntimeError, match="speedtorch.unique_indices: indices must be int64 or int32, got Float"):
        unique_indices(torch.tensor([1.0]))


@pytest.mark.skipif(torch.__version__ < (2, 6), reason="the Python fake kernels need torch >= 2.6")
def test_fake_kernel():
    """Under FakeTensorMode: the operator's checks, a size for the distinct values that depends on the data, and the
    inverse in the ids' shape."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    with FakeTensorMode(shape_env=ShapeEnv()):
        ids = torch.empty(3, 5, dtype=torch.int32)
        unique, inverse = unique_indices(ids)
        assert unique.dtype == torch.int32 and unique.dim() == 1 and isinstance(unique.shape[0], torch.SymInt)
        assert inverse.shape == (3, 5) and inverse.dtype == torch.int64
        with pytest.raises(RuntimeError, match="indices must be int64 or int32, got Float"):
            unique_indices(torch.empty(4))


def test_opcheck():
    for ids in (torch.randint(0, 9, (40,)), torch.randint(0, 9, (3, 4), dtype=torch.int32)):
        torch.library.opcheck(torch.ops.speedtorch.unique_indices.default, (ids,))


def test_host_embedding_forward_uses_it():
    """HostEmbedding's rows for ids with duplicates, in any shape: those of the table."""
    module = speedtorch.nn.HostEmbedding(50, 6, device="cpu", optimizer="sgd", seed=3)
    ids = torch.tensor([[7, 7, 49], [0, 7, 3]])
    assert torch.equal(module(ids), module.table.table()[ids])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_gpu_ids_match_torch_unique():
    assert_like_torch_unique(torch.randint(0, 1_000, (5_000,), device="cuda"))
    assert_like_torch_unique(torch.randint(0, 10, (3, 4), dtype=torch.int32, device="cuda"))
