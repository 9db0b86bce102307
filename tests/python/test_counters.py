"""speedtorch.stats(): the library counters change by exactly what known calls move, on each path (CPU here; UVA,
staged and GPU-table under the gpu mark); reset, the off switch, and the hybrid table's hit counts."""

from __future__ import annotations

import pytest
import torch

import speedtorch
from speedtorch.nn.placement import HybridTable

COUNTERS = [
    "gather_calls", "scatter_calls",
    "cpu_gather_rows", "cpu_gather_bytes", "cpu_scatter_rows", "cpu_scatter_bytes",
    "uva_gather_rows", "uva_gather_bytes", "uva_scatter_rows", "uva_scatter_bytes",
    "staged_gather_rows", "staged_gather_bytes", "staged_scatter_rows", "staged_scatter_bytes",
    "gpu_table_gather_rows", "gpu_table_gather_bytes", "gpu_table_scatter_rows", "gpu_table_scatter_bytes",
    "optimizer_steps", "optimizer_index_rows", "optimizer_rows_updated",
    "optimizer_cpu_rows", "optimizer_uva_rows", "optimizer_gpu_table_rows",
    "cache_hits", "cache_misses", "stream_ordered_gather_microseconds", "stream_ordered_scatter_microseconds",
]  # fmt: skip


@pytest.fixture(autouse=True)
def _fresh_counters():
    speedtorch.set_stats_enabled(True)
    speedtorch.reset_stats()
    yield
    speedtorch.set_stats_enabled(True)


def assert_counters(**expected: int) -> None:
    """Every counter is as given, or 0."""
    got = speedtorch.stats()
    assert {k: got[k] for k in COUNTERS} == {k: expected.get(k, 0) for k in COUNTERS}


def test_names_help_and_ratios():
    s = speedtorch.stats()
    assert set(s) == set(COUNTERS) | {"optimizer_distinct_rows_per_step", "cache_hit_rate"}
    assert all(isinstance(s[k], int) and s[k] == 0 for k in COUNTERS)
    assert s["cache_hit_rate"] == 0.0 and s["optimizer_distinct_rows_per_step"] == 0.0
    help_text = speedtorch.stats_help()
    assert set(help_text) == set(COUNTERS) and all(len(h) > 10 for h in help_text.values())


def test_cpu_gather_and_scatter():
    table = torch.randn(50, 8, dtype=torch.float16)  # 16-byte rows
    speedtorch.gather(table, torch.tensor([[1, 2, 2], [3, 4, 49]]))
    speedtorch.gather(table, torch.empty(0, dtype=torch.long))  # moves nothing: not counted
    speedtorch.scatter_(table, torch.tensor([7, 7], dtype=torch.int32), torch.randn(2, 8, dtype=torch.float16))
    assert_counters(gather_calls=1, cpu_gather_rows=6, cpu_gather_bytes=96,
                    scatter_calls=1, cpu_scatter_rows=2, cpu_scatter_bytes=32)  # fmt: skip


def test_failed_call_counts_nothing():
    with pytest.raises(IndexError):
        speedtorch.gather(torch.randn(5, 2), torch.tensor([0, 5]))
    cached = speedtorch.PinnedEmbedding(5, 2)
    cached.enable_cache(4, "cpu")
    with pytest.raises(IndexError):
        cached.gather(torch.tensor([0, 5]), None)
    assert_counters()


def test_cpu_optimizer_step_counts_distinct_rows():
    emb = speedtorch.PinnedEmbedding(30, 4)
    emb.set_optimizer("adagrad", {"lr": 0.1}, True)
    emb.apply_gradients(torch.tensor([3, 3, 9, 3, 12]), torch.randn(5, 4))
    emb.apply_gradients(torch.tensor([[1, 1], [1, 1]]), torch.randn(2, 2, 4))
    s = speedtorch.stats()
    assert_counters(optimizer_steps=2, optimizer_index_rows=9, optimizer_rows_updated=4, optimizer_cpu_rows=4)
    assert s["optimizer_distinct_rows_per_step"] == 2.0


def test_reset_and_off_switch():
    table = torch.randn(10, 4)
    speedtorch.gather(table, torch.tensor([1, 2]))
    speedtorch.reset_stats()
    assert_counters()
    speedtorch.set_stats_enabled(False)
    assert not speedtorch.counters.stats_enabled()
    speedtorch.gather(table, torch.tensor([1, 2]))
    speedtorch.counters.record_cache_lookups(5, 5)
    assert_counters()
    speedtorch.set_stats_enabled(True)
    speedtorch.gather(table, torch.tensor([1, 2]))
    assert_counters(gather_calls=1, cpu_gather_rows=2, cpu_gather_bytes=32)


def test_record_cache_lookups_checks_its_arguments():
    with pytest.raises(RuntimeError, match="hits and misses must be >= 0"):
        speedtorch.counters.record_cache_lookups(-1, 2)


