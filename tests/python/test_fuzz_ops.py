"""Property tests (Hypothesis) over the operators and PinnedEmbedding methods: random shapes, dtypes, index values
(negative, huge, empty, duplicated, non-contiguous, wrong dtype). Each call either matches the plain-PyTorch
reference or raises a clear error (IndexError / RuntimeError with the operator's name); nothing crashes, and a
call that raises leaves the table unchanged."""

from __future__ import annotations

import pytest
import torch
from helpers import last_wins_reference

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import speedtorch  # noqa: E402

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TABLE_DTYPES = st.sampled_from([torch.float32, torch.float16, torch.bfloat16])
INDEX_DTYPES = st.sampled_from([torch.int64, torch.int32, torch.int16, torch.float32, torch.uint8])


@st.composite
def cases(draw):
    rows = draw(st.integers(0, 40))
    dim = draw(st.integers(1, 9))
    shape = tuple(draw(st.lists(st.integers(0, 5), min_size=0, max_size=3)))
    values = draw(st.lists(st.one_of(st.integers(-3, rows + 2), st.sampled_from([2**31 - 1, -(2**31), 2**40])),
                           min_size=1, max_size=1))
    index_dtype = draw(INDEX_DTYPES)
    numel = 1
    for s in shape:
        numel *= s
    seed = draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    flat = torch.randint(-2, rows + 3, (numel,), generator=gen) if rows else torch.zeros(numel, dtype=torch.long)
    if numel and draw(st.booleans()):
        flat[draw(st.integers(0, numel - 1))] = values[0]
    transpose = len(shape) >= 2 and draw(st.booleans())
    return rows, dim, draw(TABLE_DTYPES), shape, flat, index_dtype, transpose, gen


def make_indices(flat, shape, index_dtype, transpose):
    idx = flat.reshape(shape)
    if transpose:
        idx = idx.transpose(0, 1).contiguous().transpose(0, 1)  # same values, non-contiguous layout
    try:
        return idx.to(index_dtype)
    except RuntimeError:
        return None


def valid(flat, rows):
    return bool(((flat >= 0) & (flat < rows)).all()) if flat.numel() else True


@SETTINGS
@given(cases())
def test_gather_matches_or_raises(case):
    rows, dim, dtype, shape, flat, index_dtype, transpose, gen = case
    table = torch.randn(rows, dim, generator=gen).to(dtype)
    idx = make_indices(flat, shape, index_dtype, transpose)
    if idx is None:
        return
    if index_dtype not in (torch.int64, torch.int32):
        with pytest.raises(RuntimeError, match="speedtorch.gather: indices must be int64 or int32"):
            speedtorch.gather(table, idx)
        return
    expected_ok = valid(idx.long().reshape(-1), rows)
    if not expected_ok:
        with pytest.raises(IndexError, match="speedtorch.gather: indices holds"):
            speedtorch.gather(table, idx)
        return
    out = speedtorch.gather(table, idx)
    assert out.shape == (*idx.shape, dim)
    torch.testing.assert_close(out, table[idx.long()], rtol=0, atol=0)


@SETTINGS
@given(cases())
def test_scatter_matches_or_raises_and_touches_nothing(case):
    rows, dim, dtype, shape, flat, index_dtype, transpose, gen = case
    table = torch.randn(rows, dim, generator=gen).to(dtype)
    before = table.clone()
    idx = make_indices(flat, shape, index_dtype, transpose)
    if idx is None:
        return
    src = torch.randn(*idx.shape, dim, generator=gen).to(dtype)
    if index_dtype not in (torch.int64, torch.int32) or not valid(idx.long().reshape(-1), rows):
        with pytest.raises((IndexError, RuntimeError), match="speedtorch.scatter_"):
            speedtorch.scatter_(table, idx, src)
        assert torch.equal(table, before)
        return
    expected = last_wins_reference(before, idx.long(), src)
    speedtorch.scatter_(table, idx, src)
    torch.testing.assert_close(table, expected, rtol=0, atol=0)


@SETTINGS
@given(st.integers(1, 30), st.integers(1, 6), st.sampled_from(["sgd", "adam", "adagrad", "rmsprop", "rprop"]),
       st.lists(st.integers(-2, 33), min_size=0, max_size=20), st.integers(0, 2**31 - 1))
def test_pinned_embedding_optimizer_matches_or_raises(rows, dim, kind, ids, seed):
    gen = torch.Generator().manual_seed(seed)
    emb = speedtorch.PinnedEmbedding(rows, dim)
    emb.normal_(0.0, 1.0, seed)
    emb.set_optimizer(kind, {"lr": 0.1}, bool(seed % 2))
    before = emb.table().clone()
    idx = torch.tensor(ids, dtype=torch.long)
    grad = torch.randn(len(ids), dim, generator=gen)
    if not valid(idx, rows):
        with pytest.raises(IndexError, match="indices holds"):
            emb.apply_gradients(idx, grad)
        assert torch.equal(emb.table(), before) and emb.step_count() == 0
        return
    emb.apply_gradients(idx, grad)
    moved = (emb.table() != before).any(1)
    touched = torch.zeros(rows, dtype=torch.bool)
    touched[idx] = True
    assert not bool((moved & ~touched).any())  # only touched rows can move
    assert emb.step_count() == 1


@SETTINGS
@given(st.integers(-5, 5), st.integers(-5, 5))
def test_pinned_embedding_construction(rows, dim):
    if rows < 0 or dim < 1:
        with pytest.raises(RuntimeError, match="PinnedEmbedding: (num_rows must be >= 0|dim must be > 0)"):
            speedtorch.PinnedEmbedding(rows, dim)
        return
    emb = speedtorch.PinnedEmbedding(rows, dim)
    assert emb.table().shape == (rows, dim)


def test_table_bigger_than_host_ram_fails_cleanly():
    with pytest.raises(RuntimeError, match="could not (reserve|page-lock)"):
        speedtorch.PinnedEmbedding(2**40, 1 << 12)  # 16 PiB
    small = speedtorch.PinnedEmbedding(10, 4)  # the process is still usable
    assert small.nbytes() == 160
