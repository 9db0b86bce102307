"""speedtorch.gather / scatter_ on CPU tensors: results against plain-PyTorch references, duplicate semantics,
every dtype and index type, and the errors bad input gets. GPU routes are in test_row_ops_gpu.py."""

from __future__ import annotations

import pytest
import torch
from helpers import last_wins_reference, random_table, rows_at

import speedtorch

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
INDEX_DTYPES = [torch.int64, torch.int32]
INDEX_SHAPES = [(0,), (1,), (37,), (5, 7), (2, 3, 4)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("shape", INDEX_SHAPES)
def test_gather_matches_indexing(dtype, index_dtype, shape):
    table = random_table(50, 12, dtype)
    indices = torch.randint(0, 50, shape, dtype=index_dtype)
    out = speedtorch.gather(table, indices)
    assert out.shape == (*shape, 12) and out.dtype == dtype and out.device.type == "cpu"
    torch.testing.assert_close(out, table[indices.long()], rtol=0, atol=0)


@pytest.mark.parametrize("threads", [1, 2])
def test_gather_large_batch_parallel(threads):
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        table = random_table(10_000, 33)  # odd row size: 132 bytes
        indices = torch.randint(0, 10_000, (20_000,))
        torch.testing.assert_close(speedtorch.gather(table, indices), table[indices], rtol=0, atol=0)
    finally:
        torch.set_num_threads(previous)


def test_gather_table_with_row_stride():
    wide = random_table(40, 20)
    table = wide[:, 3:11]  # rows 8 wide, 20 apart
    indices = torch.randint(0, 40, (64,))
    torch.testing.assert_close(speedtorch.gather(table, indices), table[indices], rtol=0, atol=0)


def test_gather_pinned_table_on_cpu():
    table = random_table(64, 16, pinned=True)
    indices = torch.randint(0, 64, (100,))
    torch.testing.assert_close(speedtorch.gather(table, indices, "cpu"), table[indices], rtol=0, atol=0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
def test_scatter_unique(dtype, index_dtype):
    table = random_table(60, 9, dtype)
    indices = torch.randperm(60)[:25].to(index_dtype).reshape(5, 5)
    src = random_table(25, 9, dtype).reshape(5, 5, 9)
    expected = table.clone()
    expected[indices.long()] = src
    result = speedtorch.scatter_(table, indices, src)
    assert result.data_ptr() == table.data_ptr()
    torch.testing.assert_close(table, expected, rtol=0, atol=0)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("count", [7, 5000])
def test_scatter_duplicates_last_occurrence_wins(threads, count):
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        table = random_table(40, 16)
        indices = torch.randint(0, 40, (count,))  # many duplicates
        src = random_table(count, 16)
        expected = last_wins_reference(table, indices, src)
        speedtorch.scatter_(table, indices, src)
        torch.testing.assert_close(table, expected, rtol=0, atol=0)
    finally:
        torch.set_num_threads(previous)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("ids", ["increasing", "sorted with a repeat"])
def test_scatter_of_sorted_ids_past_a_mebibyte(threads, ids):
    # Strictly increasing ids (a step's write-back) are split by position; a repeat anywhere takes the row-owner way.
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        table = random_table(200_000, 32)
        indices = torch.randperm(200_000)[:20_000].sort().values  # 2.5 MB of rows
        if ids != "increasing":
            indices[-1] = indices[-2]
        src = random_table(indices.numel(), 32)
        expected = last_wins_reference(table, indices, src)
        speedtorch.scatter_(table, indices, src)
        torch.testing.assert_close(table, expected, rtol=0, atol=0)
    finally:
        torch.set_num_threads(previous)


def test_scatter_empty_indices_is_a_no_op():
    table = random_table(10, 4)
    before = table.clone()
    speedtorch.scatter_(table, torch.empty(0, dtype=torch.long), torch.empty(0, 4))
    assert torch.equal(table, before)


def test_gather_scatter_round_trip_pinned():
    table = random_table(100, 32, pinned=True)
    indices = torch.randperm(100)[:40]
    rows = speedtorch.gather(table, indices) * 2
    speedtorch.scatter_(table, indices, rows)
    torch.testing.assert_close(speedtorch.gather(table, indices), rows, rtol=0, atol=0)


# --- bad input: a clear error naming the argument, nothing touched --------------------------------------------------


@pytest.mark.parametrize("bad", [-1, 50, 2**40])
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
def test_out_of_range_indices_raise(bad, index_dtype):
    if index_dtype == torch.int32 and bad >= 2**31:
        pytest.skip("not representable")
    table = random_table(50, 4)
    before = table.clone()
    indices = torch.tensor([3, bad, 4], dtype=index_dtype)
    with pytest.raises(IndexError, match=rf"indices holds {bad} at flat position 1.*\[0, 50\)"):
        speedtorch.gather(table, indices)
    with pytest.raises(IndexError, match=rf"indices holds {bad}"):
        speedtorch.scatter_(table, indices, torch.randn(3, 4))
    assert torch.equal(table, before)


@pytest.mark.parametrize("threads", [1, 2])
def test_out_of_range_index_in_a_large_gather_names_the_first(threads):
    """A CPU gather checks each index as it copies its row, threads sharing the rows: the error still names the
    first bad position, also when a later one is met first."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        table = random_table(1_000, 32)
        indices = torch.randint(0, 1_000, (30_000,))  # 3.8 MB of rows: threads share them
        indices[29_000] = -5
        indices[12_345] = 1_000
        with pytest.raises(IndexError, match=r"indices holds 1000 at flat position 12345; every index"):
            speedtorch.gather(table, indices)
    finally:
        torch.set_num_threads(previous)


def test_large_cpu_gather_output():
    """A gather's output of 32 MiB or more is mapped in huge pages (memory/huge_page_output.h): the same bits as
    index_select, and an ordinary tensor (resized, written, freed)."""
    table = random_table(2_000, 128)
    indices = torch.randint(0, 2_000, (70_000,))  # 34 MiB
    out = speedtorch.gather(table, indices)
    assert out.is_contiguous() and out.shape == (70_000, 128)
    assert torch.equal(out.view(torch.int32), table.index_select(0, indices).view(torch.int32))
    out.resize_(80_000, 128)[70_000:] = 1.0
    assert torch.equal(out[:70_000], table[indices]) and bool((out[70_000:] == 1.0).all())


def test_gather_without_gradient_builds_no_graph():
    """Where nothing is differentiated (no_grad, inference mode, a table that needs no gradient) gather goes straight
    to its kernel: no autograd node; with a table that needs one, the node and its gradient are there."""
    table = random_table(20, 4).requires_grad_()
    indices = torch.tensor([[3, 3], [19, 0]])
    with torch.no_grad():
        out = speedtorch.gather(table, indices)
    assert out.grad_fn is None and not out.requires_grad and torch.equal(out, table.detach()[indices])
    with torch.inference_mode():
        assert speedtorch.gather(table, indices).grad_fn is None
    assert speedtorch.gather(table.detach(), indices).grad_fn is None
    out = speedtorch.gather(table, indices)
    assert out.requires_grad
    out.sum().backward()
    assert torch.equal(table.grad, torch.zeros(20, 4).index_add_(0, indices.reshape(-1), torch.ones(4, 4)))


@pytest.mark.parametrize(
    ("table", "indices", "message"),
    [
        (torch.randn(10), torch.tensor([1]), "table must be 2-D"),
        (torch.randn(3, 10, 4), torch.tensor([1]), "table must be 2-D"),
        (torch.randn(10, 4), torch.tensor([1.0]), "indices must be int64 or int32, got Float"),
        (torch.randn(10, 4), torch.tensor([1], dtype=torch.int16), "indices must be int64 or int32"),
        (torch.randn(4, 10).t(), torch.tensor([1]), r"table rows must be contiguous"),
    ],
)
def test_gather_bad_arguments(table, indices, message):
    with pytest.raises(RuntimeError, match=message):
        speedtorch.gather(table, indices)


def test_scatter_src_shape_and_dtype_checked():
    table = random_table(10, 4)
    indices = torch.tensor([[1, 2], [3, 4]])
    with pytest.raises(RuntimeError, match=r"src must have shape indices.shape \+ \(dim,\) = \[2, 2, 4\], got \[4, 4\]"):
        speedtorch.scatter_(table, indices, torch.randn(4, 4))
    with pytest.raises(RuntimeError, match="src dtype Half does not match table dtype Float"):
        speedtorch.scatter_(table, indices, torch.randn(2, 2, 4).half())


def test_scatter_rejects_overlapping_rows():
    table = torch.randn(1, 4).expand(5, 4)
    with pytest.raises(RuntimeError, match="table rows overlap"):
        speedtorch.scatter_(table, torch.tensor([0]), torch.randn(1, 4))


# --- src, indices or gradients that share the table's memory ----------------------------------------------------------
# torch's index_copy_ refuses them; speedtorch used to read rows it had already overwritten.


@pytest.mark.parametrize("op", ["scatter_", "scatter_rows_", "PinnedEmbedding.scatter_"])
@pytest.mark.parametrize(("rows", "src_rows"), [((1, 6), (0, 5)), ((0, 5), (1, 6)), ((2, 5), (2, 5))])
def test_scatter_refuses_src_that_overlaps_the_table(op, rows, src_rows):
    """The issue's case (rows 1-5 from rows 0-4: every row became row 0), the reverse, and src exactly the rows it
    writes (which torch refuses too)."""
    table = random_table(10, 3)
    if op == "PinnedEmbedding.scatter_":
        embedding = speedtorch.PinnedEmbedding(10, 3, torch.float32)
        embedding.copy_(table)
        table = embedding.table()
        call = embedding.scatter_
    else:
        call = lambda indices, src: getattr(torch.ops.speedtorch, op)(table, indices, src)  # noqa: E731
    before = table.clone()
    with pytest.raises(RuntimeError, match=r"src and the table share memory \(.*\); pass a copy: src.clone\(\)"):
        call(torch.arange(*rows), table[src_rows[0]:src_rows[1]])
    assert torch.equal(table, before)
    expected = before.clone().index_copy_(0, torch.arange(*rows), before[src_rows[0]:src_rows[1]])
    call(torch.arange(*rows), table[src_rows[0]:src_rows[1]].clone())
    assert torch.equal(table, expected)


def test_scatter_refuses_indices_that_overlap_the_table():
    table = torch.zeros(10, 4)
    ids = table.view(torch.int32)[9, :2]  # row 9's bytes read as two int32 ids (0 and 0)
    with pytest.raises(RuntimeError, match=r"indices and the table share memory .*pass a copy: indices.clone\(\)"):
        speedtorch.scatter_(table, ids, torch.ones(2, 4))


def test_scatter_from_other_rows_of_one_storage_is_allowed():
    storage = random_table(10, 3)
    expected = storage.clone()
    expected[0:5].index_copy_(0, torch.tensor([4, 0, 2]), expected[5:8].clone())
    speedtorch.scatter_(storage[0:5], torch.tensor([4, 0, 2]), storage[5:8])  # disjoint bytes of one storage
    assert torch.equal(storage, expected)


def test_scatter_refuses_src_in_the_gaps_of_a_padded_table():
    """Each tensor stands for the bytes from its first element to its last (csrc/core/memory_overlap.h): src in the
    columns a padded table skips is refused too, though it shares no element."""
    wide = random_table(10, 8)
    with pytest.raises(RuntimeError, match="src and the table share memory"):
        speedtorch.scatter_(wide[:, :4], torch.tensor([0, 1]), wide[0:2, 4:8])


@pytest.mark.parametrize("sorted_unique", [True, False])
def test_optimizer_step_refuses_grad_that_overlaps_the_weights(sorted_unique):
    """With sorted_unique the gradient rows were read as they were being updated: rows 1-5 stepped with rows 0-4 as
    gradients came out in the order the rows were written."""
    weights = torch.arange(30.0).reshape(10, 3)
    state = torch.zeros(10, speedtorch.PinnedEmbedding.state_width("sgd", {}, 3))
    before = weights.clone()
    with pytest.raises(RuntimeError, match=r"grad and the weights share memory .*pass a copy: grad.clone\(\)"):
        torch.ops.speedtorch.row_optimizer_step_(weights, state, torch.arange(1, 6), weights[0:5], "sgd", {"lr": 1.0},
                                                 1, sorted_unique)
    assert torch.equal(weights, before)
    torch.ops.speedtorch.row_optimizer_step_(weights, state, torch.arange(1, 6), weights[0:5].clone(), "sgd",
                                             {"lr": 1.0}, 1, sorted_unique)
    expected = before.clone()
    expected[1:6] -= before[0:5]
    assert torch.equal(weights, expected)


def test_optimizer_step_refuses_grad_or_indices_that_overlap_the_state():
    weights = torch.zeros(10, 3)
    state = torch.zeros(10, speedtorch.PinnedEmbedding.state_width("adam", {}, 3))
    with pytest.raises(RuntimeError, match="grad and the optimizer state share memory"):
        torch.ops.speedtorch.row_optimizer_step_(weights, state, torch.arange(2), state[0:2, 4:7], "adam", {}, 1,
                                                 False)
    ids = state.view(torch.int32)[9, 0:2]
    with pytest.raises(RuntimeError, match="indices and the optimizer state share memory"):
        torch.ops.speedtorch.row_optimizer_step_(weights, state, ids, torch.ones(2, 3), "adam", {}, 1, False)


@pytest.mark.parametrize("cache", [False, True])
def test_pinned_embedding_step_refuses_grad_from_its_own_rows(cache):
    """The same answer with a row cache in front of the host table (it sums the gradients before it writes rows,
    but every placement refuses the same calls)."""
    embedding = speedtorch.PinnedEmbedding(10, 3, torch.float32)
    embedding.set_optimizer("sgd", {"lr": 1.0}, False)  # the state in a table of its own: rows are contiguous
    grad = rows_at(embedding.table(), 2)
    if cache:
        embedding.enable_cache(8, torch.device("cpu"))
        assert not embedding.host_rows_in_use()
    with pytest.raises(RuntimeError, match="PinnedEmbedding.apply_gradients: grad and the weights share memory"):
        embedding.apply_gradients(torch.arange(1, 3), grad, False)
    assert embedding.step_count() == 0


# --- dispatcher contract --------------------------------------------------------------------------------------------


def test_opcheck_gather():
    table = random_table(20, 8)
    for indices in (torch.randint(0, 20, (6,)), torch.randint(0, 20, (2, 3), dtype=torch.int32)):
        torch.library.opcheck(torch.ops.speedtorch.gather.default, (table, indices))


@pytest.mark.parametrize("op", ["scatter_", "scatter_rows_"])
def test_opcheck_scatter(op):
    table = random_table(20, 8)
    indices = torch.randperm(20)[:6]
    torch.library.opcheck(getattr(torch.ops.speedtorch, op).default, (table, indices, torch.randn(6, 8)))


@pytest.mark.parametrize("sorted_unique", [False, True])
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
def test_opcheck_row_optimizer_step(sorted_unique, index_dtype):
    """Schema, fake / Meta kernel, autograd registration and dispatch, with static and dynamic shapes (the Meta
    kernel called numel() on symbolic shapes, which fails the dynamic-shape check)."""
    n, d = 20, 8
    weights = random_table(n, d)
    state = torch.zeros(n, speedtorch.PinnedEmbedding.state_width("adam", {}, d))
    indices = (torch.randperm(n)[:6].sort().values if sorted_unique else torch.randint(0, n, (2, 3))).to(index_dtype)
    grad = torch.randn(*indices.shape, d)
    torch.library.opcheck(torch.ops.speedtorch.row_optimizer_step_.default,
                          (weights, state, indices, grad, "adam", {"lr": 0.01}, 1, sorted_unique))


def test_gradcheck_gather():
    table = torch.randn(12, 5, dtype=torch.float64, requires_grad=True)
    indices = torch.tensor([[0, 3, 3], [11, 0, 7]])  # duplicates: their gradients add up
    assert torch.autograd.gradcheck(lambda t: speedtorch.gather(t, indices), (table,))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("index_dtype", "shape"), [(torch.int64, (4, 7)), (torch.int32, (40_000,))])
def test_gather_backward_on_cpu_gives_the_bits_of_index_add(threads, index_dtype, shape):
    """A float32 CPU table's gradient is summed by speedtorch's own CPU kernel (HostEmbedding's CPU forward relies
    on it): the bits of index_add_ into zeros, also when the batch is large enough for threads to share it."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        table = random_table(300, 16).requires_grad_()
        indices = torch.randint(0, 290, shape, dtype=index_dtype)  # duplicates, and rows no index names
        weights = torch.randn(*shape, 16)
        (speedtorch.gather(table, indices) * weights).sum().backward()
    finally:
        torch.set_num_threads(previous)
    expected = torch.zeros(300, 16).index_add_(0, indices.reshape(-1).long(), weights.reshape(-1, 16))
    assert torch.equal(table.grad, expected)



def test_rows_of_zero_width():
    """gather and its backward on a table of 0 columns (the backward reshaped the gradient with -1: an error)."""
    table = torch.empty(6, 0, requires_grad=True)
    indices = torch.tensor([[0, 5], [5, 2]])
    out = speedtorch.gather(table, indices)
    assert out.shape == (2, 2, 0)
    out.sum().backward()
    assert table.grad.shape == (6, 0)
    speedtorch.scatter_(table.detach(), indices, torch.empty(2, 2, 0))


def test_one_index_rule_for_the_operators_and_the_python_layers():
    """speedtorch.ops.check_indices is the operators' rule (C++), and the Python layers that check ids themselves
    (the placements' hot rows and splits, the distributed table) call it: the same words, value and position
    everywhere (they each had their own wording, and set_hot_rows named a position in the sorted distinct ids)."""
    from speedtorch.nn import HostEmbedding
    from speedtorch.nn.placement import HybridTable

    ids = torch.tensor([3, 9, 1, 12, 0])
    rule = r"holds 12 at flat position 3; every index must be in \[0, 10\) for a table of 10 rows"
    with pytest.raises(IndexError, match="speedtorch.gather: indices " + rule):
        speedtorch.gather(random_table(10, 4), ids)
    for index_dtype in INDEX_DTYPES:
        with pytest.raises(IndexError, match="my_op: ids " + rule):
            speedtorch.ops.check_indices(ids.to(index_dtype), 10, "my_op", "ids")
    with pytest.raises(IndexError, match=r"my_op: ids holds 12 at flat position 3 \(ids\[1, 1\]\); every index"):
        speedtorch.ops.check_indices(ids[:4].reshape(2, 2), 10, "my_op", "ids")  # the element, for shaped ids
    speedtorch.ops.check_indices(torch.tensor([[0, 9], [4, 4]]), 10)  # in range: nothing
    speedtorch.ops.check_indices(torch.empty(0, dtype=torch.int64), 0)
    with pytest.raises(RuntimeError, match="must be int64 or int32"):
        speedtorch.ops.check_indices(torch.tensor([1.0]), 10)

    host = speedtorch.PinnedEmbedding(10, 4, torch.float32)
    host.set_optimizer("sgd", {"lr": 0.1}, True)
    hybrid = HybridTable(host, "cpu", 4)
    with pytest.raises(IndexError, match="HybridTable: indices " + rule):
        hybrid.gather(ids)
    with pytest.raises(IndexError, match="HybridTable.set_hot_rows: hot row ids " + rule):
        hybrid.set_hot_rows(ids)
    cached = HostEmbedding(10, 4, device="cpu", placement="hybrid", cache_rows=8)
    with pytest.raises(IndexError, match="HostEmbedding.set_hot_rows: hot row ids " + rule):
        cached.set_hot_rows(ids)

    # HybridTable's row operations: the host table's rule refuses an id out of range (it goes to the host side of
    # the split, even beside hot rows 0 and 9, where ids below and above the range would clamp), before either side
    # is touched; the error names its place in the caller's indices.
    host = speedtorch.PinnedEmbedding(10, 4, torch.float32)
    host.set_optimizer("sgd", {"lr": 0.1}, True)
    host.normal_(0.0, 1.0, 3)
    hybrid = HybridTable(host, "cpu", 2, hot_rows=torch.tensor([0, 9]))
    rows, step = hybrid.table().clone(), hybrid.step_count()
    with pytest.raises(IndexError, match=r"^HybridTable: indices holds 12 at flat position 3 \(indices\[1, 1\]\); "
                                         r"every index must be in \[0, 10\) for a table of 10 rows"):
        hybrid.gather(torch.tensor([[9, 0], [3, 12]]))
    with pytest.raises(IndexError, match=r"^HybridTable: indices holds -1 at flat position 2; every index"):
        hybrid.apply_gradients(torch.tensor([9, 0, -1, 4]), torch.ones(4, 4))
    with pytest.raises(IndexError, match=r"^HybridTable: indices holds 10 at flat position 2 \(indices\[1, 0\]\);"):
        hybrid.scatter_(torch.tensor([[0, 9], [10, 1]]), torch.zeros(2, 2, 4))
    assert torch.equal(hybrid.table(), rows) and hybrid.step_count() == step  # neither side was touched
    torch.testing.assert_close(hybrid.gather(torch.tensor([9, 3, 0])), rows[[9, 3, 0]])

    # The first index the rule refuses, and its value, found by the rule alone (for callers that hand it on).
    from speedtorch.ops import _first_out_of_range

    assert _first_out_of_range(ids, 10) == (3, 12)
    assert _first_out_of_range(torch.tensor([[4, -2], [11, 0]], dtype=torch.int32), 10) == (1, -2)
    assert _first_out_of_range(torch.tensor([0, 9, 9]), 10) is None
    assert _first_out_of_range(torch.empty(0, dtype=torch.int64), 0) is None


def test_meta_tensors():
    table = torch.empty(100, 16, device="meta")
    out = torch.ops.speedtorch.gather(table, torch.empty(4, 5, dtype=torch.long, device="meta"))
    assert out.shape == (4, 5, 16) and out.device.type == "meta"