def test_hybrid_table_reports_hits_and_misses():
    host = speedtorch.PinnedEmbedding(20, 4)
    host.set_optimizer("sgd", {"lr": 0.1}, True)
    hybrid = HybridTable(host, "cpu", 3, hot_rows=torch.tensor([2, 5, 7]))
    speedtorch.reset_stats()  # placing the hot rows gathered them
    rows = hybrid.gather(torch.tensor([2, 3, 5, 5, 19]))
    torch.testing.assert_close(rows, host.table()[[2, 3, 5, 5, 19]])
    s = speedtorch.stats()
    assert (s["cache_hits"], s["cache_misses"]) == (3, 2)
    assert s["cache_hit_rate"] == pytest.approx(0.6)
    # The hot rows come from the device copy, the others from the host table: 5 rows moved in 2 calls.
    assert (s["gather_calls"], s["cpu_gather_rows"]) == (2, 5)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_row_cache_counts_hits_misses_and_each_path(device):
    """The C++ row cache counts its lookups where it decides them (on a GPU: in its kernel, folded in when the
    counters are read)."""
    table = speedtorch.PinnedEmbedding(50, 4)
    table.set_optimizer("sgd", {"lr": 0.1}, True)
    table.enable_cache(16, device)
    speedtorch.reset_stats()
    on = torch.device(device)
    table.gather(torch.tensor([1, 2, 3], device=on), None)  # 3 misses: they become cached
    table.gather(torch.tensor([1, 2, 40, 2], device=on), None)  # 3 hits (2 twice), 1 miss
    hot, cold = ("gpu_table_gather_rows", "uva_gather_rows") if device == "cuda" else ("cpu_gather_rows", None)
    s = speedtorch.stats()
    assert (s["cache_hits"], s["cache_misses"], s["gather_calls"]) == (3, 4, 2)
    assert s["cache_hit_rate"] == pytest.approx(3 / 7)
    if cold is None:
        assert (s[hot], s[hot.replace("rows", "bytes")]) == (7, 7 * 16)
    else:
        assert (s[hot], s[cold], s[cold.replace("rows", "bytes")]) == (3, 4, 4 * 16)
    assert speedtorch.stats()["cache_hits"] == 3  # folded once, not again at the next read
    speedtorch.reset_stats()
    table.apply_gradients(torch.tensor([1, 2, 2], device=on), torch.ones(3, 4, device=on))
    s = speedtorch.stats()
    route = "optimizer_gpu_table_rows" if device == "cuda" else "optimizer_cpu_rows"
    assert (s["optimizer_steps"], s["optimizer_index_rows"], s["optimizer_rows_updated"], s[route]) == (1, 3, 2, 2)
    assert (s["cache_hits"], s["cache_misses"]) == (0, 0)  # a step's lookups are not hits
    table.gather(torch.tensor([7], device=on), None)
    del table  # counts a dropped cache still held are folded in, not lost
    assert speedtorch.stats()["cache_misses"] == 1


# --- GPU paths ---------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("fraction, uva", [(1.0, 10), (0.0, 0), (0.3, 3)])
def test_pinned_transfers_split_between_uva_and_staged(transfer_settings, fraction, uva):
    # As test_row_ops_gpu.force_split: even a small transfer takes the requested split (for this test only).
    transfer_settings(uva_fraction=fraction, uva_reach_bytes=0, small_transfer_bytes=0, staging_chunk_bytes=4096)
    table = speedtorch.pinned_empty(100, 16)  # 64-byte rows
    idx = torch.arange(10) * 7
    speedtorch.gather(table, idx, device="cuda")
    speedtorch.scatter_(table, idx.cuda(), torch.randn(10, 16, device="cuda"))
    torch.cuda.synchronize()
    staged = 10 - uva
    assert_counters(gather_calls=1, scatter_calls=1,
                    uva_gather_rows=uva, uva_gather_bytes=64 * uva, staged_gather_rows=staged,
                    staged_gather_bytes=64 * staged, uva_scatter_rows=uva, uva_scatter_bytes=64 * uva,
                    staged_scatter_rows=staged, staged_scatter_bytes=64 * staged)  # fmt: skip


@pytest.mark.gpu
def test_gpu_table_path():
    table = torch.randn(40, 4, device="cuda")
    speedtorch.gather(table, torch.tensor([1, 2, 3], device="cuda"))
    speedtorch.scatter_(table, torch.tensor([5, 5], device="cuda"), torch.randn(2, 4, device="cuda"))
    assert_counters(gather_calls=1, gpu_table_gather_rows=3, gpu_table_gather_bytes=48,
                    scatter_calls=1, gpu_table_scatter_rows=2, gpu_table_scatter_bytes=32)  # fmt: skip


@pytest.mark.gpu
def test_gpu_optimizer_routes():
    pinned = speedtorch.PinnedEmbedding(50, 8)
    pinned.set_optimizer("adam", {"lr": 0.01}, True)
    pinned.apply_gradients(torch.tensor([1, 4, 4], device="cuda"), torch.randn(3, 8, device="cuda"))
    weights = torch.randn(50, 8, device="cuda")
    state = torch.zeros(50, pinned.state().shape[1], device="cuda")
    torch.ops.speedtorch.row_optimizer_step_(weights, state, torch.tensor([0, 0, 0, 2], device="cuda"),
                                             torch.randn(4, 8, device="cuda"), "adam", {"lr": 0.01}, 1)  # fmt: skip
    torch.cuda.synchronize()
    # Automatic split: every distinct row of a pinned table goes over UVA.
    assert_counters(optimizer_steps=2, optimizer_index_rows=7, optimizer_rows_updated=4,
                    optimizer_uva_rows=2, optimizer_gpu_table_rows=2)  # fmt: skip


@pytest.mark.gpu
def test_hybrid_table_on_a_gpu_counts_hits_and_each_path():
    host = speedtorch.PinnedEmbedding(20, 4)
    host.set_optimizer("sgd", {"lr": 0.1}, True)
    hybrid = HybridTable(host, "cuda", 2, hot_rows=torch.tensor([3, 4]))
    speedtorch.reset_stats()
    hybrid.gather(torch.tensor([3, 4, 4, 10], device="cuda"))
    torch.cuda.synchronize()
    s = speedtorch.stats()
    assert (s["cache_hits"], s["cache_misses"]) == (3, 1)
    assert s["gpu_table_gather_rows"] == 3  # the hot rows, from the device copy
    assert s["uva_gather_rows"] + s["staged_gather_rows"] == 1  # the cold one, from the pinned host table
