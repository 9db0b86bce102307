"""The transfer engine's launch settings and measured split (csrc/transfer/split_calibration.h,
csrc/cuda/row_kernels.h): whatever shape the kernels run in and whatever share the calibration keeps, gather and
scatter_ move exactly the same rows. GPU only."""

from __future__ import annotations

import pytest
import torch

import speedtorch

pytestmark = pytest.mark.gpu

ROWS, DIM = 200_000, 64
# Small tables and batches would go all over UVA unsorted; these make every call take the full path.
FULL_PATH = dict(uva_reach_bytes=0, small_transfer_bytes=0)


def reference_scatter(table: torch.Tensor, ids: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """table with src written at ids, the last occurrence winning, on the host."""
    expected = table.clone()
    for position, row in enumerate(ids.tolist()):
        expected[row] = src[position]
    return expected


@pytest.fixture
def table():
    t = speedtorch.pinned_empty(ROWS, DIM)
    t.uniform_(-1, 1)
    return t


@pytest.mark.parametrize("settings", [
    dict(uva_fraction=1.0, uva_rows_in_flight=1),
    dict(uva_fraction=1.0, uva_rows_in_flight=2, uva_blocks_per_sm=4),
    dict(uva_fraction=1.0, uva_rows_in_flight=8, uva_sort_bucket_bytes=1),
    dict(uva_fraction=1.0, max_sms=3),
    dict(uva_fraction=0.6, uva_rows_in_flight=8),
    dict(stream_ordered_staging=1),
], ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()))
def test_every_launch_shape_moves_the_same_rows(table, transfer_settings, settings):
    transfer_settings(**FULL_PATH, **settings)
    ids = torch.randint(0, ROWS, (30_000,), device="cuda")  # duplicates included
    got = speedtorch.gather(table, ids)
    assert torch.equal(got.cpu(), table[ids.cpu()])
    src = torch.randn(ids.numel(), DIM, device="cuda")
    expected = reference_scatter(table, ids.cpu(), src.cpu())
    speedtorch.scatter_(table, ids, src)
    torch.cuda.synchronize()
    assert torch.equal(table, expected)


def test_small_batches_and_narrow_rows_in_every_shape(transfer_settings):
    for rows_in_flight in (1, 2, 4, 8):
        transfer_settings(uva_rows_in_flight=rows_in_flight)
        for dtype, dim in ((torch.bfloat16, 128), (torch.float16, 3), (torch.float32, 5), (torch.float32, 1)):
            t = speedtorch.pinned_empty(5000, dim, dtype=dtype)
            t.copy_(torch.randn(5000, dim).to(dtype))
            for n in (1, 33, 1024):
                ids = torch.randint(0, 5000, (n,), device="cuda")
                assert torch.equal(speedtorch.gather(t, ids).cpu(), t[ids.cpu()]), (rows_in_flight, dtype, dim, n)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("on", ["cuda", "cpu"])
def test_stream_ordered_staging_moves_the_same_rows(transfer_settings, dtype, index_dtype, on):
    transfer_settings(stream_ordered_staging=1)
    t = speedtorch.pinned_empty(50_000, 24, dtype=dtype)
    t.copy_(torch.randn(50_000, 24).to(dtype))
    strided = speedtorch.pinned_empty(50_000, 40, dtype=dtype)[:, :24]  # rows with a gap after them (state beside)
    strided.copy_(t)
    ids = torch.randint(0, 50_000, (20_000,), dtype=index_dtype).to(on)
    for table in (t, strided):
        assert torch.equal(speedtorch.gather(table, ids, "cuda").cpu(), table[ids.long().cpu()])
        src = torch.randn(ids.numel(), 24, device="cuda").to(dtype)
        expected = reference_scatter(table, ids.long().cpu(), src.cpu())
        speedtorch.scatter_(table, ids, src)
        torch.cuda.synchronize()
        assert torch.equal(table, expected)


def test_stream_ordered_staging_keeps_stream_order_and_never_holds_the_caller(table, transfer_settings):
    transfer_settings(stream_ordered_staging=1)
    ids = torch.randperm(ROWS, device="cuda")[:20_000]
    src = torch.randn(ids.numel(), DIM, device="cuda")
    # The first staged calls set up the pinned rings and copy threads (slow under a loaded host, as under pytest -n 6,
    # where this once outlasted the second of sleep): done before, so the check is of the calls themselves.
    speedtorch.scatter_(table, ids, speedtorch.gather(table, ids))
    torch.cuda.synchronize()
    # About five seconds of GPU time queued before the transfers: the two calls below return long before it ends
    # unless they wait for the GPU (with one second, a host loaded by pytest -n 6 once outlasted it, 2026-11-29).
    torch.cuda._sleep(10_000_000_000)
    speedtorch.scatter_(table, ids, src)
    got = speedtorch.gather(table, ids)  # after the scatter in stream order: reads what it wrote
    after = torch.cuda.Event()
    after.record()
    assert not after.query()  # both calls returned with the GPU still asleep: the host did not wait
    # A CPU read of the table waits for the copies that write it (the host access tracker), without a synchronize.
    assert torch.equal(speedtorch.gather(table, ids.cpu()), src.cpu())
    assert torch.equal(got.cpu(), src.cpu())


