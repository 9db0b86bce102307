"""CUDA graph capture of the row ops: gather and scatter_ between a pinned table and a GPU are captured (every row
over UVA, no host work), replay with new index values, and flag bad indices through the deferred record; what
cannot be captured (CPU indices, the fused optimizer step) is refused with a clear error and leaves the capture
usable."""

from __future__ import annotations

import pytest
import torch
from helpers import last_wins_reference, random_table

import speedtorch

pytestmark = pytest.mark.gpu

ROWS, DIM, BATCH = 20000, 64, 3000


def settings_that_would_stage(transfer_settings) -> None:
    """Outside capture these split every transfer half over UVA, half through staging (csrc/transfer)."""
    transfer_settings(
        uva_fraction=0.5, uva_reach_bytes=0, small_transfer_bytes=0, staging_chunk_bytes=1 << 16
    )


def warm_up(fn) -> None:
    """Runs fn once on a side stream, as torch.cuda.graph's documentation asks before capturing."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()


@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_gather_is_captured_and_replays_with_new_indices(index_dtype, transfer_settings):
    settings_that_would_stage(transfer_settings)
    table = random_table(ROWS, DIM, pinned=True)
    indices = torch.randint(0, ROWS, (BATCH,), dtype=index_dtype, device="cuda")
    warm_up(lambda: speedtorch.gather(table, indices))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = speedtorch.gather(table, indices)
    for _ in range(3):
        fresh = torch.randint(0, ROWS, (BATCH,), dtype=index_dtype)
        indices.copy_(fresh)
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out.cpu(), table[fresh.long()], rtol=0, atol=0)


def test_scatter_is_captured_and_replays_with_new_indices_and_rows(transfer_settings):
    settings_that_would_stage(transfer_settings)
    table = random_table(ROWS, DIM, pinned=True)
    indices = torch.randint(0, ROWS, (BATCH,), device="cuda")
    src = torch.randn(BATCH, DIM, device="cuda")
    warm_up(lambda: speedtorch.scatter_(table, indices, src))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        speedtorch.scatter_(table, indices, src)
    for _ in range(2):
        fresh = torch.randint(0, ROWS // 10, (BATCH,))  # every row hit several times: the last occurrence wins
        fresh_src = torch.randn(BATCH, DIM)
        expected = last_wins_reference(table, fresh, fresh_src)
        indices.copy_(fresh)
        src.copy_(fresh_src)
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(table, expected, rtol=0, atol=0)
    # Host access after replays still works (the staged path and the CPU route read the table).
    check = torch.randint(0, ROWS, (500,))
    torch.testing.assert_close(speedtorch.gather(table, check, device="cuda").cpu(), table[check], rtol=0, atol=0)


def test_captured_ops_flag_bad_indices_for_check_index_errors(transfer_settings):
    settings_that_would_stage(transfer_settings)
    table = random_table(ROWS, DIM, pinned=True)
    indices = torch.randint(0, ROWS, (BATCH,), device="cuda")
    warm_up(lambda: speedtorch.gather(table, indices))
    speedtorch.check_index_errors()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        speedtorch.gather(table, indices)
    indices[7] = ROWS + 5
    graph.replay()
    with pytest.raises(IndexError, match=f"holds {ROWS + 5} at flat position 7"):
        speedtorch.check_index_errors()


def test_cpu_indices_are_refused_under_capture(transfer_settings):
    settings_that_would_stage(transfer_settings)
    table = random_table(ROWS, DIM, pinned=True)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="indices on the CPU cannot be captured into a CUDA graph"):
        with torch.cuda.graph(graph):
            speedtorch.gather(table, torch.randint(0, ROWS, (BATCH,)), device="cuda")


def test_optimizer_step_is_refused_under_capture_and_touches_nothing():
    weights = random_table(100, 8, pinned=True)
    state = speedtorch.pinned_empty(100, 4 + 2 * 8)
    before = weights.clone()
    indices = torch.randint(0, 100, (50,), device="cuda")
    grad = torch.randn(50, 8, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="an optimizer step cannot be captured into a CUDA graph"):
        with torch.cuda.graph(graph):
            torch.ops.speedtorch.row_optimizer_step_(weights, state, indices, grad, "adam", {"lr": 0.1}, 1)
    torch.cuda.synchronize()
    assert torch.equal(weights, before) and torch.count_nonzero(state) == 0