def test_stream_ordered_staging_flags_a_bad_index_in_deferred_mode(table, transfer_settings):
    transfer_settings(stream_ordered_staging=1)
    before = table.clone()
    ids = torch.tensor([3, 7, ROWS + 5, 9], device="cuda")
    with speedtorch.deferred_index_checks():
        speedtorch.scatter_(table, ids, torch.ones(4, DIM, device="cuda"))
    with pytest.raises(IndexError, match=rf"holds {ROWS + 5} at flat position 2; every index must be in \[0, {ROWS}\)"):
        speedtorch.check_index_errors()
    assert torch.equal(table, before)  # all or nothing: no row written
    speedtorch.check_index_errors()  # reported once
    with speedtorch.deferred_index_checks():
        speedtorch.gather(table, ids)
    with pytest.raises(IndexError, match="at flat position 2"):
        speedtorch.check_index_errors()
    with pytest.raises(IndexError, match="at flat position 2"):  # checked at the call outside deferred mode
        speedtorch.gather(table, ids)


def test_sorted_ids_skip_the_sort_and_still_land_in_place(table, transfer_settings):
    transfer_settings(**FULL_PATH, uva_fraction=1.0)
    ids = torch.unique(torch.randint(0, ROWS, (40_000,), device="cuda"))  # sorted: the sort is skipped
    assert torch.equal(speedtorch.gather(table, ids).cpu(), table[ids.cpu()])
    reversed_ids = ids.flip(0)  # descending: sorted by the engine, positions kept
    assert torch.equal(speedtorch.gather(table, reversed_ids).cpu(), table[reversed_ids.cpu()])


def test_the_split_is_measured_once_per_kind_and_kept(table, transfer_settings):
    speedtorch.clear_transfer_calibrations()
    try:
        transfer_settings(**FULL_PATH, uva_fraction=-1.0, calibrate_split=1)
        ids = torch.randint(0, ROWS, (30_000,), device="cuda")
        got = speedtorch.gather(table, ids)
        assert torch.equal(got.cpu(), table[ids.cpu()])
        calibrations = speedtorch.transfer_calibrations()
        assert len(calibrations) == 1
        entry = calibrations[0]
        assert entry["key"]["direction"] == "gather" and entry["key"]["row_bytes"] == DIM * 4
        assert entry["uva_share"] in entry["tried"] and len(entry["tried"]) > 1
        assert all(ms > 0 for ms in entry["tried"].values())
        speedtorch.gather(table, ids)  # the same kind: measured already
        assert len(speedtorch.transfer_calibrations()) == 1
        # scatter_ measures by writing the same rows again: the table ends as one write leaves it.
        src = torch.randn(ids.numel(), DIM, device="cuda")
        expected = reference_scatter(table, ids.cpu(), src.cpu())
        speedtorch.scatter_(table, ids, src)
        torch.cuda.synchronize()
        assert torch.equal(table, expected)
        assert sorted(c["key"]["direction"] for c in speedtorch.transfer_calibrations()) == ["gather", "scatter"]
        # Deferred checks never wait to measure: a new kind (another batch size) takes the model's split.
        with speedtorch.deferred_index_checks():
            other = torch.randint(0, ROWS, (10_000,), device="cuda")
            assert torch.equal(speedtorch.gather(table, other).cpu(), table[other.cpu()])
        speedtorch.check_index_errors()
        assert len(speedtorch.transfer_calibrations()) == 2
    finally:
        speedtorch.clear_transfer_calibrations()
    assert speedtorch.transfer_calibrations() == []


def test_calls_after_the_measurement_are_timed_for_the_guard(table, transfer_settings):
    """Calls that stage a share from a measured split are timed (read at the next call, never waited for) and the
    guard's window fills, or the guard has moved the share toward UVA alone; the rows stay exact either way."""
    speedtorch.clear_transfer_calibrations()
    try:
        transfer_settings(**FULL_PATH, uva_fraction=-1.0, calibrate_split=1)
        ids = torch.randint(0, ROWS, (60_000,), device="cuda")
        expected = table[ids.cpu()]
        assert torch.equal(speedtorch.gather(table, ids).cpu(), expected)  # measures
        (entry,) = speedtorch.transfer_calibrations()
        assert entry["uva_share"] == entry["calibrated_share"] and entry["recent_ms"] == []
        for _ in range(8):
            assert torch.equal(speedtorch.gather(table, ids).cpu(), expected)
        (entry,) = speedtorch.transfer_calibrations()
        assert entry["uva_share"] >= entry["calibrated_share"]  # the guard only gives rows back to UVA
        if entry["calibrated_share"] < 1.0:
            assert entry["recent_ms"] or entry["uva_share"] > entry["calibrated_share"]
            assert all(ms > 0 for ms in entry["recent_ms"])
        else:
            assert entry["recent_ms"] == []  # UVA alone: nothing to guard
    finally:
        speedtorch.clear_transfer_calibrations()
